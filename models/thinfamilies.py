"""Rows of thinly measured job families weighted up: a candidate of :func:`models.evaluate.evaluate` whose feature
model is fitted with them as copies, so that a family's first measurements move its predictions."""

from __future__ import annotations

from collections.abc import Sequence

from models.datasets import Sample

UPWEIGHTED = "Upweighted"
"""Candidate ``Upweighted[model:category]``: the feature model fitted with the rows of thinly measured families weighted
up (:func:`thin_family_weights`), so that a family's first measurements move its predictions instead of being
outvoted by the rest."""
UPWEIGHTED_BASE = ("ExtraTrees", "all")
THIN_SETS = 8
"""A family measured in at most this many job sets of the training rows is thin."""
THIN_WEIGHT = 8
"""The weight (copies) of a row that involves a thin family.  Measured on Gavel (docs/MODELS.md): 6-10 were
best at K = 2 and 4; the residual model of :mod:`models.newcomer` over the same feature model was worse there."""


def upweighted_name(model: str = UPWEIGHTED_BASE[0], category: str = UPWEIGHTED_BASE[1]) -> str:
    """The candidate name of a feature model fitted with thin families' rows weighted up (:func:`thin_family_weights`).

    >>> upweighted_name()
    'Upweighted[ExtraTrees:all]'
    """
    return f"{UPWEIGHTED}[{model}:{category}]"


def thin_family_weights(samples: Sequence[Sample], thin_sets: int = THIN_SETS, weight: int = THIN_WEIGHT) -> list[int]:
    """Per row, ``weight`` if it involves a family measured in at most ``thin_sets`` job sets of ``samples``, else 1.

    >>> rows = [Sample("a", ("b",), 0.0, f"g{i}", job_family="a", co_job_families=("b",)) for i in range(9)]
    >>> thin_family_weights([*rows, Sample("c", ("a",), 0.0, "h", job_family="c", co_job_families=("a",))])
    [1, 1, 1, 1, 1, 1, 1, 1, 1, 8]
    """
    sets: dict[str, set[str]] = {}
    for s in samples:
        for fam in s.families:
            sets.setdefault(fam, set()).add(s.group)
    thin = {fam for fam, groups in sets.items() if len(groups) <= thin_sets}
    return [weight if s.families & thin else 1 for s in samples]

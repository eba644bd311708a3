"""A pair never measured, derived from job sets of three that were (pure arithmetic and one small index).

The composition of :mod:`models.compose` serves a job next to two co-runners as ``(1 + s_a)(1 + s_b) - 1`` of its
pairs.  Read the other way, a job ``j`` measured next to ``a`` and ``x`` together, and next to ``x`` alone, says
what ``a`` alone does to it: ``(1 + s_ax) / (1 + s_x) - 1``, though ``j`` never ran next to ``a`` alone.  Where the
composition holds, that is a measurement of the pair, not a model's guess; where a job set of three is measured
while one of its pairs is not (a scheduler placed the three, never the two), the pair's what-if, and every what-if
composed from it, is served from it.  It rests on the composition's own evidence: served only while the
composition of measured pairs scores no worse than the served model on first measurements of job sets of three
(:class:`models.compose.ComposeScore`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from models.live import slot

DERIVED = "derived/baseline.last_measured"
"""The served name of a pair's slowdown derived from measured job sets of three."""


def pair_from_three(with_both_pct: float, with_other_pct: float) -> float | None:
    """The slowdown (%) of a job next to ``a`` alone, from its slowdown next to ``a`` and ``x`` together and next
    to ``x`` alone (the inverse of :func:`models.compose.compose_pct`); None where the latter is -100 % or less.

    >>> round(pair_from_three(200.0, 50.0), 9)  # a third of solo speed, of which x takes two thirds: a half
    100.0
    >>> pair_from_three(10.0, -100.0) is None
    True
    """
    if with_other_pct <= -100.0:
        return None
    return ((1.0 + with_both_pct / 100.0) / (1.0 + with_other_pct / 100.0) - 1.0) * 100.0


def mean_factor_pct(pcts: Sequence[float]) -> float:
    """The slowdown whose factor ``1 + pct/100`` is the geometric mean of theirs (several job sets of three that
    give the pair: their mean in the composition's own, multiplicative, terms).

    >>> round(mean_factor_pct([0.0, 300.0]), 9)
    100.0
    """
    return (math.exp(math.fsum(math.log(max(1e-3, 1.0 + p / 100.0)) for p in pcts) / len(pcts)) - 1.0) * 100.0


class ThreeIndex:
    """Per job type, the measured slots of it next to two co-runners (``(a, x, slot)``, both orders), kept up with
    the slots as they are measured (:meth:`of`: the newest slots since the last call, a dict's order; all of them
    again once slots forgotten are half the index).

    >>> ix, m = ThreeIndex(), {slot("j", ["a", "x"]): 1.0, slot("j", ["x"]): 2.0}
    >>> sorted(ix.of(m)["j"])
    [('a', 'x', 'j | a + x'), ('x', 'a', 'j | a + x')]
    >>> m[slot("k", ["a", "b"])] = 3.0; sorted(ix.of(m))
    ['j', 'k']
    """

    def __init__(self) -> None:
        self._newest: str | None = None
        self._indexed: set[str] = set()
        self._by_job: dict[str, list[tuple[str, str, str]]] = {}

    def of(self, slots: dict[str, Any]) -> dict[str, list[tuple[str, str, str]]]:
        newest = next(reversed(slots), None)
        if newest == self._newest:
            return self._by_job
        if len(self._indexed) > 2 * len(slots):  # many forgotten: made again
            self._indexed, self._by_job = set(), {}
        for s in reversed(slots):  # the newest first, down to the newest already indexed
            if s in self._indexed:
                break
            self._indexed.add(s)
            job, _, co = s.partition(" | ")
            parts = co.split(" + ")
            if len(parts) == 2:
                a, x = parts
                self._by_job.setdefault(job, []).extend(((a, x, s), (x, a, s)))
        self._newest = newest
        return self._by_job


def derived_pair_pct(
    job: str, co: str, by_job: Mapping[str, list[tuple[str, str, str]]], last: Callable[[str], float | None]
) -> float | None:
    """``job``'s slowdown next to ``co`` alone from every measured slot of it next to ``co`` and one other ``x``
    whose pair with ``x`` alone was measured too (``last``: a slot's last-measured slowdown, None if never), their
    :func:`mean_factor_pct`; None where there is none.

    >>> m = {"j | a + x": 200.0, "j | x": 50.0, "j | a + y": 100.0}  # j next to y alone never measured
    >>> round(derived_pair_pct("j", "a", ThreeIndex().of(m), m.get), 6)
    100.0
    >>> derived_pair_pct("j", "b", ThreeIndex().of(m), m.get) is None
    True
    """
    got = []
    for a, x, s in by_job.get(job, ()):
        if a != co:
            continue
        both, other = last(s), last(slot(job, [x]))
        v = None if both is None or other is None else pair_from_three(both, other)
        if v is not None:
            got.append(v)
    return mean_factor_pct(got) if got else None


def derive_pairs(
    plans: Sequence[Any], raw: list[float | None], skip: Collection[int], by_job: Mapping[str, list[tuple[str, str, str]]],
    last: Callable[[str], float | None],
) -> dict[int, str]:  # fmt: skip
    """Each plan of a pair never measured (regime ``new``, one co-runner, placement mode) that measured job sets of
    three give: its ``raw`` value replaced by :func:`derived_pair_pct` (in place).  Returns those plans' served name
    (:data:`DERIVED`).  ``plans``: :class:`models.prediction.Plan` or None; those in ``skip`` are left."""
    names: dict[int, str] = {}
    for i, p in enumerate(plans):
        if p is None or i in skip or raw[i] is None or p.regime != "new" or p.mode != "placement":
            continue
        sample = p.views.sample
        if len(sample.co_job_types) != 1:
            continue
        v = derived_pair_pct(sample.job_type, sample.co_job_types[0], by_job, last)
        if v is not None:
            raw[i], names[i] = v, DERIVED
    return names

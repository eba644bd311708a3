"""The selection of ``aip evaluate``: a blend of single candidates weighted by greedy forward selection over their
out-of-fold predictions (docs/MODELS.md, "Selection on families never seen")."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from models.crossval import Score, score_of
from models.live import MEDIAN

AVERAGE = "Average"
BLEND = "Blend"
BLEND_STEPS = 10
"""Greedy steps of :func:`blend` (each adds one candidate, with replacement, to the blend's mean)."""


def is_single(name: str) -> bool:
    """A candidate that is one fitted model (a batch model, an upweighted one, a baseline), not a combination."""
    return not name.startswith((AVERAGE + "[", BLEND + "["))


def blend_members(name: str) -> list[tuple[str, str, float]]:
    """(model, category, weight) of a ``Blend[model:category=weight,...]`` candidate.

    >>> blend_members("Blend[ExtraTrees:3=0.75,baseline.identity:all=0.25]")
    [('ExtraTrees', '3', 0.75), ('baseline.identity', 'all', 0.25)]
    """
    out = []
    for part in name[len(BLEND) + 1 : -1].split(","):
        member, weight = part.rsplit("=", 1)
        model, category = member.rsplit(":", 1)
        out.append((model, category, float(weight)))
    return out


def blend_weights(oof: np.ndarray, y: np.ndarray, steps: int = BLEND_STEPS) -> np.ndarray:
    """Weights of a blend of candidates (rows of ``oof``, their out-of-fold predictions of ``y``), by greedy
    forward selection with replacement (Caruana et al., 2004): start from the candidate with the smallest MAE, and
    ``steps`` times add to the mean the candidate (again or another) that makes its MAE smallest.  The weights are
    whole counts over ``steps + 1``: a few candidates that err differently, not a fit of one weight per candidate
    (which the few families of an inner fold could not support).

    >>> oof = np.array([[0.0, 2.0, 0.0, 2.0], [2.0, 0.0, 2.0, 0.0], [3.0, 3.0, 3.0, 3.0]])
    >>> blend_weights(oof, np.ones(4), steps=3).tolist()
    [0.5, 0.5, 0.0]
    """
    errors = np.mean(np.abs(oof - y), axis=1)
    counts = np.zeros(len(oof))
    first = int(np.argmin(errors))
    counts[first], total = 1, oof[first].copy()
    for _ in range(steps):
        n = counts.sum()
        j = int(np.argmin(np.mean(np.abs((total + oof) / (n + 1) - y), axis=1)))
        counts[j] += 1
        total += oof[j]
    return counts / counts.sum()


def blend(inner: Sequence[Score], y: np.ndarray, mode: str, steps: int = BLEND_STEPS) -> Score | None:
    """The selection: a blend of the single candidates of ``inner`` (every batch model x category, the upweighted
    model, the job-identity baseline; not the median, not an average) weighted by :func:`blend_weights` over their
    out-of-fold predictions of ``y``, as a :class:`Score` named ``Blend[model:category=weight,...]``; None when no
    candidate was scored on every row some fold tested.  Its ``mae`` is that of the blended out-of-fold
    predictions (in sample for the weights: optimistic, never compared with the candidates')."""
    singles = [c for c in inner if is_single(c.model) and c.model != MEDIAN and math.isfinite(c.mae) and len(c.oof) == len(y)]
    if not singles:
        return None
    tested = np.all([np.isfinite(c.oof) for c in singles], axis=0)
    if not tested.any():
        return None
    singles.sort(key=lambda c: (c.mae, c.model, c.category))
    oof = np.array([c.oof for c in singles])
    w = blend_weights(oof[:, tested], y[tested], steps)
    used = [(c, float(wi)) for c, wi in zip(singles, w, strict=True) if wi > 0]
    name = f"{BLEND}[{','.join(f'{c.model}:{c.category}={wi:.4g}' for c, wi in used)}]"
    o = np.sum([wi * c.oof for c, wi in used], axis=0)
    return score_of(name, "all", mode, o, y)

"""Grouped cross-validation of the batch zoo and the AIP choice (smallest error wins).

A *group* is an unordered job set (or a Gavel pair): no group is ever in both the
training and the test part of a fold.  :func:`cross_validate` returns out-of-fold
predictions for every (mode, category, model), from which the per-model error,
the per-job-set error and the selection follow.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from events import CATEGORIES
from models.datasets import Sample
from models.features import restrict
from models.zoo import BATCH, make_batch


def mae(pred: Sequence[float] | np.ndarray, actual: Sequence[float] | np.ndarray) -> float:
    """Mean absolute error in points.

    >>> mae([1.0, 3.0], [2.0, 2.0])
    1.0
    """
    p, a = np.asarray(pred, dtype=float), np.asarray(actual, dtype=float)
    return float(np.mean(np.abs(p - a))) if len(a) else math.nan


def relative_error(pred: Sequence[float] | np.ndarray, actual: Sequence[float] | np.ndarray, floor: float = 5.0) -> float | None:
    """The paper's relative error ``|pred - actual| / |actual|`` over rows with ``|actual| >= floor``.

    >>> relative_error([110.0, 1.0], [100.0, 2.0])
    0.1
    """
    p, a = np.asarray(pred, dtype=float), np.asarray(actual, dtype=float)
    keep = np.abs(a) >= floor
    if not keep.any():
        return None
    return float(np.mean(np.abs(p[keep] - a[keep]) / np.abs(a[keep])))


def grouped_folds(groups: Sequence[str], k: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``k`` folds (fewer if there are fewer groups) that never split a group.

    >>> folds = grouped_folds(["a", "a", "b", "c", "c", "d"], 2)
    >>> all(not set(np.array(["a","a","b","c","c","d"])[tr]) & set(np.array(["a","a","b","c","c","d"])[te]) for tr, te in folds)
    True
    """
    uniq = sorted(set(groups))
    k = min(k, len(uniq))
    if k < 2:
        return []
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(uniq))
    fold_of = {uniq[g]: i % k for i, g in enumerate(order)}
    f = np.array([fold_of[g] for g in groups])
    return [(np.flatnonzero(f != i), np.flatnonzero(f == i)) for i in range(k)]


@dataclass
class Score:
    model: str
    category: str
    mode: str
    mae: float
    relative_error: float | None
    samples: int
    seconds: float
    oof: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))


def feature_frames(samples: Sequence[Sample], mode: str) -> dict[str, pd.DataFrame]:
    """One frame per category (columns sorted, missing features NaN)."""
    full = [s.features(mode, "all") for s in samples]
    return {cat: pd.DataFrame([restrict(f, cat) for f in full]) for cat in CATEGORIES}


def cross_validate(
    samples: Sequence[Sample],
    modes: Sequence[str],
    *,
    models: Sequence[str] = BATCH,
    categories: Sequence[str] = tuple(CATEGORIES),
    k: int = 5,
    seed: int = 0,
    workers: int = 2,
    progress: Callable[[str], None] | None = None,
) -> list[Score]:
    """Out-of-fold predictions and errors of every model x category x mode, grouped by ``Sample.group``."""
    y = np.array([s.target for s in samples], dtype=float)
    folds = grouped_folds([s.group for s in samples], k, seed)
    if not folds:
        return []
    jobs = []
    for mode in modes:
        frames = feature_frames(samples, mode)
        for cat in categories:
            X = frames[cat]
            if X.shape[1] == 0:
                continue
            for name in models:
                jobs.append((mode, cat, name, X))

    def one(job: tuple[str, str, str, pd.DataFrame]) -> Score:
        mode, cat, name, X = job
        t0 = time.perf_counter()
        oof = np.zeros(len(y))
        for train, test in folds:
            model = make_batch(name, seed).fit(X.iloc[train], y[train])
            oof[test] = model.predict(X.iloc[test])
        return Score(name, cat, mode, mae(oof, y), relative_error(oof, y), len(y), time.perf_counter() - t0, oof)

    scores: list[Score] = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for i, score in enumerate(pool.map(one, jobs)):
            scores.append(score)
            if progress is not None and (i + 1) % max(1, len(jobs) // 10) == 0:
                progress(f"cross-validated {i + 1}/{len(jobs)} (model x category x mode)")
    return scores


def select(scores: Sequence[Score], mode: str, category: str | None = None) -> Score | None:
    """The AIP choice: the smallest MAE for ``mode`` (and ``category`` if given)."""
    cands = [s for s in scores if s.mode == mode and (category is None or s.category == category) and math.isfinite(s.mae)]
    return min(cands, key=lambda s: (s.mae, s.model, s.category)) if cands else None

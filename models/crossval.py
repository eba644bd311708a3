"""Offline grouped cross-validation of the batch zoo and the AIP choice (smallest error wins, :func:`best_score`).

The live selection over the stream's candidates is :mod:`models.selector`.

A *group* is an unordered job set (or a Gavel pair): no group is ever in both the
training and the test part of a fold.  :func:`cross_validate` returns out-of-fold
predictions for every (mode, category, model), from which the per-model error,
the per-job-set error and the selection follow.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from events import CATEGORIES
from models.datasets import Sample
from models.features import restrict
from models.parallel import Fits, Store
from models.zoo import BATCH, make_batch
from models.zoo.frames import Prepared, row_groups


def mae(pred: Sequence[float] | np.ndarray, actual: Sequence[float] | np.ndarray) -> float:
    """Mean absolute error in points.

    >>> mae([1.0, 3.0], [2.0, 2.0])
    1.0
    """
    p, a = np.asarray(pred, dtype=float), np.asarray(actual, dtype=float)
    return float(np.mean(np.abs(p - a))) if len(a) else math.nan


def score_of(name: str, category: str, mode: str, oof: np.ndarray, y: np.ndarray, seconds: float = 0.0, trained: int = 0) -> Score:
    """A candidate's :class:`Score` from its out-of-fold predictions, over the rows some fold tested (``oof`` is
    NaN on the rest: the probes :func:`reveal_probes` moved to training are never scored).

    >>> score_of("m", "all", "placement", np.array([1.0, np.nan]), np.array([2.0, 9.0])).mae
    1.0
    """
    tested = np.isfinite(oof)
    o, a = oof[tested], y[tested]
    return Score(name, category, mode, mae(o, a), relative_error(o, a), int(tested.sum()), seconds, oof, trained)


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


def _fold_of(names: Sequence[str], k: int, seed: int) -> dict[str, int]:
    """Each name's fold of ``min(k, len(names))`` (a seeded shuffle dealt round-robin); empty when fewer than 2."""
    k = min(k, len(names))
    if k < 2:
        return {}
    order = np.random.default_rng(seed).permutation(len(names))
    return {names[g]: i % k for i, g in enumerate(order)}


def grouped_folds(groups: Sequence[str], k: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``k`` folds (fewer if there are fewer groups) that never split a group.

    >>> folds = grouped_folds(["a", "a", "b", "c", "c", "d"], 2)
    >>> all(not set(np.array(["a","a","b","c","c","d"])[tr]) & set(np.array(["a","a","b","c","c","d"])[te]) for tr, te in folds)
    True
    """
    fold_of = _fold_of(sorted(set(groups)), k, seed)
    if not fold_of:
        return []
    k = max(fold_of.values()) + 1
    f = np.array([fold_of[g] for g in groups])
    return [(np.flatnonzero(f != i), np.flatnonzero(f == i)) for i in range(k)]


HOLDOUTS = ("pair", "family")
"""Holdout schemes (docs/ARCHITECTURE.md, "Definitions"): ``pair``, no job set (group) in both training and test; ``family``, every row
that involves a held-out job family is out of training."""


def family_folds(families: Sequence[frozenset[str]], k: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``k`` folds over job families (fewer if there are fewer families): fold ``i`` holds out its families.

    A row is trained on in fold ``i`` only if it involves none of fold ``i``'s families; it is tested in exactly
    one fold, the first whose families it involves.  So every row is predicted once, by a model that never saw
    a row with one of its families (a row of two held-out families is in neither training set).

    >>> fams = [frozenset("a"), frozenset("ab"), frozenset("b"), frozenset("c"), frozenset("bc")]
    >>> folds = family_folds(fams, 3)
    >>> all(fams[i] - set().union(*(fams[j] for j in tr)) for tr, te in folds for i in te)  # a family unseen
    True
    >>> sorted(int(i) for _, te in folds for i in te)
    [0, 1, 2, 3, 4]
    """
    fold_of = _fold_of(sorted(set().union(*families)) if families else [], k, seed)
    if not fold_of:
        return []
    k = max(fold_of.values()) + 1
    member = np.array([[any(fold_of[f] == i for f in fam) for i in range(k)] for fam in families], dtype=bool)
    first = member.argmax(axis=1)
    out = []
    for i in range(k):
        train, test = np.flatnonzero(~member[:, i]), np.flatnonzero(first == i)
        if len(train) and len(test):
            out.append((train, test))
    return out if len(out) >= 2 else []


def reveal_probes(
    folds: Sequence[tuple[np.ndarray, np.ndarray]], families: Sequence[frozenset[str]], groups: Sequence[str], probes: int,
    seed: int = 0,
) -> list[tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """Each fold with ``probes`` job sets (groups) of each of its held-out families moved from test to training.

    A fold's held-out families are those of its test rows that none of its training rows involves.  Per family
    (in sorted order) its test groups are shuffled with a generator seeded by ``seed`` and the fold's index, and
    the first ``probes`` are revealed, so the probes of ``K`` are among those of ``K + 1`` and every candidate sees
    the same ones.  A revealed group moves whole (every one of its test rows); no test row is ever trained on.
    ``probes=0`` returns the folds unchanged.  A fold left without test rows is dropped.

    >>> fams = [frozenset("ab")] * 2 + [frozenset("ac")] * 2 + [frozenset("bc")] * 2
    >>> folds = [(np.array([4, 5]), np.array([0, 1, 2, 3]))]
    >>> [(tr.tolist(), te.tolist()) for tr, te in reveal_probes(folds, fams, ["ab", "ab", "ac", "ac", "bc", "bc"], 1)]
    [([0, 1, 4, 5], [2, 3])]
    """
    if probes <= 0:
        return list(folds)
    out = []
    for i, (train, test) in enumerate(folds):
        seen = set().union(*(families[j] for j in train)) if len(train) else set()
        held = sorted(set().union(*(families[j] for j in test)) - seen)
        rng = np.random.default_rng([seed, i])
        revealed: set[str] = set()
        for fam in held:
            own = sorted({groups[j] for j in test if fam in families[j]})
            revealed.update(own[g] for g in rng.permutation(len(own))[:probes])
        moved = np.array([groups[j] in revealed for j in test], dtype=bool)
        if moved.all():
            continue
        out.append((np.sort(np.concatenate([train, test[moved]])), test[~moved]))
    return out


def with_families(samples: Sequence[Sample]) -> list[Sample] | None:
    """``samples`` with each job's family (its type without the batch size, :func:`models.features.parse_job_type`)
    where a row does not carry one, or None when that makes fewer than two families (nothing to hold out): what the
    stream's observations, which carry job types only, give :func:`family_folds`.

    >>> rows = [Sample("a (batch size 8)", ("b (batch size 4)",), 0.0, "g"), Sample("c", ("a (batch size 16)",), 0.0, "h")]
    >>> [sorted(s.families) for s in with_families(rows)]
    [['a', 'b'], ['a', 'c']]
    """
    from dataclasses import replace

    from models.features import parse_job_type

    out = [
        s if s.job_family else replace(
            s, job_family=parse_job_type(s.job_type)[0], co_job_families=tuple(parse_job_type(c)[0] for c in s.co_job_types)
        )
        for s in samples
    ]  # fmt: skip
    return out if len(set().union(*(s.families for s in out))) >= 2 else None


def holdout_folds(
    samples: Sequence[Sample], k: int, seed: int = 0, holdout: str = "pair", probes: int = 0, probe_seed: int | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The folds of a holdout scheme: :func:`grouped_folds` by ``Sample.group`` or :func:`family_folds`; with
    ``probes`` (``family`` only), that many job sets of each held-out family revealed to training
    (:func:`reveal_probes`, seeded by ``probe_seed``, by default ``seed``: another ``probe_seed`` draws other
    probes from the same folds)."""
    if probes and holdout != "family":
        raise ValueError(f"probes reveal job sets of held-out families: they need holdout 'family', not {holdout!r}")
    if holdout == "pair":
        return grouped_folds([s.group for s in samples], k, seed)
    if holdout == "family":
        folds = family_folds([s.families for s in samples], k, seed)
        draw = seed if probe_seed is None else probe_seed
        return reveal_probes(folds, [s.families for s in samples], [s.group for s in samples], probes, draw)
    raise ValueError(f"unknown holdout {holdout!r} (choose from {', '.join(HOLDOUTS)})")


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
    trained: int = 0
    """Rows the CV trained on (summed over the folds / (k - 1): the rows of the subsample when capped)."""


def feature_frames(samples: Sequence[Sample], mode: str) -> dict[str, pd.DataFrame]:
    """One frame per category (missing features NaN): the ``all`` frame, then its columns per category.

    A sample's placement features are those of the last sample of its job set when both have the same inputs (job
    type, co-runners and their solo profiles, equal as values), else made: 10,000 observations of a refit hold a few
    hundred (placement features took 90 ms of a 10,000-row refit's 110 ms of frames, docs/BENCHMARKS.md, "Models")."""
    if mode == "placement":
        last: dict[tuple[str, tuple[str, ...]], tuple[Sample, int]] = {}
        made: list[dict[str, float]] = []
        index = []
        for s in samples:
            key = (s.job_type, s.co_job_types)
            before = last.get(key)
            if before is not None and before[0].solo == s.solo and before[0].co_solos == s.co_solos:
                i = before[1]
            else:
                i = len(made)
                last[key] = (s, i)
                made.append(s.features(mode, "all"))
            index.append(i)
        full = pd.DataFrame(made).take(index).reset_index(drop=True)
    else:
        full = pd.DataFrame([s.features(mode, "all") for s in samples])
    out = {}
    for cat in CATEGORIES:
        keep = list(restrict(dict.fromkeys(full.columns, 0.0), cat))
        out[cat] = full[keep] if cat != "all" else full
    return out


def distinct_rows(frame: pd.DataFrame) -> int:
    """How many distinct feature rows ``frame`` holds (missing values count as one value)."""
    if frame.shape[1] == 0:
        return min(1, len(frame))
    a = frame.to_numpy(dtype=float, na_value=np.nan)
    if len(a) < 2:
        return len(a)
    return len(row_groups(np.where(np.isnan(a), np.inf, a) + 0.0)[1])  # + 0.0: -0.0 and 0.0 are one value


def stratified_subsample(groups: Sequence[str], n: int, seed: int = 0) -> np.ndarray:
    """At most about ``n`` row indices (sorted), each group keeping its share (at least one row), drawn at random.

    >>> idx = stratified_subsample(["a"] * 80 + ["b"] * 20, 10)
    >>> len(idx), int((idx < 80).sum())
    (10, 8)
    """
    g = np.asarray(groups)
    if len(g) <= n:
        return np.arange(len(g))
    rng = np.random.default_rng(seed)
    uniq, inverse = np.unique(g, return_inverse=True)
    out = []
    for j in range(len(uniq)):
        rows = np.flatnonzero(inverse == j)
        take = max(1, round(n * len(rows) / len(g)))
        out.append(rng.choice(rows, min(take, len(rows)), replace=False))
    return np.sort(np.concatenate(out))


def cross_validate(
    samples: Sequence[Sample],
    modes: Sequence[str],
    *,
    models: Sequence[str] = BATCH,
    categories: Sequence[str] = tuple(CATEGORIES),
    k: int = 5,
    seed: int = 0,
    workers: int | None = 1,
    fits: Fits | None = None,
    max_rows: int | None = None,
    frames: Mapping[str, Mapping[str, pd.DataFrame]] | None = None,
    progress: Callable[[str], None] | None = None,
    holdout: str = "pair",
    probes: int = 0,
    weights: Callable[[Sequence[Sample]], Sequence[int]] | None = None,
    probe_seed: int | None = None,
) -> list[Score]:
    """Out-of-fold predictions and errors of every model x category x mode, grouped by ``Sample.group``.

    ``max_rows`` caps the *training* rows of the folds: a mode whose frame holds more than ``max_rows``
    distinct feature rows is cross-validated on a group-stratified subsample of ``max_rows`` rows
    (:func:`stratified_subsample`); the folds still cover every group, and every row of a test fold is
    predicted, so the error is measured on all rows.  Duplicated rows are no cost (models fit the
    distinct ones), so a mode with few distinct rows (placement) trains on all of them.  ``Score.trained``
    says how many rows each fold trained on, summed over the folds / ``k - 1``.

    ``holdout`` is the scheme of the folds (:func:`holdout_folds`): ``pair`` by ``Sample.group``, ``family``
    by job family (with ``probes`` job sets of each held-out family revealed to training, drawn with ``probe_seed``).  ``weights``: each
    fold's training rows weighted by ``weights(training samples)`` (whole copies, one per unit; the models fit
    distinct rows weighted by their copies), e.g. :func:`models.thinfamilies.thin_family_weights`.

    The fits (model x category x mode x fold) are independent: with ``workers`` > 1 (None: all cores) they run
    on :mod:`models.parallel`'s process pool, or on ``fits`` when given (which then keeps the arrays published
    as ``x_<mode>_<category>`` and ``y`` for :func:`final_fit`).  Results do not depend on ``workers``.
    """
    y = np.array([s.target for s in samples], dtype=float)
    groups = [s.group for s in samples]
    folds = holdout_folds(samples, k, seed, holdout, probes, probe_seed)
    if not folds:
        return []
    if weights is not None:
        folds = [(np.repeat(tr, np.asarray(weights([samples[i] for i in tr]), dtype=int)), te) for tr, te in folds]
    jobs: list[tuple[str, str, list[str]]] = []
    arrays: dict[str, np.ndarray] = {"y": y}
    for i, (_, te) in enumerate(folds):
        arrays[f"te_{i}"] = te
    for mode in modes:
        mframes = frames[mode] if frames is not None and mode in frames else feature_frames(samples, mode)
        keep: np.ndarray | None = None
        if max_rows is not None and len(samples) > max_rows and distinct_rows(mframes["all"]) > max_rows:
            keep = np.zeros(len(samples), dtype=bool)
            keep[stratified_subsample(groups, max_rows, seed)] = True
        for i, (tr, _) in enumerate(folds):
            arrays[f"tr_{mode}_{i}"] = tr if keep is None else tr[keep[tr]]
        for cat in categories:
            X = mframes[cat]
            if X.shape[1] == 0:
                continue
            columns = sorted(str(c) for c in X.columns)
            arrays[f"x_{mode}_{cat}"] = X.reindex(columns=columns).to_numpy(dtype=float, na_value=np.nan)
            jobs.append((mode, cat, columns))
    rank = {name: i for i, name in enumerate(COST_ORDER)}
    order = sorted(models, key=lambda n: rank.get(n, len(rank)))  # longest fits first: the pool ends balanced
    every_fold = tuple(range(len(folds)))
    calls = [(mode, cat, columns, every_fold, name, seed) for name in order for mode, cat, columns in jobs]
    own = fits is None
    runner = Fits(workers) if fits is None else fits
    try:
        runner.publish(arrays)
        step = max(1, len(calls) // 20)
        results = runner.run(
            cv_fits, calls,
            None if progress is None else lambda d, n: None if d % step and d != n else progress(f"cross-validated {d}/{n} models"),
        )  # fmt: skip
    finally:
        if own:
            runner.__exit__(None, None, None)
    oof = {(mode, cat, name): np.full(len(y), np.nan) for mode, cat, _ in jobs for name in models}
    seconds = dict.fromkeys(oof, 0.0)
    for (mode, cat, _, _, name, _), per_fold in zip(calls, results, strict=True):
        for i, (pred, sec) in enumerate(per_fold):
            oof[(mode, cat, name)][folds[i][1]] = pred
            seconds[(mode, cat, name)] += sec
    scores: list[Score] = []
    for mode, cat, _ in jobs:
        trained = sum(len(arrays[f"tr_{mode}_{i}"]) for i in range(len(folds))) // max(1, len(folds) - 1)
        for name in models:
            scores.append(score_of(name, cat, mode, oof[(mode, cat, name)], y, seconds[(mode, cat, name)], trained))
    return scores


COST_ORDER = (
    "GradientBoosting", "SVR-poly", "ExtraTrees", "HistGradientBoosting", "HistGradientBoosting-monotone",
    "RandomForest", "MLP", "KNN", "SVR-linear", "DecisionTree", "LinearRegression",
)  # fmt: skip
"""Batch models from the longest fit to the shortest (measured on the 10,000-observation refit: SVR-poly,
ExtraTrees, HistGradientBoosting, RandomForest and the MLP within 20 % of each other in CV; SVR-poly's final fit
on 10,000 observed rows the longest of the finals)."""


def distinct_rows_of(a: np.ndarray, below: float = 1.0) -> tuple[np.ndarray, np.ndarray] | None:
    """The distinct rows of ``a`` (sorted as bytes) and, per row of ``a``, the index of its distinct row; None where
    they are ``below`` times the rows of ``a`` or more (predicting them apart would save little) or ``a`` has fewer than
    two rows or no column.

    >>> u, inv = distinct_rows_of(np.array([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0]]))
    >>> u[inv].tolist()
    [[1.0, 2.0], [3.0, 4.0], [1.0, 2.0]]
    >>> len(u), distinct_rows_of(np.array([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0]]), below=0.5)
    (2, None)
    """
    rows = np.ascontiguousarray(a, dtype=float) + 0.0  # + 0.0: -0.0 and 0.0 compare equal as bytes too
    if len(rows) < 2 or rows.shape[1] == 0:
        return None
    codes, first = row_groups(rows)
    if len(first) >= below * len(rows):
        return None
    distinct = rows[first]
    order = np.argsort(distinct.view(np.dtype((np.void, 8 * rows.shape[1])))[:, 0], kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return distinct[order], rank[codes]


def cv_fit(store: Store, mode: str, cat: str, columns: list[str], fold: int, name: str, seed: int) -> tuple[np.ndarray, float]:
    """One cross-validation fit: ``name`` trained on fold ``fold``'s training rows, its test rows predicted.
    Each fold's training set (columns, fill values, array, distinct rows) and its distinct test rows are prepared
    once per process; the model predicts each distinct test row once (placement mode: ~640 of 10,000 rows), the
    same predictions as row by row up to float rounding (1e-14 measured: BLAS sums blocks of other sizes)."""
    raw, y = store[f"x_{mode}_{cat}"], store["y"]

    def prepare() -> tuple[Prepared, np.ndarray, np.ndarray | None]:
        tr, te = store[f"tr_{mode}_{fold}"], store[f"te_{fold}"]
        data = Prepared.of_array(columns, np.asarray(raw[tr]), np.asarray(y[tr]))
        test = data.cols.filled(np.asarray(raw[te]))
        grouped = distinct_rows_of(test, below=0.8)
        return (data, test, None) if grouped is None else (data, *grouped)

    data, test_a, inverse = store.cached(("fold", mode, cat, fold), prepare)
    t0 = time.perf_counter()
    pred = make_batch(name, seed).fit_prepared(data).predict_array(test_a)
    return (pred if inverse is None else pred[inverse]), time.perf_counter() - t0


def cv_fits(
    store: Store, mode: str, cat: str, columns: list[str], folds: Sequence[int], name: str, seed: int
) -> list[tuple[np.ndarray, float]]:
    """:func:`cv_fit` of each of ``folds``: one task of the pool per model x category x mode (a task's round trip
    costs the refit's own process CPU that the pool's workers would use, docs/BENCHMARKS.md, "Models")."""
    return [cv_fit(store, mode, cat, columns, fold, name, seed) for fold in folds]


def final_fit(store: Store, mode: str, cat: str, columns: list[str], name: str, seed: int) -> Any:
    """``name`` fitted on every row of ``mode`` x ``cat`` (the array :func:`cross_validate` published), prepared once
    per process for every model of that mode and category."""
    raw, y = store[f"x_{mode}_{cat}"], store["y"]
    data = store.cached(("all", mode, cat), lambda: Prepared.of_array(columns, np.asarray(raw), np.asarray(y)))
    return make_batch(name, seed).fit_prepared(data)


def best_score(scores: Sequence[Score], mode: str, category: str | None = None) -> Score | None:
    """The AIP choice: the smallest MAE for ``mode`` (and ``category`` if given)."""
    cands = [s for s in scores if s.mode == mode and (category is None or s.category == category) and math.isfinite(s.mae)]
    return min(cands, key=lambda s: (s.mae, s.model, s.category)) if cands else None

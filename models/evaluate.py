"""Offline evaluation in the paper's method: error of every model per category, the AIP choice,
and that choice's held-out error, interval and baselines.

Held-out error is *nested* and cannot leak: for each outer fold of the holdout scheme (``pair``: no job set
in training and test; ``family``: every row involving a held-out job family out of training), AIP selects
among the candidates by cross-validation **of the same scheme** on the outer training rows only, fits the
choice there and predicts the outer test rows.  The candidates are the batch models per category, their
average (the three best by inner CV), and the two baselines (the training median and a random forest on
job identities), so the choice is never worse than a baseline on the inner folds.  The 90 % interval of a
prediction is conformal, from residuals on the outer training rows held out *the same way* (:func:`interval`).

Everything the outer fold ``i`` fits or selects on goes through :func:`fit_candidate` and
:func:`candidate_scores` with the outer training rows alone (``tests/unit/test_evaluate.py`` checks it).
The paper's table (:attr:`Evaluation.scores`) is a cross-validation on all rows: a report, never used for
the held-out figures.
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
from models.blend import AVERAGE, BLEND, blend, blend_members, is_single
from models.crossval import Score, best_score, cross_validate, holdout_folds, mae, relative_error, score_of
from models.datasets import Dataset, Sample
from models.features import restrict
from models.intervals import COVERAGE, conformal_offsets, scaled_offsets
from models.live import MEDIAN
from models.thinfamilies import UPWEIGHTED, thin_family_weights, upweighted_name
from models.zoo import BATCH, make_batch

Progress = Callable[[str], None]
Predictor = Callable[[Sequence[Sample]], np.ndarray]

OBSERVED_VIEWS = ("all+placement", "placement")
"""Extra candidate views of observed mode when the rows also carry solo profiles: everything known about a running
co-location (percent changes, solo profiles of the job and its co-runners, job identities), and the placement
features alone, so that observed mode, which knows strictly more, is never chosen worse than placement mode."""
IDENTITY = "baseline.identity"
IDENTITY_TREES = 100
"""Trees of the :data:`IDENTITY` forest (the unit tests, on datasets of a few dozen rows, use fewer: on those the
forest's per-tree set-up was half of every evaluation's CPU)."""


def _key(name: str, category: str) -> str:
    """A candidate's key in :attr:`Evaluation.candidate_pred`: ``model:category``; every fold's average is one
    candidate, ``Average:all`` (its members differ by fold)."""
    return f"{AVERAGE}:all" if name.startswith(AVERAGE + "[") else f"{name}:{category}"


@dataclass
class Evaluation:
    dataset: str
    target: str
    mode: str
    rows: int
    groups: int
    scores: list[Score]
    selected: Score
    heldout_pred: np.ndarray
    mae: float
    relative_error: float | None
    baseline_mae: float | None
    selection_seconds: float
    seconds: float
    outer_choices: list[str] = field(default_factory=list)
    actual: np.ndarray = field(default_factory=lambda: np.zeros(0))
    holdout: str = "pair"
    folds: int = 0
    probes: int = 0
    """Job sets of each held-out family revealed to training (``family`` holdout; 0: none)."""
    probe_seed: int | None = None
    """The seed of the probes' draw (None: the evaluation's seed)."""
    scored_rows: int = 0
    """Rows scored (``rows`` less the revealed probes)."""
    median_baseline_mae: float | None = None
    interval_lo: np.ndarray = field(default_factory=lambda: np.zeros(0))
    interval_hi: np.ndarray = field(default_factory=lambda: np.zeros(0))
    fold_picks: list[tuple[np.ndarray, np.ndarray, str, str]] = field(default_factory=list, repr=False)
    """Per outer fold: (train rows, test rows, chosen model, category)."""
    candidate_pred: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    """Per candidate (``model:category``; ``Average:all`` for the average of each fold's three best), its held-out
    predictions on the scored rows: each outer fold's candidate fitted on that fold's training rows."""

    @property
    def candidate_mae(self) -> dict[str, float]:
        """Every candidate's held-out MAE over the scored rows (the same rows as :attr:`mae`), smallest first."""
        out = {k: mae(p, self.actual) for k, p in self.candidate_pred.items() if np.isfinite(p).all()}
        return dict(sorted(out.items(), key=lambda kv: (kv[1], kv[0])))

    @property
    def best_single(self) -> tuple[str, float] | None:
        """The single candidate (a batch model of one category or view or a baseline; not a blend or an average)
        with the smallest held-out MAE: the best choice in hindsight, for comparison only (no fold could know it)."""
        singles = [(k, v) for k, v in self.candidate_mae.items() if is_single(k.rsplit(":", 1)[0]) and k != f"{AVERAGE}:all"]
        return min(singles, key=lambda kv: (kv[1], kv[0])) if singles else None

    @property
    def interval_coverage(self) -> float | None:
        """Share of held-out rows whose measured value lies inside its interval."""
        if not len(self.interval_lo):
            return None
        return float(np.mean((self.actual >= self.interval_lo) & (self.actual <= self.interval_hi)))

    @property
    def interval_width_mean(self) -> float | None:
        return float(np.mean(self.interval_hi - self.interval_lo)) if len(self.interval_lo) else None

    def summary(self) -> dict[str, Any]:
        def r(v: float | None, n: int = 3) -> float | None:  # JSON has no infinity: an unbounded interval is null
            return None if v is None or not math.isfinite(v) else round(v, n)

        best = self.best_single
        return {
            "dataset": self.dataset,
            "target": self.target,
            "mode": self.mode,
            "holdout": self.holdout,
            "folds": self.folds,
            "probes": self.probes,
            "probe_seed": self.probe_seed,
            "selected": self.selected.model,
            "category": self.selected.category,
            "cv_mae": round(self.selected.mae, 3),
            "mae": round(self.mae, 3),
            "relative_error": r(self.relative_error, 4),
            "median_baseline_mae": r(self.median_baseline_mae),
            "baseline_mae": r(self.baseline_mae),
            "interval_coverage": r(self.interval_coverage, 4),
            "interval_width_mean": r(self.interval_width_mean),
            "selection_seconds": round(self.selection_seconds, 2),
            "seconds": round(self.seconds, 2),
            "rows": self.rows,
            "scored_rows": self.scored_rows,
            "groups": self.groups,
            "outer_choices": self.outer_choices,
            "best_single": None if best is None else best[0],
            "best_single_mae": None if best is None else round(best[1], 3),
            "candidate_mae": {k: round(v, 3) for k, v in self.candidate_mae.items()},
        }


def _identity_frame(samples: Sequence[Sample]) -> pd.DataFrame:
    rows = [{f"job={s.job_type}": 1.0, **{f"co={c}": 1.0 for c in s.co_job_types}} for s in samples]
    return pd.DataFrame(rows).fillna(0.0)


def fit_candidate(name: str, category: str, train: Sequence[Sample], mode: str, seed: int = 0) -> Predictor:
    """Fit one candidate on ``train`` and return its predictor (a function of samples).

    ``name``: a batch model of the zoo, :data:`MEDIAN` (the training median), :data:`IDENTITY` (a random forest
    on one-hot job identities, the baseline) or ``Average[m:c,...]`` (the mean of the listed candidates).

    >>> train = [Sample("a", ("b",), y, "g") for y in (1.0, 2.0, 9.0)]
    >>> fit_candidate(MEDIAN, "all", train, "placement")(train).tolist()
    [2.0, 2.0, 2.0]
    """
    y = np.array([s.target for s in train], dtype=float)
    if name == MEDIAN:
        med = float(np.median(y))
        return lambda test: np.full(len(test), med)
    if name == IDENTITY:
        from sklearn.ensemble import RandomForestRegressor

        X = _identity_frame(train)
        rf = RandomForestRegressor(n_estimators=IDENTITY_TREES, random_state=seed, n_jobs=1).fit(X, y)
        return lambda test: rf.predict(_identity_frame(test).reindex(columns=X.columns, fill_value=0.0).fillna(0.0))
    if name.startswith(UPWEIGHTED + "["):
        return _fit_upweighted(name, train, mode, seed)
    if name.startswith(AVERAGE + "["):
        parts = [fit_candidate(m, c, train, mode, seed) for m, c in _members(name)]
        return lambda test: np.mean([p(test) for p in parts], axis=0)
    if name.startswith(BLEND + "["):
        weighted = [(fit_candidate(m, c, train, mode, seed), w) for m, c, w in blend_members(name)]
        return lambda test: np.sum([w * p(test) for p, w in weighted], axis=0)
    model = make_batch(name, seed).fit(pd.DataFrame([view(s, mode, category) for s in train]), y)
    return lambda test: np.asarray(model.predict(pd.DataFrame([view(s, mode, category) for s in test])))


def _fit_upweighted(name: str, train: Sequence[Sample], mode: str, seed: int) -> Predictor:
    """The feature model fitted on ``train`` with the rows of thin families weighted up (as copies: the batch
    models fit distinct rows weighted by their copies, :func:`models.zoo.frames.compress`)."""
    ((model, category),) = _members(name, UPWEIGHTED)
    weighted = [s for s, w in zip(train, thin_family_weights(train), strict=True) for _ in range(w)]
    return fit_candidate(model, category, weighted, mode, seed)


def view(sample: Sample, mode: str, category: str) -> dict[str, float]:
    """The features a candidate of ``category`` sees: the category's (paper), or one of :data:`OBSERVED_VIEWS`.

    >>> s = Sample("a", ("b",), 1.0, "g", pcts={"E": 5.0}, solo={"E": 100.0}, co_solos=({"E": 50.0},))
    >>> sorted(view(s, "observed", "1")), "solo_E" in view(s, "observed", "all+placement")
    (['E_pct'], True)
    """
    if mode == "observed" and category == "all+placement":
        return {**sample.features("placement", "all"), **sample.features("observed", "all")}
    if mode == "observed" and category == "placement":
        return sample.features("placement", "all")
    return restrict(sample.features(mode, "all"), category)


def _members(name: str, kind: str = AVERAGE) -> list[tuple[str, str]]:
    inner = name[len(kind) + 1 : -1]
    return [(m.rsplit(":", 1)[0], m.rsplit(":", 1)[1]) for m in inner.split(",")]


def _oof(
    name: str, samples: Sequence[Sample], folds: Sequence[tuple[np.ndarray, np.ndarray]], mode: str, seed: int,
    category: str = "all",
) -> np.ndarray:  # fmt: skip
    out = np.full(len(samples), np.nan)
    for train, test in folds:
        out[test] = fit_candidate(name, category, [samples[i] for i in train], mode, seed)([samples[i] for i in test])
    return out


INTERVAL_FOLDS = 5
"""``pair`` holdout: folds of the fresh partition whose residuals calibrate the interval (as many as the outer
evaluation)."""


def interval(
    pick: Score | None, inner: Sequence[Score], train: Sequence[Sample], test: Sequence[Sample], pred: np.ndarray,
    mode: str, holdout: str, *, seed: int = 0, coverage: float = COVERAGE, fitted: Mapping[str, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The 90 % interval of ``pred`` (``pick`` fitted on ``train``, predicting ``test``), from ``train`` alone.

    * No pick (too few groups or families inside): the training median's residuals on the training rows.
    * ``pair``: split-conformal on the chosen candidate's residuals over a fresh partition of ``train`` into
      :data:`INTERVAL_FOLDS` groups-folds, not the inner folds it was selected on (residuals the selection
      minimised are optimistic) and each trained on 4/5 of the rows, like the served fit on all of them.
    * ``family``: locally weighted (:func:`models.intervals.scaled_offsets`): the chosen candidate's inner
      residuals scaled by the disagreement (standard deviation) of the three best single candidates, measured
      out of fold on the calibration rows and on ``test`` by the same three fitted on ``train`` (at most the
      largest calibration disagreement).  A row of an unseen family on which models disagree gets a wider
      interval.

    ``fitted``: predictions on ``test`` of candidates already fitted on ``train`` with ``seed``, by :func:`_key`
    (:func:`outer_predictions`); a candidate among them is not fitted again."""
    y = np.array([s.target for s in train], dtype=float)
    if pick is None:
        lo, hi = conformal_offsets(y - float(np.median(y)), coverage)
        return pred + lo, pred + hi
    if holdout == "pair":
        folds = holdout_folds(train, INTERVAL_FOLDS, seed + 2, holdout)  # not the selection's partition (seed + 1)
        lo, hi = conformal_offsets(y - _oof(pick.model, train, folds, mode, seed + 2, pick.category), coverage)
        return pred + lo, pred + hi
    singles = [c for c in inner if math.isfinite(c.mae) and c.model not in (MEDIAN, IDENTITY) and not c.model.startswith(AVERAGE)]
    top = sorted(singles, key=lambda c: (c.mae, c.model, c.category))[:3]
    known = fitted or {}
    preds = [
        known[_key(c.model, c.category)]
        if _key(c.model, c.category) in known
        else fit_candidate(c.model, c.category, train, mode, seed)(test)
        for c in top
    ]
    spread = np.std([c.oof for c in top], axis=0) if top else np.zeros(len(y))
    new = np.std(preds, axis=0) if top else np.zeros(len(test))
    cal = np.isfinite(pick.oof) & np.isfinite(spread)  # the calibration rows some inner fold tested (not the probes)
    lo, hi, beta = scaled_offsets((y - pick.oof)[cal], spread[cal], coverage)
    scale = np.minimum(new, float(spread[cal].max())) + beta
    return pred + lo * scale, pred + hi * scale


def candidate_scores(
    samples: Sequence[Sample],
    mode: str,
    *,
    models: Sequence[str] = BATCH,
    k: int = 3,
    seed: int = 0,
    holdout: str = "pair",
    average: int = 3,
    baselines: bool = True,
    views: Sequence[str] = (),
    probes: int = 0,
    upweighted: bool = True,
    weighted: bool = False,
    probe_seed: int | None = None,
) -> list[Score]:
    """Cross-validated error (``holdout`` scheme) of every candidate on ``samples``: the batch models per
    category (and per extra ``views``, see :data:`OBSERVED_VIEWS`), the average of the ``average`` best of them,
    and the baselines.  Empty when the scheme cannot
    make two folds (too few groups or families).  ``probes``: job sets of each held-out family revealed to the
    folds' training rows (:func:`models.crossval.reveal_probes`, drawn with ``probe_seed``, by default ``seed``).

    ``weighted``: every batch model of every category and view is its :data:`UPWEIGHTED` form, fitted with the rows
    of thin families weighted up (:func:`thin_family_weights`, in each fold on that fold's training rows) and named
    ``Upweighted[model:category]``; the average is of those.  :func:`evaluate` asks it when job sets of each held-out
    family are revealed (``probes`` > 0): the task is then a newcomer's, the same for every candidate.  Without it,
    ``upweighted`` adds the one :func:`upweighted_name` candidate (placement mode)."""
    y = np.array([s.target for s in samples], dtype=float)
    weigh = thin_family_weights if weighted else None
    scores = cross_validate(
        samples, [mode], models=models, k=k, seed=seed, holdout=holdout, probes=probes, weights=weigh, probe_seed=probe_seed,
    )  # fmt: skip
    if not scores:
        return []
    for name in views:  # the extra views (OBSERVED_VIEWS), cross-validated on the same folds
        frame = pd.DataFrame([view(s, mode, name) for s in samples])
        extra = cross_validate(
            samples, [mode], models=models, categories=("all",), k=k, seed=seed, holdout=holdout,
            frames={mode: {"all": frame}}, probes=probes, weights=weigh, probe_seed=probe_seed,
        )  # fmt: skip
        for s in extra:
            s.category = name
        scores += extra
    if weighted:
        for s in scores:
            s.model = upweighted_name(s.model, s.category)
    folds = holdout_folds(samples, k, seed, holdout, probes, probe_seed)
    ranked = sorted((s for s in scores if math.isfinite(s.mae)), key=lambda s: (s.mae, s.model, s.category))
    if average > 1 and len(ranked) >= average:
        top = ranked[:average]
        o = np.mean([s.oof for s in top], axis=0)
        name = f"{AVERAGE}[{','.join(f'{s.model}:{s.category}' for s in top)}]"
        scores.append(score_of(name, "all", mode, o, y))
    if upweighted and mode == "placement" and not weighted:  # weighted: it is Upweighted[ExtraTrees:all], scored above
        name = upweighted_name()
        o = _oof(name, samples, folds, mode, seed)
        scores.append(score_of(name, "all", mode, o, y))
    if baselines:
        for name in (MEDIAN, IDENTITY):
            o = _oof(name, samples, folds, mode, seed)
            scores.append(score_of(name, "all", mode, o, y))
    return scores


def report_candidates(models: Sequence[str], mode: str, views: Sequence[str], sample: Sample) -> list[Score]:
    """The single candidates :func:`candidate_scores` would score, unscored (MAE 0): what an outer fold fits for the
    report when its training rows are too few to select among them (``sample``: a row, for the categories with
    features)."""
    cats = [c for c in (*CATEGORIES, *views) if view(sample, mode, c)]
    names = [(m, c) for m in models for c in cats]
    if mode == "placement":
        names.append((upweighted_name(), "all"))
    names += [(MEDIAN, "all"), (IDENTITY, "all")]
    return [Score(m, c, mode, 0.0, None, 0, 0.0) for m, c in names]


def outer_predictions(
    inner: Sequence[Score], train: Sequence[Sample], test: Sequence[Sample], mode: str, seed: int = 0
) -> dict[str, np.ndarray]:  # fmt: skip
    """Every candidate of ``inner`` with a finite score, fitted on ``train``, predicting ``test``, by :func:`_key`:
    each fitted once (an average is the mean of its members' predictions)."""
    out: dict[str, np.ndarray] = {}
    for c in inner:
        if math.isfinite(c.mae) and is_single(c.model):
            out[_key(c.model, c.category)] = fit_candidate(c.model, c.category, train, mode, seed)(test)
    for c in inner:
        if math.isfinite(c.mae) and not is_single(c.model):
            parts = [out.get(f"{m}:{k}") for m, k in _members(c.model, c.model.split("[", 1)[0])]
            if all(p is not None for p in parts):
                out[_key(c.model, c.category)] = np.mean(parts, axis=0)
            else:
                out[_key(c.model, c.category)] = fit_candidate(c.model, c.category, train, mode, seed)(test)
    return out


def baseline_onehot(samples: Sequence[Sample], k: int = 5, seed: int = 0, holdout: str = "pair") -> float | None:
    """The job-identity baseline alone: :data:`IDENTITY`'s held-out MAE on the scheme's folds."""
    folds = holdout_folds(samples, k, seed, holdout)
    if not folds:
        return None
    return mae(_oof(IDENTITY, samples, folds, "placement", seed), [s.target for s in samples])


def evaluate(
    dataset: Dataset,
    mode: str,
    *,
    k: int | None = None,
    inner_k: int | None = None,
    seed: int = 0,
    models: Sequence[str] = BATCH,
    baseline: bool = True,
    holdout: str = "pair",
    coverage: float = COVERAGE,
    report_table: bool = True,
    probes: int = 0,
    probe_seed: int | None = None,
    progress: Progress | None = None,
) -> Evaluation:
    """Nested held-out evaluation (see the module docstring).  ``k`` outer folds (default: 5 for ``pair``, one
    per family for ``family``, i.e. leave one family out); ``inner_k`` folds of the same scheme inside (default:
    3 for ``pair``; 2 for ``family``, so that the inner folds train on about half the families, a harder task than
    the outer one: measured on Gavel, 2 inner folds gave lower held-out MAE and better-calibrated intervals
    than 3 or one per family on all three GPUs, docs/MODELS.md).

    ``probes`` (``family`` only): ``K`` job sets of each held-out family revealed to the outer training rows
    (seeded, the same for every candidate, :func:`models.crossval.reveal_probes`) and the rest scored; the inner
    selection reveals ``K`` the same way, so the choice is made on the task it is scored on, and every batch
    candidate is its :data:`UPWEIGHTED` form (``candidate_scores(..., weighted=True)``).  0: the plain family holdout.
    ``probe_seed``: the seed of the probes' draw (default ``seed``; the inner selection's is one more, as its folds'
    seed is), so several draws can be measured on the same folds: with 2-4 job sets revealed the figures depend on
    which ones (docs/MODELS.md, "Newcomers")."""
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    samples = dataset.samples
    y = np.array([s.target for s in samples], dtype=float)
    n_fam = len(set().union(*(s.families for s in samples)))
    if k is None:
        k = n_fam if holdout == "family" else 5
    if inner_k is None:
        inner_k = 2 if holdout == "family" else 3
    folds = holdout_folds(samples, k, seed, holdout, probes, probe_seed)
    views = OBSERVED_VIEWS if mode == "observed" and "placement" in dataset.modes else ()
    if not folds:
        raise ValueError(f"too few {'families' if holdout == 'family' else 'groups'} for {holdout} holdout")
    say(f"{len(samples)} rows, {len(set(dataset.groups))} groups, {n_fam} families; {holdout} holdout, {len(folds)} outer folds")
    ts = time.perf_counter()
    scores = (
        cross_validate(
            samples, [mode], models=models, k=k, seed=seed, holdout=holdout, probes=probes, progress=say, probe_seed=probe_seed,
        )
        if report_table else []
    )  # fmt: skip
    selection_seconds = time.perf_counter() - ts
    scored = np.zeros(len(y), dtype=bool)
    heldout = np.full(len(y), np.nan)
    lo, hi = np.full(len(y), np.nan), np.full(len(y), np.nan)
    med_pred, id_pred = np.full(len(y), np.nan), np.full(len(y), np.nan)
    outer_choices: list[str] = []
    picks: list[tuple[np.ndarray, np.ndarray, str, str]] = []
    cand_pred: dict[str, np.ndarray] = {}
    for i, (train, test) in enumerate(folds):
        tr, te = [samples[j] for j in train], [samples[j] for j in test]
        scored[test] = True
        inner = candidate_scores(
            tr, mode, models=models, k=inner_k, seed=seed + 1, holdout=holdout, views=views, probes=probes, weighted=probes > 0,
            probe_seed=None if probe_seed is None else probe_seed + 1,
        )  # fmt: skip
        pick = blend(inner, np.array([s.target for s in tr], dtype=float), mode)
        name, cat = (MEDIAN, "all") if pick is None else (pick.model, pick.category)  # None: too few groups inside
        outer = outer_predictions(inner if inner else report_candidates(models, mode, views, tr[0]), tr, te, mode, seed)
        for key, p in outer.items():
            cand_pred.setdefault(key, np.full(len(y), np.nan))[test] = p
        if pick is not None:
            heldout[test] = np.sum([w * outer[f"{m}:{c}"] for m, c, w in blend_members(name)], axis=0)
        else:
            heldout[test] = outer[_key(name, cat)] if _key(name, cat) in outer else fit_candidate(name, cat, tr, mode, seed)(te)
        lo[test], hi[test] = interval(
            pick, inner, tr, te, heldout[test], mode, holdout, seed=seed, coverage=coverage, fitted=outer
        )
        # the baselines as every candidate was fitted on this fold (outer_predictions), else fitted here
        med_pred[test] = outer[f"{MEDIAN}:all"] if f"{MEDIAN}:all" in outer else fit_candidate(MEDIAN, "all", tr, mode, seed)(te)
        if baseline:
            id_pred[test] = (
                outer[f"{IDENTITY}:all"] if f"{IDENTITY}:all" in outer else fit_candidate(IDENTITY, "all", tr, mode, seed)(te)
            )
        outer_choices.append(f"{name}:{cat}")
        picks.append((train, test, name, cat))
        say(f"outer fold {i + 1}/{len(folds)}: chose {name}:{cat}, fold MAE {mae(heldout[test], y[test]):.2f}")
    chosen = (blend(scores, y, mode) or best_score(scores, mode)) if scores else None
    if chosen is None:  # no report table: the most frequent outer choice stands for "the selected model"
        top = max(set(outer_choices), key=outer_choices.count)
        chosen = Score(top.rsplit(":", 1)[0], top.rsplit(":", 1)[1], mode, math.nan, None, 0, 0.0)
    # the revealed probes are trained on, never scored: the figures are over the rows each fold tested
    heldout, lo, hi, med_pred, id_pred, ys = (a[scored] for a in (heldout, lo, hi, med_pred, id_pred, y))
    cand_pred = {k: p[scored] for k, p in cand_pred.items()}
    return Evaluation(
        dataset=dataset.name, target=dataset.target_name, mode=mode, rows=len(samples), groups=len(set(dataset.groups)),
        scores=scores, selected=chosen, heldout_pred=heldout, mae=mae(heldout, ys), relative_error=relative_error(heldout, ys),
        baseline_mae=mae(id_pred, ys) if baseline else None, selection_seconds=selection_seconds,
        seconds=time.perf_counter() - t0, outer_choices=outer_choices, actual=ys, holdout=holdout, folds=len(folds),
        median_baseline_mae=mae(med_pred, ys), interval_lo=lo, interval_hi=hi, fold_picks=picks, probes=probes,
        scored_rows=int(scored.sum()), probe_seed=probe_seed, candidate_pred=cand_pred,
    )  # fmt: skip

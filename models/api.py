"""The interface the stream hosts: all models of one environment (GPU model).

The stream calls, per environment:

* ``learn(obs)`` for every labelled observation (``interference_pct`` known);
* ``predict(obs, mode)`` for an observation of a running co-location, in
  ``observed`` mode (percent changes) or ``placement`` mode (solo profiles);
* ``predict_placement(...)`` for what-if questions about a hypothetical job set;
* ``refit_due()``, then ``task = refit_task()`` (a snapshot: a plain function
  the stream runs in an executor), then ``apply_refit(task())`` on the event loop;
* ``leaderboard()`` for the ``models.leaderboard`` record;
* ``save(dir)`` / ``EnvironmentModels.load(dir)`` for local persistence.

Selection (AIP), the same way for every candidate.  The candidates of a mode
are the online learners (river) and the batch models of the last refit, per
category, and two baselines: the last measured interference of this exact job
set (:data:`models.live.LAST_MEASURED`) and the median of recent measurements.
Each labelled observation is first predicted by every candidate, and only then
do the online learners and the baselines learn it (test-then-train); batch
models, which do not learn between refits, are scored on the same
observations in one vectorised pass every ``score_batch_every`` observations
(the same errors, computed later and cheaper).  Errors are kept per regime:

* ``seen``: the job and its co-runners (a *slot*) were measured before.  The
  prequential rolling MAE per environment x mode x category x model, and per
  slot (exponentially weighted) once the slot has ``jobset_min`` measurements.
* ``new``: a slot never measured.  Batch models and the median are judged by
  their grouped-CV error (errors on job sets left out of training); online
  learners by their prequential error on first observations of a slot.

A prediction is served by the candidate with the smallest error of its regime,
says which regime it was in, and is bounded to ``[-100, max_pct]``.  Observed
mode's candidates include placement mode's models (served as
``placement/<model>``): it knows the solo profiles too, so it is never served
worse than placement mode by the error both are judged by.  An ADWIN
detector per mode on the served prediction's error (computed before learning)
requests a refit when it fires.

This module never imports kafka or faust.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from events import CATEGORIES, MODES, PARAMETERS, Leaderboard, LeaderboardEntry, Observation, ServedModel
from models import persist
from models.datasets import Sample
from models.features import observed_features as _observed_features
from models.features import restrict
from models.intervals import ResidualWindow, conformal_offsets
from models.live import BASELINES, LAST_MEASURED, MEDIAN, Baselines, Ewm, clip_pct, median_cv_mae, slot
from models.parallel import Fits
from models.selection import COST_ORDER, cross_validate, grouped_folds
from models.zoo import HEAVY_ONLINE, ONLINE, REFIT_BATCH, RiverModel, load_batch, make_online

PLACEMENT_KEYS = (*PARAMETERS, "M", "throughput")
VIA = "placement"
"""The mode whose models observed mode also weighs (served as ``placement/<model>``, see ``_best``)."""
REGIMES = ("seen", "new")

Key = tuple[str, str, str]
"""(mode, category, model) of one candidate."""
Plan = tuple[str, float, Key, dict[str, float], str, str]
"""How a prediction will be served: regime, error, candidate, features, mode, served name (see ``_plan``)."""
PlacementAsk = tuple[str, Mapping[str, float | None], Sequence[str], Sequence[Mapping[str, float | None]]]
"""A what-if: (job type, its solo profile, the co-runners' job types, their solo profiles)."""


@dataclass(frozen=True)
class PredictionResult:
    interference_pct: float
    model: str
    category: str
    mode: str
    expected_error_pct: float | None
    regime: str = "seen"
    """``seen``: this job set was measured before; ``new``: never, but every type in it was; ``novel``: a type in it
    was never measured here (predicted from its solo profile, placement mode only)."""
    clipped: bool = False
    """The model's output was outside ``[-100, max_pct]`` and was bounded."""
    interval_pct: tuple[float, float] | None = None
    """90 % interval (bounded like the prediction): conformal from the last refit's out-of-fold residuals for a
    batch model or the median on a new job set, else from the candidate's rolling prequential residuals in this
    regime; None until there are enough residuals."""


def profiled(sample: Sample, measured: Iterable[str]) -> bool:
    """Every type of ``sample`` not in ``measured`` comes with a solo profile (some finite value of it).

    >>> profiled(Sample("new", ("old",), 0.0, "", solo={"throughput": 3.0}, co_solos=({},)), {"old"})
    True
    >>> profiled(Sample("new", ("old",), 0.0, "", solo={"throughput": None}, co_solos=({},)), {"old"})
    False
    """
    known = set(measured)
    profiles = ((sample.job_type, sample.solo), *zip(sample.co_job_types, sample.co_solos, strict=False))
    have = {t for t, p in profiles if any(v is not None and math.isfinite(v) for v in p.values())}
    return all(t in known or t in have for t in (sample.job_type, *sample.co_job_types))


def observed_features(obs: Observation, category: str = "all") -> dict[str, float]:
    """Percent changes of the category's parameters (missing ones left out)."""
    return _observed_features({p: obs.pct(p) for p in PARAMETERS}, category)


def sample_of(obs: Observation) -> Sample:
    """The observation as a :class:`models.datasets.Sample` (target NaN when unlabelled)."""
    y = math.nan if obs.interference_pct is None else float(obs.interference_pct)
    co = tuple(obs.co_job_types)
    return Sample(
        obs.job_type, co, y, " + ".join(sorted((obs.job_type, *co))), obs.environment,
        {p: obs.pct(p) for p in PARAMETERS}, dict(obs.solo), tuple(dict(s) for s in obs.co_solo),
    )  # fmt: skip


class RollingMean:
    """Mean of the last ``window`` values (the prequential rolling MAE)."""

    __slots__ = ("_sum", "values", "window")

    def __init__(self, window: int, values: Sequence[float] = ()) -> None:
        self.window = window
        self.values: deque[float] = deque(values, maxlen=window)
        self._sum = float(sum(self.values))

    def update(self, v: float) -> None:
        if len(self.values) == self.window:
            self._sum -= self.values[0]
        self.values.append(v)
        self._sum += v

    @property
    def n(self) -> int:
        return len(self.values)

    def get(self) -> float | None:
        return self._sum / len(self.values) if self.values else None


@dataclass
class Config:
    window: int = 200
    """Rolling window of the prequential MAE (observations)."""
    min_samples: int = 10
    """A candidate competes in a regime once it has this many scored predictions there."""
    heavy_stride: int = 12
    """Each heavy online learner (KNN, Hoeffding tree, AMF) x mode x category learns every ``heavy_stride``-th
    observation, staggered so that about two heavy updates happen per observation."""
    score_batch_every: int = 256
    """Observations scored by the batch candidates in one vectorised pass (and at every refit and save)."""
    max_pct: float = 1000.0
    """Predictions are bounded to ``[-100, max_pct]``; bounded ones are counted."""
    predict_novel: bool = True
    """A job type never measured here but with a solo profile is predicted from the profile (placement mode,
    ``regime`` ``novel``, interval widened: :meth:`EnvironmentModels._novel_interval`); False: withheld, as
    before issue 25."""
    refit_every: int = 500
    """Observations between periodic refits."""
    refit_min_rows: int = 30
    refit_rows: int = 10_000
    """A refit uses the most recent ``refit_rows`` labelled observations: the final fits use all of them
    (batch models fit the distinct feature rows, weighted by their copies)."""
    refit_cv_rows: int | None = 2_000
    """Cross-validation trains on a group-stratified subsample of this many rows in a mode whose refit rows hold
    more distinct feature rows than that (observed mode); every row is still scored out of fold.  None: no cap."""
    final_fits: int | None = 3
    """Per mode x category, the refit fits on all rows the ``final_fits`` batch models with the smallest CV
    error: they are the batch candidates until the next refit (up to 12 per mode).  None: every batch model.
    CV error only decides which models are fitted, not which is served.  Measured on 10,000 observations:
    3 instead of 1 made the refit 4.2 -> 5.9 s (median of 3 alternating runs, 2 workers)."""
    history: int = 10_000
    folds: int = 3
    workers: int | None = None
    """Processes a refit spreads its fits over (:mod:`models.parallel`, one pool per process); None: all cores."""
    pool_min_rows: int = 2_000
    """Refits of fewer observations run in-process (the pool would cost more than it saves)."""
    pool_timeout_s: float = 300.0
    """A pool fit not done by then (joblib's per-task timeout) abandons the pool (workers killed); the batch runs in-process."""
    jobset_min: int = 20
    """Measurements of one slot (job and co-runners) before it gets its own selection."""
    jobset_window: int = 50
    """Span of the per-slot exponentially weighted errors."""
    max_jobsets: int = 2000
    """Slots that keep their own errors (the first ones measured)."""
    baseline_span: int = 3
    """Span of the last-measured baseline's exponentially weighted mean."""
    median_window: int = 1000
    """Measurements in the median baseline's rolling window."""
    batch_models: tuple[str, ...] = REFIT_BATCH
    online_models: tuple[str, ...] = tuple(ONLINE)


@dataclass
class RefitResult:
    """What a refit computed off the event loop; applied by :meth:`EnvironmentModels.apply_refit`."""

    scores: dict[Key, tuple[float, float | None, int]]
    """Grouped-CV (MAE, relative error, rows) per candidate: every batch model, and the median baseline."""
    fitted: dict[Key, Any]
    """The batch candidates: per mode x category the ``final_fits`` best by CV, fitted on every row."""
    seconds: float
    rows: int
    """Rows of the refit: the final fits use all of them."""
    cv_rows: dict[str, int] = field(default_factory=dict)
    """Per mode, the rows cross-validation trained on (``refit_cv_rows`` when capped, else ``rows``)."""
    pool_fallbacks: int = 0
    """Batches of fits that ran in-process because a pool worker died or the pool timed out."""
    intervals: dict[Key, tuple[float, float]] = field(default_factory=dict)
    """Conformal 90 % offsets (lo, hi) from the out-of-fold residuals of every batch model and the median."""
    finished_at: float = field(default_factory=time.time)


def best_by_cv(scores: Mapping[Key, tuple[float, float | None, int]], keep: int | None, models: Iterable[str]) -> list[Key]:
    """Per mode x category, the ``keep`` batch models (all when None) with the smallest finite CV MAE.

    >>> s = {("m", "1", "a"): (3.0, None, 1), ("m", "1", "b"): (1.0, None, 1), ("m", "1", "c"): (math.nan, None, 1)}
    >>> best_by_cv(s, 1, ["a", "b", "c"])
    [('m', '1', 'b')]
    """
    allowed = set(models)
    groups: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for (mode, cat, name), (mae, _, _) in scores.items():
        if name in allowed and math.isfinite(mae):
            groups.setdefault((mode, cat), []).append((mae, name))
    out = []
    for (mode, cat), ranked in sorted(groups.items()):
        out.extend((mode, cat, name) for _, name in sorted(ranked)[:keep])
    return out


def run_refit(samples: Sequence[Sample], config: Config, seed: int) -> RefitResult:
    """Grouped CV of every batch model x category x mode (and of the median), then fit the best on all rows.

    The fits run on ``config.workers`` processes (:mod:`models.parallel`); the call stays a plain function."""
    from models.selection import feature_frames, final_fit

    t0 = time.perf_counter()
    modes = [m for m in MODES if any(s.features(m, "all") for s in samples[:50])]
    frames = {mode: feature_frames(samples, mode) for mode in modes}
    workers = config.workers if len(samples) >= config.pool_min_rows else 1
    with Fits(workers, config.pool_timeout_s) as fits:
        cv = cross_validate(
            samples, modes, models=config.batch_models, k=config.folds, seed=seed, fits=fits,
            max_rows=config.refit_cv_rows, frames=frames,
        )  # fmt: skip
        scores: dict[Key, tuple[float, float | None, int]] = {
            (s.mode, s.category, s.model): (s.mae, s.relative_error, s.samples) for s in cv
        }
        keys = best_by_cv(scores, config.final_fits, config.batch_models)
        calls = [(mode, cat, sorted(str(c) for c in frames[mode][cat].columns), name, seed) for mode, cat, name in keys]
        calls.sort(key=lambda c: COST_ORDER.index(c[3]) if c[3] in COST_ORDER else len(COST_ORDER))
        fitted = fits.run(final_fit, calls)
    folds = grouped_folds([s.group for s in samples], config.folds, seed)
    if folds:
        med = median_cv_mae([s.target for s in samples], folds)
        for mode in modes:
            scores[(mode, "all", MEDIAN)] = (med, None, len(samples))
    cv_rows = {mode: max((s.trained for s in cv if s.mode == mode), default=0) for mode in modes}
    y = np.array([s.target for s in samples], dtype=float)
    intervals = {(s.mode, s.category, s.model): conformal_offsets(y - s.oof) for s in cv if len(s.oof) == len(y)}
    if folds:
        med_oof = np.zeros(len(y))
        for train, test in folds:
            med_oof[test] = np.median(y[train])
        for mode in modes:
            intervals[(mode, "all", MEDIAN)] = conformal_offsets(y - med_oof)
    return RefitResult(
        scores, {(c[0], c[1], c[3]): m for c, m in zip(calls, fitted, strict=True)},
        time.perf_counter() - t0, len(samples), cv_rows, fits.fallbacks,
        {k: v for k, v in intervals.items() if math.isfinite(v[0]) and math.isfinite(v[1])},
    )  # fmt: skip


class Views:
    """A sample's features per mode and category, each computed on first use (a what-if needs one of eight)."""

    __slots__ = ("_cats", "_full", "sample")

    def __init__(self, sample: Sample) -> None:
        self.sample = sample
        self._full: dict[str, dict[str, float]] = {}
        self._cats: dict[tuple[str, str], dict[str, float]] = {}

    def full(self, mode: str) -> dict[str, float]:
        """Every feature of ``mode`` (empty when the sample has none: no percent changes, no solo profile)."""
        f = self._full.get(mode)
        if f is None:
            f = self._full[mode] = self.sample.features(mode, "all")
        return f

    def get(self, mode: str, category: str) -> dict[str, float]:
        x = self._cats.get((mode, category))
        if x is None:
            full = self.full(mode)
            x = self._cats[(mode, category)] = full if category == "all" or not full else restrict(full, category)
        return x


@dataclass
class _Pending:
    """A labelled observation waiting for the batch candidates' vectorised scoring."""

    views: Views
    target: float
    slot: str
    seen: bool


class EnvironmentModels:
    """The AIP selector of one environment: candidates, prequential scoring, selection, refits, drift, persistence."""

    def __init__(self, environment: str, *, seed: int = 0, config: Config | None = None) -> None:
        self.environment = environment
        self.seed = seed
        self.config = config or Config()
        self.observations = 0
        self.last_refit: float | None = None
        self.selection_seconds: float | None = None
        self.refit_seconds: float | None = None
        self.refits = 0
        self.drift_events = 0
        self.clipped = 0
        """Served predictions that were bounded to ``[-100, max_pct]``."""
        self.withheld_novel = 0
        self.served_novel = 0
        """Predictions not made because a job type of the slot was never measured here (see :meth:`predict`)."""
        self.history: deque[Sample] = deque(maxlen=self.config.history)
        self._since_refit = 0
        self._drift = False
        self._refit_in_flight = False
        self._online: dict[Key, RiverModel] = {}
        for mode in MODES:
            for cat in CATEGORIES:
                for name in self.config.online_models:
                    self._online[(mode, cat, name)] = make_online(name, seed)
        self._heavy = [key for key in self._online if key[2] in HEAVY_ONLINE]
        self._light = [key for key in self._online if key[2] not in HEAVY_ONLINE]
        self._batch: dict[Key, Any] = {}
        self._cv: dict[Key, tuple[float, float | None, int]] = {}
        self.baselines = Baselines(self.config.baseline_span, self.config.median_window)
        self._errors: dict[str, dict[Key, RollingMean]] = {regime: {} for regime in REGIMES}
        self._residuals: dict[str, dict[Key, ResidualWindow]] = {regime: {} for regime in REGIMES}
        """Per regime, each candidate's last ``window`` prequential residuals (its online interval)."""
        self._intervals: dict[Key, tuple[float, float]] = {}
        """Conformal offsets of the batch candidates and the median from the last refit's out-of-fold residuals."""
        self._slot_errors: dict[str, dict[Key, Ewm]] = {}
        self._pending: list[_Pending] = []
        self._selected: dict[str, dict[str, tuple[float, str, str]]] = {regime: {} for regime in REGIMES}
        self._stale = set(REGIMES)
        """Regimes whose errors changed since their last selection (``new`` changes rarely: first observations
        of a slot and refits)."""
        self._drift_detectors = {mode: self._new_detector() for mode in MODES}

    @staticmethod
    def _new_detector() -> Any:
        from river import drift

        return drift.ADWIN(delta=0.002, clock=16)

    # ------------------------------------------------------------------ scoring

    def _score(self, key: Key, residual: float, seen: bool, slot_errors: dict[Key, Ewm] | None) -> None:
        """Record one prequential ``residual`` (measured - predicted) of a candidate: its error, and its residual
        for the candidate's interval in this regime."""
        regime, error = ("seen" if seen else "new"), abs(residual)
        self._stale.add(regime)
        r = self._errors[regime].get(key)
        if r is None:
            r = self._errors[regime][key] = RollingMean(self.config.window)
        r.update(error)
        w = self._residuals[regime].get(key)
        if w is None:
            w = self._residuals[regime][key] = ResidualWindow(self.config.window)
        w.update(residual)
        if seen and slot_errors is not None:
            e = slot_errors.get(key)
            if e is None:
                e = slot_errors[key] = Ewm()
            e.update(error, 2.0 / (self.config.jobset_window + 1.0))

    def _slot_errors_for(self, key: str) -> dict[Key, Ewm] | None:
        errs = self._slot_errors.get(key)
        if errs is None and len(self._slot_errors) < self.config.max_jobsets:
            errs = self._slot_errors[key] = {}
        return errs

    def learn(self, obs: Observation) -> None:
        """Test-then-train: every candidate predicts ``obs``, is scored, then learners learn it.  No-op when unlabelled."""
        if obs.interference_pct is None or not math.isfinite(obs.interference_pct):
            return
        self.learn_sample(sample_of(obs))

    def learn_sample(self, sample: Sample) -> None:
        y = sample.target
        views = Views(sample)
        key = slot(sample.job_type, sample.co_job_types)
        seen = self.baselines.measured(key) > 0
        slot_errors = self._slot_errors_for(key) if seen else None
        max_pct = self.config.max_pct
        # drift: the error of what predict() serves for this sample, before anything learns it
        for served in self._predict_many([(views, key, mode) for mode in MODES]):
            if served is not None:
                det = self._drift_detectors[served.mode]
                before = det.estimation
                det.update(abs(served.interference_pct - y))
                if det.drift_detected and det.estimation > before:  # the error rose (a fall is learning, not drift)
                    self._drift = True
                    self.drift_events += 1
        for name in BASELINES:
            pred = self.baselines.predict(name, key)
            if pred is not None:
                err = y - clip_pct(pred, max_pct)[0]
                for mode in MODES:
                    if views.full(mode):
                        self._score((mode, "all", name), err, seen, slot_errors)
        n = self.observations
        stride = max(1, self.config.heavy_stride)
        due = self._light + [k for i, k in enumerate(self._heavy) if (n + i) % stride == 0]
        for k in due:
            x = views.get(k[0], k[1])
            if not x:
                continue
            learner = self._online[k]
            if learner.n:
                self._score(k, y - clip_pct(learner.predict_one(x), max_pct)[0], seen, slot_errors)
            learner.learn_one(x, y)
        self.baselines.update(key, y, (sample.job_type, *sample.co_job_types))
        if self._batch:
            self._pending.append(_Pending(views, y, key, seen))
            if len(self._pending) >= self.config.score_batch_every:
                self.score_pending()
        self.observations += 1
        self._since_refit += 1
        self.history.append(sample)
        self._select()

    def score_pending(self) -> int:
        """Score the batch candidates on the observations that arrived since the last pass; return how many.

        Batch models do not learn between refits, so predicting an observation now gives what it would
        have given on arrival: the prequential error, in one vectorised call per candidate."""
        import pandas as pd

        pending, self._pending = self._pending, []
        if not pending or not self._batch:
            return 0
        max_pct = self.config.max_pct
        slot_errors = [self._slot_errors_for(p.slot) if p.seen else None for p in pending]
        for mode in MODES:
            rows = [i for i, p in enumerate(pending) if p.views.full(mode)]
            if not rows:
                continue
            frame = pd.DataFrame([pending[i].views.full(mode) for i in rows])
            for k, model in self._batch.items():
                if k[0] != mode:
                    continue
                use = [j for j, i in enumerate(rows) if pending[i].views.get(mode, k[1])]
                if not use:
                    continue
                preds = np.asarray(model.predict(frame.iloc[use] if len(use) < len(rows) else frame), dtype=float)
                for j, pred in zip(use, preds, strict=True):
                    p = pending[rows[j]]
                    self._score(k, p.target - clip_pct(float(pred), max_pct)[0], p.seen, slot_errors[rows[j]])
        self._select()
        return len(pending)

    # ------------------------------------------------------------------ selection

    def _error(self, regime: str, key: Key) -> float | None:
        """The error a candidate is judged by in ``regime`` (None: not enough evidence yet)."""
        if regime == "new" and key in self._cv:
            mae = self._cv[key][0]
            return mae if math.isfinite(mae) else None
        r = self._errors[regime].get(key)
        if r is None or r.n < self.config.min_samples:
            return None
        return r.get()

    def _candidates(self, mode: str) -> list[Key]:
        keys = [k for k in self._online if k[0] == mode]
        keys += [k for k in self._batch if k[0] == mode]
        keys += [(mode, "all", name) for name in BASELINES]
        return keys

    def _best(self, regime: str, mode: str, cat: str | None = None, *, wider: bool = False) -> tuple[float, str, str] | None:
        """The (error, category, model) with the smallest error of ``mode``'s candidates in ``regime``.  ``wider``:
        observed mode also weighs placement mode's models (named ``placement/<model>``): the solo profiles are part
        of what it knows about a running co-location, so what it serves is never judged worse than placement's."""
        best: tuple[float, str, str] | None = None
        keys = self._candidates(mode)
        if wider and mode == "observed":
            keys += [k for k in self._candidates(VIA) if k[2] not in BASELINES]
        for key in keys:
            if (cat is not None and key[1] != cat) or (regime == "new" and key[2] == LAST_MEASURED):
                continue
            e = self._error(regime, key)
            name = key[2] if key[0] == mode else f"{key[0]}/{key[2]}"
            if e is not None and (best is None or (e, key[1], name) < best):
                best = (e, key[1], name)
        return best

    def _select(self) -> None:
        """Per regime and mode, the (error, category, model) with the smallest error."""
        t0 = time.perf_counter()
        for regime in REGIMES:
            if regime not in self._stale:
                continue
            self._stale.discard(regime)
            for mode in MODES:
                best = self._best(regime, mode, wider=True)
                if best is not None:
                    self._selected[regime][mode] = best
                else:
                    self._selected[regime].pop(mode, None)
        self.selection_seconds = time.perf_counter() - t0

    def _choice(self, mode: str, key: str) -> tuple[str, tuple[float, str, str]] | None:
        """(regime, (error, category, model)) serving ``key`` (a :func:`models.live.slot`) in ``mode``."""
        if self.baselines.measured(key) == 0:
            choice = self._selected["new"].get(mode)
            if choice is None:  # nothing judged on new job sets yet: the median (never the last measurement)
                choice = (math.nan, "all", MEDIAN) if self.baselines.labels else None
            return None if choice is None else ("new", choice)
        if self.baselines.measured(key) >= self.config.jobset_min:
            best: tuple[float, str, str] | None = None
            for k, e in self._slot_errors.get(key, {}).items():
                wider = mode == "observed" and k[0] == VIA and k[2] not in BASELINES
                ok = (k[0] == mode or wider) and e.n >= self.config.min_samples and self._can_serve(k)
                name = f"{VIA}/{k[2]}" if wider else k[2]
                if ok and (best is None or (e.mean, k[1], name) < best):
                    best = (e.mean, k[1], name)
            if best is not None:
                return "seen", best
        choice = self._selected["seen"].get(mode)
        if choice is None:
            choice = (math.nan, "all", LAST_MEASURED)
        return "seen", choice

    def _can_serve(self, key: Key) -> bool:
        return key in self._online or key in self._batch or key[2] in BASELINES

    def _plan(self, views: Views, key: str, mode: str) -> Plan | None:
        """(regime, error, candidate, features, mode, served name) serving ``views`` of slot ``key`` in ``mode``;
        None: nothing to serve."""
        if self.observations == 0 or mode not in MODES or not views.full(mode):
            return None
        novel = self.baselines.novel((views.sample.job_type, *views.sample.co_job_types))
        if novel and not (self.config.predict_novel and mode == VIA and profiled(views.sample, self.baselines.types)):
            return None  # a job type never measured here and no solo profile of it: nothing carries over (docs/MODELS.md)
        choice = self._choice(mode, key)
        if choice is None:
            return None
        regime, (err, cat, name) = choice
        regime = "novel" if novel else regime
        src, _, model = name.rpartition("/")  # "placement/<model>": observed mode serving placement's model
        cand = (src or mode, cat, model)
        x = {} if model in BASELINES else views.get(cand[0], cat)
        if model not in BASELINES and not x:
            return None
        return regime, err, cand, x, mode, name

    def _predict_many(self, asks: Sequence[tuple[Views, str, str]]) -> list[PredictionResult | None]:
        """Each (views, slot, mode) predicted by the candidate serving it; the rows of one batch candidate are one
        matrix and one ``predict`` (the what-if entries of a GPU window)."""
        plans = [self._plan(*ask) for ask in asks]
        raw: list[float | None] = [None] * len(plans)
        rows: dict[Key, list[tuple[int, dict[str, float]]]] = {}
        for i, plan in enumerate(plans):
            if plan is None:
                continue
            cand = plan[2]
            if cand[2] in BASELINES:
                raw[i] = self.baselines.predict(cand[2], asks[i][1])
            elif cand in self._online:
                raw[i] = self._online[cand].predict_one(plan[3])
            else:
                rows.setdefault(cand, []).append((i, plan[3]))
        for cand, items in rows.items():
            preds = self._batch[cand].predict_rows([x for _, x in items])
            for (i, _), v in zip(items, preds, strict=True):
                raw[i] = float(v)
        return [None if p is None or r is None else self._result(p, r) for p, r in zip(plans, raw, strict=True)]

    def _result(self, plan: Plan, raw: float) -> PredictionResult:
        regime, err, cand, _, mode, name = plan
        value, extrapolated = float(raw), False
        if regime == "new" and self.baselines.labels and not self.baselines.lo <= value <= self.baselines.hi:
            # a job set never measured, predicted outside every slowdown measured here: extrapolation
            value, extrapolated = min(max(value, self.baselines.lo), self.baselines.hi), True
        value, clipped = clip_pct(value, self.config.max_pct)
        clipped = clipped or extrapolated
        interval = self._novel_interval(cand, value) if regime == "novel" else self._interval(regime, cand, value)
        return PredictionResult(value, name, cand[1], mode, None if math.isnan(err) else float(err), regime, clipped, interval)

    def _interval(self, regime: str, key: Key, value: float) -> tuple[float, float] | None:
        """``value``'s 90 % interval from ``key``'s residuals in ``regime`` (see :attr:`PredictionResult.interval_pct`)."""
        offsets = self._intervals.get(key) if regime == "new" else None
        if offsets is None:
            w = self._residuals[regime].get(key)
            offsets = w.offsets() if w is not None and w.n >= self.config.min_samples else None
        if offsets is None:
            return None
        lo, hi = clip_pct(value + offsets[0], self.config.max_pct)[0], clip_pct(value + offsets[1], self.config.max_pct)[0]
        return (min(lo, value), max(hi, value))

    def _novel_interval(self, key: Key, value: float) -> tuple[float, float] | None:
        """A novel type's interval: the new-job-set interval of ``key`` widened to at least the spread of every
        slowdown measured here around their median (the last refit's out-of-fold residuals of the median): what is
        measured of other types bounds nothing about this one."""
        own = self._interval("new", key, value)
        med = self._intervals.get((key[0], "all", MEDIAN))
        if med is None:
            return own
        lo = clip_pct(value + med[0], self.config.max_pct)[0]
        hi = clip_pct(value + med[1], self.config.max_pct)[0]
        return (min(lo, value), max(hi, value)) if own is None else (min(own[0], lo, value), max(own[1], hi, value))

    def _predict_samples(self, asks: Sequence[tuple[Sample, str]]) -> list[PredictionResult | None]:
        results = self._predict_many([(Views(s), slot(s.job_type, s.co_job_types), mode) for s, mode in asks])
        self.clipped += sum(1 for r in results if r is not None and r.clipped)
        if self.observations:
            self.withheld_novel += sum(
                1 for r, (s, _) in zip(results, asks, strict=True) if r is None and self.baselines.novel((s.job_type, *s.co_job_types))
            )
            self.served_novel += sum(1 for r in results if r is not None and r.regime == "novel")
        return results

    def _predict_sample(self, sample: Sample, mode: str) -> PredictionResult | None:
        return self._predict_samples([(sample, mode)])[0]

    def predict(self, obs: Observation, mode: str) -> PredictionResult | None:
        """The selected model's prediction for ``obs``.  None before any labelled observation, and where the job
        or a co-runner is of a type never measured in this environment (a *novel* type: its solo profile may be
        known, but no candidate has seen it share a GPU; a scheduler ranks such GPUs by load instead)."""
        return self._predict_sample(sample_of(obs), mode)

    def predict_placement(
        self,
        job_type: str,
        job_solo: Mapping[str, float | None],
        co_job_types: Sequence[str],
        co_solos: Sequence[Mapping[str, float | None]],
    ) -> PredictionResult | None:
        """What-if: the slowdown of ``job_type`` if co-located with ``co_job_types``."""
        return self.predict_placements([(job_type, job_solo, co_job_types, co_solos)])[0]

    def predict_placements(self, asks: Sequence[PlacementAsk]) -> list[PredictionResult | None]:
        """:meth:`predict_placement` of each (job type, solo profile, co-runners' types, their solo profiles), in
        one ``predict`` per batch candidate."""
        samples = [
            Sample(jt, tuple(co), math.nan, "", self.environment, {}, dict(solo), tuple(co_solos))
            for jt, solo, co, co_solos in asks
        ]  # fmt: skip
        return self._predict_samples([(s, "placement") for s in samples])

    # ------------------------------------------------------------------ refits

    def refit_due(self) -> bool:
        if self._refit_in_flight or len(self.history) < self.config.refit_min_rows:
            return False
        if len({s.job_set for s in list(self.history)[-self.config.refit_rows :]}) < 2:
            return False
        return self._drift or self.last_refit is None or self._since_refit >= self.config.refit_every

    def refit_task(self) -> Callable[[], RefitResult]:
        """A snapshot of the recent history; the returned function touches no live state."""
        rows = list(self.history)[-self.config.refit_rows :]
        config, seed = self.config, self.seed
        self._refit_in_flight = True
        return lambda: run_refit(rows, config, seed)

    def apply_refit(self, result: RefitResult | None) -> None:
        self._refit_in_flight = False
        if result is None:
            return
        self.score_pending()  # what arrived during the refit is scored by the models it was predicted with
        self._batch = dict(result.fitted)
        self._cv = dict(result.scores)
        self._stale.update(REGIMES)  # other candidates, other CV errors
        self._intervals = dict(result.intervals)
        self.last_refit = result.finished_at
        self.refit_seconds = result.seconds
        self.refits += 1
        self._since_refit = 0
        self._drift = False
        self._drift_detectors = {mode: self._new_detector() for mode in MODES}
        self._select()

    def refit_now(self) -> RefitResult:
        """Refit synchronously (offline use and tests)."""
        result = self.refit_task()()
        self.apply_refit(result)
        return result

    # ------------------------------------------------------------------ reporting

    def served(self) -> list[ServedModel]:
        """What each mode serves, per regime, with the error it is judged by."""
        out = []
        for regime in REGIMES:
            for mode in MODES:
                c = self._selected[regime].get(mode)
                if c is not None:
                    out.append(ServedModel(mode=mode, regime=regime, model=c[2], category=c[1], error_pct=c[0]))
        return out

    def selected(self) -> dict[str, str]:
        """``"<mode>:<category>"`` -> the candidate with the smallest error on measured job sets."""
        out = {}
        for mode in MODES:
            for cat in CATEGORIES:
                b = self._best("seen", mode, cat)
                if b is not None:
                    out[f"{mode}:{cat}"] = b[2]
        return out

    def leaderboard(self) -> Leaderboard:
        entries = []
        live = set(self._online) | set(self._batch) | set(self._cv)
        keys = sorted(k for k in set(self._errors["seen"]) | set(self._errors["new"]) | live if k in live or k[2] in BASELINES)
        for key in keys:
            mode, cat, name = key
            seen, new, cv = self._errors["seen"].get(key), self._errors["new"].get(key), self._cv.get(key)
            kind = "baseline" if name in BASELINES else "online" if key in self._online else "batch"
            entries.append(
                LeaderboardEntry(
                    model=name, category=cat, mode=mode, kind=kind,
                    samples=seen.n if seen else 0, mae=seen.get() if seen else None,
                    relative_error=cv[1] if cv else None,
                    cv_mae=cv[0] if cv and math.isfinite(cv[0]) else None, cv_samples=cv[2] if cv else None,
                    new_mae=new.get() if new else None, new_samples=new.n if new else None,
                )
            )  # fmt: skip
        return Leaderboard(
            ts=time.time(), environment=self.environment, entries=entries, selected=self.selected(),
            observations=self.observations, last_refit=self.last_refit, selection_seconds=self.selection_seconds,
            served=self.served(),
        )  # fmt: skip

    # ------------------------------------------------------------------ persistence

    def save(self, directory: Path, *, key_dir: Path | None = None) -> None:
        """Write everything to ``directory``; river files are signed with the key in ``key_dir``
        (default: ``directory``'s parent, the state directory)."""
        directory = Path(directory)
        key = persist.state_key(Path(key_dir) if key_dir else directory.parent)
        directory.mkdir(parents=True, exist_ok=True)
        self.score_pending()
        for i, (_, model) in enumerate(self._online.items()):
            model.save(directory / "online" / f"{i}.pkl", key)
        batch_index = []
        for i, ((mode, cat, name), model) in enumerate(self._batch.items()):
            model.save(directory / "batch" / str(i))
            batch_index.append([mode, cat, name, str(i)])
        state = {
            "environment": self.environment,
            "seed": self.seed,
            "config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.config).items()},
            "observations": self.observations,
            "last_refit": self.last_refit,
            "refit_seconds": self.refit_seconds,
            "refits": self.refits,
            "since_refit": self._since_refit,
            "clipped": self.clipped,
            "online": [list(k) for k in self._online],
            "errors": {regime: [[*k, list(r.values)] for k, r in d.items()] for regime, d in self._errors.items()},
            "residuals": {regime: [[*k, list(r.values)] for k, r in d.items()] for regime, d in self._residuals.items()},
            "intervals": [[*k, *v] for k, v in self._intervals.items()],
            "batch": batch_index,
            "cv": [[*k, *v] for k, v in self._cv.items()],
            "baselines": self.baselines.to_json(),
            "slot_errors": {s: [[*k, e.mean, e.n] for k, e in d.items()] for s, d in self._slot_errors.items()},
            "history": [_sample_json(s) for s in list(self.history)[-self.config.refit_rows :]],
        }
        (directory / "state.json").write_text(json.dumps(state))

    @classmethod
    def load(cls, directory: Path, *, key_dir: Path | None = None) -> EnvironmentModels:
        """Resume from :meth:`save`; raises :class:`models.persist.SignatureError` on a file this state dir did not sign."""
        directory = Path(directory)
        key = persist.state_key(Path(key_dir) if key_dir else directory.parent)
        state = json.loads((directory / "state.json").read_text())
        known = {f for f in Config.__dataclass_fields__}
        cfg = {k: v for k, v in state["config"].items() if k in known}
        cfg["batch_models"] = tuple(cfg["batch_models"])
        cfg["online_models"] = tuple(cfg["online_models"])
        self = cls(state["environment"], seed=int(state["seed"]), config=Config(**cfg))
        self.observations = int(state["observations"])
        self.last_refit, self.refit_seconds = state["last_refit"], state["refit_seconds"]
        self.refits, self._since_refit = int(state["refits"]), int(state["since_refit"])
        self.clipped = int(state.get("clipped", 0))
        for i, k in enumerate(state["online"]):
            self._online[(k[0], k[1], k[2])] = RiverModel.load(directory / "online" / f"{i}.pkl", key)
        w = self.config.window
        self._errors = {regime: {(m, c, n): RollingMean(w, v) for m, c, n, v in rows} for regime, rows in state["errors"].items()}
        residuals = state.get("residuals", {})  # state saved before intervals: none until scored again
        self._residuals = {r: {(m, c, n): ResidualWindow(w, v) for m, c, n, v in residuals.get(r, [])} for r in REGIMES}
        self._intervals = {(m, c, n): (lo, hi) for m, c, n, lo, hi in state.get("intervals", [])}
        for mode, cat, name, sub in state["batch"]:
            self._batch[(mode, cat, name)] = load_batch(directory / "batch" / sub)
        self._cv = {(m, c, n): (e, rel, cnt) for m, c, n, e, rel, cnt in state["cv"]}
        self.baselines = Baselines.from_json(state["baselines"], self.config.median_window)
        self._slot_errors = {s: {(m, c, n): Ewm(e, cnt) for m, c, n, e, cnt in d} for s, d in state["slot_errors"].items()}
        self.history.extend(_sample_from_json(d) for d in state["history"])
        self._select()
        return self


def _sample_json(s: Sample) -> dict[str, Any]:
    return {
        "job_type": s.job_type, "co_job_types": list(s.co_job_types), "target": s.target, "group": s.group,
        "environment": s.environment, "pcts": dict(s.pcts), "solo": dict(s.solo), "co_solos": [dict(c) for c in s.co_solos],
    }  # fmt: skip


def _sample_from_json(d: Mapping[str, Any]) -> Sample:
    return Sample(
        d["job_type"], tuple(d["co_job_types"]), float(d["target"]), d["group"], d["environment"],
        d["pcts"], d["solo"], tuple(d["co_solos"]),
    )  # fmt: skip

"""The interface the stream hosts: all models of one environment (GPU model).

The stream calls, per environment:

* ``learn(obs)`` for every labelled observation (``interference_pct`` known);
  online learners update prequentially (predict, score, then learn);
* ``predict(obs, mode)`` for an observation of a running co-location, in
  ``observed`` mode (percent changes) or ``placement`` mode (solo profiles);
* ``predict_placement(...)`` for what-if questions about a hypothetical job set;
* ``refit_due()``, then ``task = refit_task()`` (a snapshot: a plain function
  the stream runs in an executor), then ``apply_refit(task())`` on the event loop;
* ``leaderboard()`` for the ``models.leaderboard`` record;
* ``save(dir)`` / ``EnvironmentModels.load(dir)`` for local persistence.

Selection (AIP): for every mode x category, each model's error is kept --
prequential rolling MAE for online learners, grouped cross-validation MAE for
batch models -- and the smallest wins; a prediction uses the best category of
its mode.  A job set with at least ``jobset_min`` observations gets its own
choice (online: its own rolling errors; batch: the out-of-fold errors of its
rows), else it falls back to the environment's.  An ADWIN detector on the
served model's error requests a refit when it fires.

This module never imports kafka or faust.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from events import CATEGORIES, MODES, PARAMETERS, Leaderboard, LeaderboardEntry, Observation
from models import persist
from models.datasets import Sample
from models.features import observed_features as _observed_features
from models.features import restrict
from models.parallel import Fits
from models.selection import COST_ORDER, cross_validate
from models.zoo import HEAVY_ONLINE, ONLINE, REFIT_BATCH, RiverModel, load_batch, make_online

PLACEMENT_KEYS = (*PARAMETERS, "M", "throughput")


@dataclass(frozen=True)
class PredictionResult:
    interference_pct: float
    model: str
    category: str
    mode: str
    expected_error_pct: float | None


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
    """An online learner competes once it has this many scored predictions."""
    heavy_stride: int = 12
    """Each heavy online learner (KNN, Hoeffding tree, AMF) x mode x category learns every ``heavy_stride``-th
    observation, staggered so that about two heavy updates happen per observation."""
    refit_every: int = 500
    """Observations between periodic refits."""
    refit_min_rows: int = 30
    refit_rows: int = 10_000
    """A refit uses the most recent ``refit_rows`` labelled observations: the final fit of each selected model
    uses all of them (batch models fit the distinct feature rows, weighted by their copies)."""
    refit_cv_rows: int | None = 2_000
    """Cross-validation trains on a group-stratified subsample of this many rows in a mode whose refit rows hold
    more distinct feature rows than that (observed mode); every row is still scored out of fold.  None: no cap."""
    history: int = 10_000
    folds: int = 3
    workers: int | None = None
    """Processes a refit spreads its fits over (:mod:`models.parallel`, one pool per process); None: all cores."""
    pool_min_rows: int = 2_000
    """Refits of fewer observations run in-process (the pool would cost more than it saves)."""
    pool_timeout_s: float = 300.0
    """A batch of pool fits not done by then is abandoned (pool killed) and run in-process."""
    jobset_min: int = 20
    """Observations of one job set before it gets its own selection."""
    jobset_window: int = 50
    max_jobsets: int = 2000
    batch_models: tuple[str, ...] = REFIT_BATCH
    online_models: tuple[str, ...] = tuple(ONLINE)


@dataclass
class RefitResult:
    """What a refit computed off the event loop; applied by :meth:`EnvironmentModels.apply_refit`."""

    scores: dict[tuple[str, str, str], tuple[float, float | None, int]]
    selected: dict[tuple[str, str], tuple[str, Any]]
    jobset_errors: dict[str, dict[tuple[str, str, str], tuple[float, int]]]
    seconds: float
    rows: int
    """Rows of the refit: the final fits use all of them."""
    cv_rows: dict[str, int] = field(default_factory=dict)
    """Per mode, the rows cross-validation trained on (``refit_cv_rows`` when capped, else ``rows``)."""
    pool_fallbacks: int = 0
    """Batches of fits that ran in-process because a pool worker died or the pool timed out."""
    finished_at: float = field(default_factory=time.time)


def run_refit(samples: Sequence[Sample], config: Config, seed: int) -> RefitResult:
    """Grouped CV of every batch model x category x mode, then fit the best per mode x category on all rows.

    The fits run on ``config.workers`` processes (:mod:`models.parallel`); the call stays a plain function."""
    from models.selection import feature_frames, final_fit

    t0 = time.perf_counter()
    modes = [m for m in MODES if any(s.features(m, "all") for s in samples[:50])]
    frames = {mode: feature_frames(samples, mode) for mode in modes}
    workers = config.workers if len(samples) >= config.pool_min_rows else 1
    with Fits(workers, config.pool_timeout_s) as fits:
        scores = cross_validate(
            samples, modes, models=config.batch_models, k=config.folds, seed=seed, fits=fits,
            max_rows=config.refit_cv_rows, frames=frames,
        )  # fmt: skip
        table = {(s.mode, s.category, s.model): (s.mae, s.relative_error, s.samples) for s in scores}
        best: dict[tuple[str, str], tuple[float, str]] = {}
        for s in scores:
            if math.isfinite(s.mae) and ((s.mode, s.category) not in best or s.mae < best[(s.mode, s.category)][0]):
                best[(s.mode, s.category)] = (s.mae, s.model)
        calls = [
            (mode, cat, sorted(str(c) for c in frames[mode][cat].columns), name, seed) for (mode, cat), (_, name) in best.items()
        ]
        calls.sort(key=lambda c: COST_ORDER.index(c[3]) if c[3] in COST_ORDER else len(COST_ORDER))
        fitted = fits.run(final_fit, calls)
    selected: dict[tuple[str, str], tuple[str, Any]] = {(c[0], c[1]): (c[3], m) for c, m in zip(calls, fitted, strict=True)}
    yarr = np.asarray([s.target for s in samples], dtype=float)
    names, code = np.unique([s.job_set for s in samples], return_inverse=True)
    counts = np.bincount(code, minlength=len(names))
    big = np.flatnonzero(counts >= config.jobset_min)
    jobset_errors: dict[str, dict[tuple[str, str, str], tuple[float, int]]] = {str(names[j]): {} for j in big}
    for s in scores:  # each job set's mean absolute out-of-fold error, per model x category x mode
        per = np.bincount(code, weights=np.abs(s.oof - yarr), minlength=len(names)) / np.maximum(counts, 1)
        for j in big:
            jobset_errors[str(names[j])][(s.mode, s.category, s.model)] = (float(per[j]), int(counts[j]))
    cv_rows = {mode: max((s.trained for s in scores if s.mode == mode), default=0) for mode in modes}
    return RefitResult(table, selected, jobset_errors, time.perf_counter() - t0, len(samples), cv_rows, fits.fallbacks)


class EnvironmentModels:
    """The AIP selector of one environment: online learners, batch refits, selection, drift, persistence."""

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
        self.history: deque[Sample] = deque(maxlen=self.config.history)
        self._since_refit = 0
        self._drift = False
        self._refit_in_flight = False
        self._online: dict[tuple[str, str, str], RiverModel] = {}
        self._errors: dict[tuple[str, str, str], RollingMean] = {}
        for mode in MODES:
            for cat in CATEGORIES:
                for name in self.config.online_models:
                    self._online[(mode, cat, name)] = make_online(name, seed)
                    self._errors[(mode, cat, name)] = RollingMean(self.config.window)
        self._heavy = [key for key in self._online if key[2] in HEAVY_ONLINE]
        self._light = [key for key in self._online if key[2] not in HEAVY_ONLINE]
        self._batch: dict[tuple[str, str], tuple[str, Any]] = {}
        self._batch_scores: dict[tuple[str, str, str], tuple[float, float | None, int]] = {}
        self._jobset_counts: dict[str, int] = {}
        self._jobset_errors: dict[str, dict[tuple[str, str, str], RollingMean]] = {}
        self._jobset_batch: dict[str, dict[tuple[str, str, str], tuple[float, int]]] = {}
        self._selected: dict[str, tuple[float, str, str]] = {}
        self._drift_detectors = {mode: self._new_detector() for mode in MODES}

    @staticmethod
    def _new_detector() -> Any:
        from river import drift

        return drift.ADWIN(delta=0.002, clock=16)

    # ------------------------------------------------------------------ learning

    @staticmethod
    def _views(sample: Sample) -> dict[str, dict[str, dict[str, float]]]:
        out: dict[str, dict[str, dict[str, float]]] = {}
        for mode in MODES:
            full = sample.features(mode, "all")
            out[mode] = {cat: restrict(full, cat) for cat in CATEGORIES} if full else {}
        return out

    def learn(self, obs: Observation) -> None:
        """Prequential update: score each learner on ``obs``, then learn it.  No-op when unlabelled."""
        if obs.interference_pct is None or not math.isfinite(obs.interference_pct):
            return
        self.learn_sample(sample_of(obs))

    def learn_sample(self, sample: Sample) -> None:
        y = sample.target
        views = self._views(sample)
        n = self.observations
        stride = max(1, self.config.heavy_stride)
        keys = self._light + [k for i, k in enumerate(self._heavy) if (n + i) % stride == 0]
        js = sample.job_set
        js_errors = self._jobset_errors.get(js)
        if js_errors is None and len(self._jobset_errors) < self.config.max_jobsets:
            js_errors = self._jobset_errors[js] = {}
        served = {mode: self._choice(mode, js) for mode in MODES}
        for key in keys:
            mode, cat, _ = key
            x = views[mode].get(cat)
            if not x:
                continue
            learner = self._online[key]
            if learner.n:
                err = abs(learner.predict_one(x) - y)
                self._errors[key].update(err)
                if js_errors is not None:
                    r = js_errors.get(key)
                    if r is None:
                        r = js_errors[key] = RollingMean(self.config.jobset_window)
                    r.update(err)
            learner.learn_one(x, y)
        # drift: the error of what predict() serves for this job set
        for mode, choice in served.items():
            if choice is None or not views[mode]:
                continue
            _, cat, name = choice
            x = views[mode].get(cat)
            if not x:
                continue
            model = self._batch[(mode, cat)][1] if name in self.config.batch_models else self._online[(mode, cat, name)]
            det = self._drift_detectors[mode]
            det.update(abs(model.predict_one(x) - y))
            if det.drift_detected:
                self._drift = True
                self.drift_events += 1
        self.observations += 1
        self._since_refit += 1
        self._jobset_counts[js] = self._jobset_counts.get(js, 0) + 1
        self.history.append(sample)
        self._select()

    # ------------------------------------------------------------------ selection

    def _select(self) -> None:
        """Environment choice per mode: the (error, category, model) with the smallest error."""
        t0 = time.perf_counter()
        for mode in MODES:
            best: tuple[float, str, str] | None = None
            for cat in CATEGORIES:
                c = self._best_for(mode, cat)
                if c is not None and (best is None or c[0] < best[0]):
                    best = (c[0], cat, c[1])
            if best is not None:
                self._selected[mode] = best
        self.selection_seconds = time.perf_counter() - t0

    def _best_for(self, mode: str, cat: str) -> tuple[float, str] | None:
        best: tuple[float, str] | None = None
        for name in self.config.online_models:
            r = self._errors[(mode, cat, name)]
            if r.n >= self.config.min_samples:
                e = r.get()
                if e is not None and (best is None or e < best[0]):
                    best = (e, name)
        chosen = self._batch.get((mode, cat))
        if chosen is not None:
            e = self._batch_scores[(mode, cat, chosen[0])][0]
            if best is None or e < best[0]:
                best = (e, chosen[0])
        return best

    def _choice(self, mode: str, job_set: str | None = None) -> tuple[float, str, str] | None:
        if job_set is not None and self._jobset_counts.get(job_set, 0) >= self.config.jobset_min:
            best: tuple[float, str, str] | None = None
            for key, r in self._jobset_errors.get(job_set, {}).items():
                if key[0] == mode and r.n >= self.config.min_samples:
                    e = r.get()
                    if e is not None and (best is None or e < best[0]):
                        best = (e, key[1], key[2])
            for (m, cat, name), (e, _) in self._jobset_batch.get(job_set, {}).items():
                if m == mode and self._batch.get((mode, cat), ("",))[0] == name and (best is None or e < best[0]):
                    best = (e, cat, name)
            if best is not None:
                return best
        return self._selected.get(mode)

    def _predict_sample(self, sample: Sample, mode: str) -> PredictionResult | None:
        if self.observations == 0 or mode not in MODES:
            return None
        choice = self._choice(mode, sample.job_set)
        if choice is None:
            return None
        err, cat, name = choice
        full = sample.features(mode, "all")
        x = restrict(full, cat)
        if not x:
            return None
        model = self._batch[(mode, cat)][1] if name in self.config.batch_models else self._online[(mode, cat, name)]
        return PredictionResult(float(model.predict_one(x)), name, cat, mode, float(err))

    def predict(self, obs: Observation, mode: str) -> PredictionResult | None:
        """The selected model's prediction for ``obs`` (None before any labelled observation)."""
        return self._predict_sample(sample_of(obs), mode)

    def predict_placement(
        self,
        job_type: str,
        job_solo: Mapping[str, float | None],
        co_job_types: Sequence[str],
        co_solos: Sequence[Mapping[str, float | None]],
    ) -> PredictionResult | None:
        """What-if: the slowdown of ``job_type`` if co-located with ``co_job_types``."""
        sample = Sample(job_type, tuple(co_job_types), math.nan, "", self.environment, {}, dict(job_solo), tuple(co_solos))
        return self._predict_sample(sample, "placement")

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
        self._batch = dict(result.selected)
        self._batch_scores = dict(result.scores)
        self._jobset_batch = dict(result.jobset_errors)
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

    def selected(self) -> dict[str, str]:
        """``"<mode>:<category>"`` -> the model selected for it."""
        out = {}
        for mode in MODES:
            for cat in CATEGORIES:
                b = self._best_for(mode, cat)
                if b is not None:
                    out[f"{mode}:{cat}"] = b[1]
        return out

    def leaderboard(self) -> Leaderboard:
        entries = []
        for (mode, cat, name), r in self._errors.items():
            if r.n:
                entries.append(LeaderboardEntry(model=name, category=cat, mode=mode, kind="online", samples=r.n, mae=r.get()))
        for (mode, cat, name), (e, rel, n) in self._batch_scores.items():
            entries.append(
                LeaderboardEntry(
                    model=name, category=cat, mode=mode, kind="batch", samples=n,
                    mae=e if math.isfinite(e) else None, relative_error=rel,
                )
            )  # fmt: skip
        return Leaderboard(
            ts=time.time(), environment=self.environment, entries=entries, selected=self.selected(),
            observations=self.observations, last_refit=self.last_refit, selection_seconds=self.selection_seconds,
        )  # fmt: skip

    # ------------------------------------------------------------------ persistence

    def save(self, directory: Path, *, key_dir: Path | None = None) -> None:
        """Write everything to ``directory``; river files are signed with the key in ``key_dir``
        (default: ``directory``'s parent, the state directory)."""
        directory = Path(directory)
        key = persist.state_key(Path(key_dir) if key_dir else directory.parent)
        directory.mkdir(parents=True, exist_ok=True)
        for i, (_, model) in enumerate(self._online.items()):
            model.save(directory / "online" / f"{i}.pkl", key)
        batch_index = []
        for i, ((mode, cat), (name, model)) in enumerate(self._batch.items()):
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
            "online": [list(k) for k in self._online],
            "errors": [[*k, list(r.values)] for k, r in self._errors.items()],
            "batch": batch_index,
            "batch_scores": [[*k, *v] for k, v in self._batch_scores.items()],
            "jobset_counts": self._jobset_counts,
            "jobset_errors": {js: [[*k, list(r.values)] for k, r in d.items()] for js, d in self._jobset_errors.items()},
            "jobset_batch": {js: [[*k, *v] for k, v in d.items()] for js, d in self._jobset_batch.items()},
            "history": [_sample_json(s) for s in list(self.history)[-self.config.refit_rows :]],
        }
        (directory / "state.json").write_text(json.dumps(state))

    @classmethod
    def load(cls, directory: Path, *, key_dir: Path | None = None) -> EnvironmentModels:
        """Resume from :meth:`save`; raises :class:`models.persist.SignatureError` on a file this state dir did not sign."""
        directory = Path(directory)
        key = persist.state_key(Path(key_dir) if key_dir else directory.parent)
        state = json.loads((directory / "state.json").read_text())
        cfg = dict(state["config"])
        cfg["batch_models"] = tuple(cfg["batch_models"])
        cfg["online_models"] = tuple(cfg["online_models"])
        self = cls(state["environment"], seed=int(state["seed"]), config=Config(**cfg))
        self.observations = int(state["observations"])
        self.last_refit, self.refit_seconds = state["last_refit"], state["refit_seconds"]
        self.refits, self._since_refit = int(state["refits"]), int(state["since_refit"])
        for i, k in enumerate(state["online"]):
            self._online[(k[0], k[1], k[2])] = RiverModel.load(directory / "online" / f"{i}.pkl", key)
        w = self.config.window
        self._errors = {(m, c, n): RollingMean(w, v) for m, c, n, v in state["errors"]}
        for mode, cat, name, sub in state["batch"]:
            self._batch[(mode, cat)] = (name, load_batch(directory / "batch" / sub))
        self._batch_scores = {(m, c, n): (e, rel, cnt) for m, c, n, e, rel, cnt in state["batch_scores"]}
        self._jobset_counts = {k: int(v) for k, v in state["jobset_counts"].items()}
        jw = self.config.jobset_window
        self._jobset_errors = {
            js: {(m, c, n): RollingMean(jw, v) for m, c, n, v in d} for js, d in state["jobset_errors"].items()
        }
        self._jobset_batch = {js: {(m, c, n): (e, cnt) for m, c, n, e, cnt in d} for js, d in state["jobset_batch"].items()}
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

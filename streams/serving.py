"""Serving: the predictions, what-if entries and alerts of each observation, in both settings of ``serving``.

One :class:`Serving` serves what its models say; where they come from is the setting's only difference:

- ``stage2``: the learner's own models, in process (:class:`LearnAndServe`: each observation is served before its
  environment's learner, :class:`streams.stage2.Stage2`, learns it);
- ``sharded``: the latest model snapshot of the environment (:mod:`streams.snapshots` installs them), for the GPUs
  whose stage 1 runs here.  What is served is then a function of the snapshot and the observation only, so any
  worker serves a GPU as any other would.  Before the first snapshot of an environment arrives, its GPUs are served
  by models that learned nothing, as a fresh learner's are: a solo window's prediction without what-if entries, no
  prediction for a co-located window, alerts from measured rates only.

What is served:

- predictions: :func:`predictions_of` (both modes) and :func:`solo_prediction` (a lone job);
- what-if entries: :class:`streams.whatif.WhatIfCache`, once per state of the models and set of running job types,
  with the known solo profiles of the running types (not the asking window's: that would make the entries depend on
  which GPU asked first), in sorted order; a set with a type not known is computed for its window, uncached;
- alerts: :func:`streams.hysteresis.judge` of a GPU's raised jobs.  Sharded, they live in the GPU's stage-1 state
  (``GpuState.raised``), which moves with the GPU's partition through the stage-1 changelog, so a GPU's alerts
  neither repeat nor get lost when another worker takes it over; with stage2, here (:attr:`Serving.raised`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from events import Alert, Leaderboard, Observation, Prediction, WhatIf
from events.records import AlertSource, AlertState
from models.environment import EnvironmentModels, Served
from models.modelconfig import ModelConfig
from streams.hysteresis import alert_value, judge
from streams.whatif import Profile, WhatIfCache, what_if_entries

if TYPE_CHECKING:
    from streams.stage2 import Stage2

SOLO_MODEL = "solo"
IDLE_MODEL = "idle"
"""The ``model`` of a prediction for a GPU running one job / none: no model, the answer is known."""
RAISED_GPUS = 100_000
"""GPUs whose raised alerts :class:`Serving` keeps itself (setting stage2): the least recently served are forgotten."""


@dataclass
class Output:
    predictions: list[Prediction] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    leaderboard: Leaderboard | None = None
    served: Served | None = None
    """The models' answers to a co-located observation, which learning it reuses (:meth:`EnvironmentModels.learn`)."""


class Serving:
    """Predictions, what-if entries and alerts of observations, from the models of :meth:`models_for`.

    ``learner``: serve its models and solo profiles as they learn, counting in its counters (setting stage2);
    None: serve the snapshots :meth:`install` is given (setting sharded)."""

    def __init__(
        self,
        threshold_pct: float = 50.0,
        clear_pct: float = 35.0,
        *,
        clock: Callable[[], float] = time.time,
        max_pct: float = ModelConfig.max_pct,
        learner: Stage2 | None = None,
        what_if_every: int = 256,
        what_if_min_s: float = 60.0,
        max_jobs_per_gpu: int = 3,
    ) -> None:
        self.threshold, self.clear_level, self.clock, self.max_pct = threshold_pct, clear_pct, clock, max_pct
        self.learner = learner
        self.models: dict[str, EnvironmentModels] = {}
        self.known: dict[str, dict[str, Profile]] = {}
        self.versions: dict[str, int] = {}
        """Per environment, the snapshot version served (-1: none yet); empty with a learner."""
        self.max_jobs_per_gpu = max_jobs_per_gpu
        """Jobs a GPU may run (0: no limit): one running as many is full, and publishes no what-if entries."""
        self.latest: dict[str, dict[str, dict[str, Prediction]]] = {}
        """gpu -> job -> mode -> its latest prediction, for the jobs of the GPU's latest window served (the HTTP view)."""
        self.raised: dict[str, list[str]] = {}
        """gpu -> its jobs with a raised alert, for the GPUs whose caller keeps no state of them (setting stage2)."""
        self.counters: Counter[str] = learner.counters if learner is not None else Counter()
        self.what_ifs = WhatIfCache(what_if_every, what_if_min_s, counters=self.counters, pair_tables=learner is None)

    # ------------------------------------------------------------ models
    def install(self, environment: str, version: int, models: EnvironmentModels, known: Mapping[str, Profile]) -> bool:
        """Serve ``environment`` from these models (of snapshot ``version``) from now on; False: not newer."""
        if version <= self.versions.get(environment, -1):
            return False
        models.config.max_pct = self.max_pct
        self.models[environment] = models
        self.known[environment] = dict(known)
        self.versions[environment] = version
        self.what_ifs.forget(environment)
        self.counters["snapshots_applied"] += 1
        return True

    def models_for(self, environment: str) -> EnvironmentModels:
        if self.learner is not None:
            return self.learner.models_for(environment)
        m = self.models.get(environment)
        if m is None:  # no snapshot yet: models that learned nothing (see the module's docstring)
            m = self.models[environment] = EnvironmentModels(environment, config=ModelConfig(max_pct=self.max_pct))
            self.versions[environment] = -1
            self.counters["served_before_snapshot_envs"] += 1
        return m

    def known_of(self, environment: str) -> Mapping[str, Profile]:
        """The job types known in ``environment`` and their solo profiles: every newcomer of a what-if."""
        source = self.learner.job_types if self.learner is not None else self.known
        return source.get(environment, {})

    # --------------------------------------------------------------- serving
    def served_ahead(self, observations: Sequence[Observation]) -> list[Served | None]:
        """Setting sharded: what the snapshot served predicts for each co-located observation (None for the others),
        each environment's in one :meth:`EnvironmentModels.serve_many`, for :meth:`serve` of each.  The models do
        not change in between: a snapshot is installed on the event loop, never while a batch is served."""
        assert self.learner is None, "with a learner, each observation is served by models that learned the one before"
        out: list[Served | None] = [None] * len(observations)
        by_env: dict[str, list[int]] = {}
        for i, obs in enumerate(observations):
            if obs.colocated:
                by_env.setdefault(obs.environment, []).append(i)
        for env, idx in by_env.items():
            for i, served in zip(idx, self.models_for(env).serve_many([observations[i] for i in idx]), strict=True):
                out[i] = served
        return out

    def serve(self, obs: Observation, raised: list[str] | None = None, served: Served | None = None) -> Output:
        """Predictions and alerts of one observation; ``raised``: the job ids of the GPU with a raised alert (its
        stage-1 state, updated in place; None: kept here); ``served``: its :meth:`served_ahead`, if made."""
        out = Output()
        models = self.models_for(obs.environment)
        if self.learner is None and self.versions.get(obs.environment, -1) < 0:
            self.counters["served_before_snapshot"] += 1
        now = self.clock()
        full = is_full(1 + len(obs.co_job_types), self.max_jobs_per_gpu)
        if full:
            self.counters["windows_full"] += 1
        if obs.colocated:
            out.served = served if served is not None else models.serve(obs)
            what_if = (lambda: []) if full else (lambda: self._what_if(models, obs))
            out.predictions = predictions_of(models, obs, what_if, now, self.counters, out.served, full=full)
        elif obs.occupancy == "solo" and not obs.co_job_types:
            out.predictions = [solo_prediction(obs, [] if full else self._what_if(models, obs), now=now, full=full)]
        else:
            self.counters["windows_not_understood"] += 1
            return out
        self.counters["served"] += 1
        if raised is None:
            raised = self._raised_of(obs.gpu_uuid)
        value, source = alert_value(obs, out.predictions)
        if value is not None and (obs.colocated or obs.job_id in raised):  # alone: a raised alert clears
            change = judge(raised, obs.job_id, value, self.threshold, self.clear_level)
            if change is not None:
                out.alerts.append(alert_of(obs, change, value, source, self.threshold, self.clear_level, now))
        jobs = self.latest.setdefault(obs.gpu_uuid, {})
        if len(jobs) > 1 + len(obs.co_job_ids):  # a job gone from the GPU: its predictions are no longer current
            current = {obs.job_id, *obs.co_job_ids}
            for gone in [j for j in jobs if j not in current]:
                del jobs[gone]
        for pred in out.predictions:
            jobs.setdefault(obs.job_id, {})[pred.mode] = pred
        return out

    def _raised_of(self, gpu: str) -> list[str]:
        raised = self.raised.pop(gpu, None)
        if raised is None:
            raised = []
            if len(self.raised) >= RAISED_GPUS:
                del self.raised[next(iter(self.raised))]
        self.raised[gpu] = raised  # the most recently served last
        return raised

    def _what_if(self, models: EnvironmentModels, obs: Observation) -> list[WhatIf]:
        known = self.known_of(obs.environment)
        running = sorted(zip([obs.job_type, *obs.co_job_types], [obs.solo, *obs.co_solo], strict=False), key=lambda r: r[0])
        types = [t for t, _ in running]
        if all(t in known for t in types):
            return self.what_ifs.entries(models, known, types, [known[t] for t in types], obs.window_end)
        self.counters["what_if_uncached"] += 1
        return what_if_entries(models, known, types, [s for _, s in running], self.counters)

    def forget(self, gpus: Iterable[str]) -> None:
        """GPUs now read elsewhere: their latest predictions are that worker's to show."""
        for g in gpus:
            self.latest.pop(g, None)


class LearnAndServe:
    """Setting ``serving`` stage2: every observation served from its environment's learner's own models, then
    learned by it (a duplicate is neither)."""

    def __init__(self, learner: Stage2, serving: Serving) -> None:
        self.learner = learner
        self.serving = serving

    @classmethod
    def build(cls, threshold_pct: float = 50.0, clear_pct: float = 35.0, *, clock: Callable[[], float] = time.time, **learner: Any) -> LearnAndServe:
        """A learner (``learner``: :class:`streams.stage2.Stage2`'s settings) and its :class:`Serving`."""
        from streams.stage2 import Stage2

        stage2 = Stage2(**learner)
        return cls(stage2, Serving(threshold_pct, clear_pct, clock=clock, max_pct=stage2.max_pct, learner=stage2))

    @property
    def counters(self) -> Counter[str]:
        return self.learner.counters

    def on_observation(self, obs: Observation, *, leaderboard: bool = True) -> Output:
        """Serve, then learn, one observation.  ``leaderboard`` False: ``Output.leaderboard`` stays None and the
        caller asks :meth:`streams.stage2.Stage2.leaderboard_of` once for a batch."""
        if not self.learner.admit(obs):
            return Output()
        out = self.serving.serve(obs)
        if obs.colocated:
            self.learner.learn(obs, out.served)
            if leaderboard:
                out.leaderboard = self.learner.leaderboard_of(obs.environment)
        return out


def is_full(running_jobs: int, max_jobs_per_gpu: int) -> bool:
    """A GPU running ``running_jobs`` takes no other job (``max_jobs_per_gpu`` 0: no limit).

    >>> is_full(3, 3), is_full(2, 3), is_full(9, 0)
    (True, False, False)
    """
    return max_jobs_per_gpu > 0 and running_jobs >= max_jobs_per_gpu


def predictions_of(
    models: EnvironmentModels,
    obs: Observation,
    what_if: Callable[[], list[WhatIf]],
    now: float,
    counters: Counter[str],
    served: Served | None = None,
    *,
    full: bool = False,
) -> list[Prediction]:
    """The predictions of a co-located observation in both modes (none where ``models`` cannot serve it), the
    placement one with ``what_if()``'s entries; counts what was served, clipped or withheld in ``counters``.
    ``served``: ``models.serve(obs)`` already made, else made here.  ``full``: the GPU takes no other job (said on
    both; ``what_if`` then answers no entries)."""
    job_set = sorted([obs.job_type, *obs.co_job_types])
    served = served or models.serve(obs)
    if served.withheld:
        counters["predictions_withheld_novel"] += served.withheld
    out = []
    for result in (served.results["observed"], served.results["placement"]):
        if result is None:
            continue
        counters[f"predictions_{result.regime}"] += 1
        if result.clipped:
            counters["predictions_clipped"] += 1
        out.append(
            Prediction(
                ts=now,
                gpu_uuid=obs.gpu_uuid,
                environment=obs.environment,
                job_id=obs.job_id,
                job_type=obs.job_type,
                job_set=job_set,
                mode=result.mode,
                interference_pct=float(result.interference_pct),
                model=result.model,
                category=result.category,
                expected_error_pct=result.expected_error_pct,
                measured_pct=obs.interference_pct,
                what_if=what_if() if result.mode == "placement" else [],
                window_end=obs.window_end,
                regime=result.regime,
                interval_pct=None if result.interval_pct is None else [min(v, models.config.max_pct) for v in result.interval_pct],
                full=full,
            )
        )
    return out


def alert_of(
    obs: Observation, change: AlertState, value: float, source: AlertSource, threshold: float, clear_level: float, now: float
) -> Alert:
    """The alert record of a change of ``obs``'s job's alert state (``raised`` or ``cleared``)."""
    return Alert(
        ts=now,
        state=change,
        gpu_uuid=obs.gpu_uuid,
        job_id=obs.job_id,
        interference_pct=value,
        threshold=threshold,
        source=source,
        clear_level=clear_level,
        job_type=obs.job_type,
        environment=obs.environment,
    )


def solo_prediction(obs: Observation, what_if: list[WhatIf], *, now: float, full: bool = False) -> Prediction:
    """The answer of a GPU whose job ran alone in the window: the job is not slowed (0, interval ``[0, 0]``), and
    ``what_if`` says what each newcomer would do there (none where the GPU is ``full``: it may run one job only)."""
    return Prediction(
        ts=now,
        gpu_uuid=obs.gpu_uuid,
        environment=obs.environment,
        job_id=obs.job_id,
        job_type=obs.job_type,
        job_set=[obs.job_type],
        mode="placement",
        interference_pct=0.0,
        model=SOLO_MODEL,
        category="all",
        what_if=what_if,
        window_end=obs.window_end,
        interval_pct=[0.0, 0.0],
        occupancy="solo",
        full=full,
    )


def idle_prediction(gpu_uuid: str, environment: str, window_end: float, job_types: Iterable[str], *, now: float) -> Prediction:
    """The answer of an idle GPU: every job type would run there alone (0 for the newcomer, no one else slowed).

    >>> p = idle_prediction("GPU-a", "v100", 1e9, ["b", "a"], now=1e9)
    >>> p.occupancy, p.job_set, [(w.job_type, w.newcomer_pct, w.existing_pct, w.interval_pct) for w in p.what_if]
    ('idle', [], [('a', 0.0, 0.0, [0.0, 0.0]), ('b', 0.0, 0.0, [0.0, 0.0])])
    """
    return Prediction(
        ts=now,
        gpu_uuid=gpu_uuid,
        environment=environment,
        job_id="",
        job_type="",
        job_set=[],
        mode="placement",
        interference_pct=0.0,
        model=IDLE_MODEL,
        category="all",
        what_if=[WhatIf(job_type=t, newcomer_pct=0.0, existing_pct=0.0, interval_pct=[0.0, 0.0]) for t in sorted(set(job_types))],
        window_end=window_end,
        interval_pct=[0.0, 0.0],
        occupancy="idle",
        full=False,
    )

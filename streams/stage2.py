"""Stage 2, without Kafka: observations in; predictions, alerts and leaderboards out.

:class:`Stage2` hosts one :class:`models.environment.EnvironmentModels` per environment
through exactly its public interface, dedupes observations by
``observation_id``, predicts in both modes (placement with what-if entries for
every known job type), and runs alert hysteresis.  A solo window (an observation
with ``occupancy`` ``solo``) is never learned: it gets one :func:`solo_prediction`
with the what-if entries of the GPU's lone job, so that every GPU answers the
scheduler's question; an idle GPU's answer is :func:`idle_prediction`.  Refits are handed out as
snapshot callables for the caller to run in an executor.

What-if entries are served from a version of the environment's models (:class:`WhatIfCache`): computed once per
version for a set of running job types and the job types known, then reused by every window of that set, until
the version moves on (a refit, a job type measured for the first time, ``what_if_every`` observations learned
and ``what_if_min_s`` of event time; more often while the models are young).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from events import Alert, Leaderboard, Observation, Prediction, WhatIf, to_dict
from events.records import AlertSource, AlertState
from models.environment import EnvironmentModels, PlacementAsk, Served
from models.modelconfig import ModelConfig
from streams.dedupe import SeenSet
from streams.hysteresis import AlertStates

log = logging.getLogger(__name__)


@dataclass
class Output:
    predictions: list[Prediction] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    leaderboard: Leaderboard | None = None


def leaderboard_changed(before: Leaderboard | None, after: Leaderboard) -> bool:
    """True when anything but the timestamp differs."""
    if before is None:
        return True
    return msgspec.structs.replace(before, ts=after.ts) != after  # records compare field by field


def alert_value(obs: Observation, predictions: Iterable[Prediction]) -> tuple[float | None, AlertSource]:
    """The value a job's alert hysteresis judges for this observation, and its source: the measured rate when the
    job reports progress, else the observed-mode prediction among ``predictions`` (None: there is none); a job alone
    on its GPU (a solo window) is not slowed.  The same value is the Prometheus series the alert rule reads
    (:mod:`streams.interference_metrics`)."""
    if obs.occupancy == "solo":
        return 0.0, "measured"
    if obs.interference_pct is not None:
        return obs.interference_pct, "measured"
    for p in predictions:
        if p.mode == "observed":
            return p.interference_pct, "predicted"
    return None, "predicted"


class Stage2:
    """Models, predictions, alerts and leaderboards for every environment seen."""

    def __init__(
        self,
        threshold_pct: float = 50.0,
        clear_pct: float = 35.0,
        *,
        state_dir: str | Path | None = None,
        models_factory: Callable[[str], EnvironmentModels] | None = None,
        clock: Callable[[], float] = time.time,
        dedupe_capacity: int = 200_000,
        max_pct: float = ModelConfig.max_pct,
        what_if_every: int = 256,
        what_if_min_s: float = 60.0,
        refit_share: float = 0.25,
        refit_clock: Callable[[], float] = time.monotonic,
        refit_max_lag_s: float = 0.0,
        serve: bool = True,
    ) -> None:
        self.serve = serve
        """False: learning only (setting ``serving`` sharded): no prediction, no alert; the workers that own the
        GPUs serve them from this learner's snapshots (:mod:`streams.serving`)."""
        self.models: dict[str, EnvironmentModels] = {}
        self.max_pct = max_pct
        self.models_factory = models_factory or (lambda env: EnvironmentModels(env, config=ModelConfig(max_pct=max_pct)))
        self.state_dir = Path(state_dir) if state_dir else None
        self.clock = clock
        self.seen = SeenSet(dedupe_capacity)
        self.alerts = AlertStates(threshold_pct, clear_pct)
        self.job_types: dict[str, dict[str, Mapping[str, float | None]]] = {}  # env -> job type -> solo profile
        self.latest: dict[str, dict[str, dict[str, Any]]] = {}  # gpu -> job -> mode -> prediction dict
        self.leaderboards: dict[str, Leaderboard] = {}
        self.counters: Counter[str] = Counter()
        self.what_ifs = WhatIfCache(what_if_every, what_if_min_s)
        self.refit_share = refit_share
        """Refits of an environment take at most this share of the time: after a refit of ``d`` seconds the next
        one waits ``d * (1 / share - 1)`` (:meth:`refits_due`).  A worker that keeps up is not held back (its
        refits are due every ``ModelConfig.refit_every`` observations, further apart than that); a saturated one spends
        the rest on its observations.  1.0: no wait (before issue 23)."""
        self.refit_clock = refit_clock
        self.refit_ready_at: dict[str, float] = {}
        self.refit_max_lag_s = refit_max_lag_s
        """How far the stream may outrun an environment's refits (:meth:`behind`), in seconds of event time beyond
        the wall-clock seconds passed; 0: no bound."""
        self.learned_ts: dict[str, float] = {}
        """Per environment: the latest window end learned."""
        self.fit_at: dict[str, tuple[float, float]] = {}
        """Per environment: (latest window end, :attr:`refit_clock`) when the served models' rows were taken (their
        first observation's before the first refit); ``refit_at``: the same of the refit in flight."""
        self.refit_at: dict[str, tuple[float, float]] = {}
        # observations partition -> offset of the last observation applied (in memory) / covered by the snapshot
        self.positions: dict[int, int] = {}
        self.covers: dict[int, int] = {}
        self._load_seen()
        self._load_covers()

    # ----------------------------------------------------------------- models
    def models_for(self, environment: str) -> EnvironmentModels:
        m = self.models.get(environment)
        if m is None:
            m = self._load(environment)
            if m is not None:
                m.config.max_pct = self.max_pct  # the setting in force, also for models saved under another
            else:
                m = self.models_factory(environment)
            self.models[environment] = m
        return m

    def _dir(self, environment: str) -> Path | None:
        if self.state_dir is None:
            return None
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in environment)
        return self.state_dir / "models" / safe

    def _load(self, environment: str) -> EnvironmentModels | None:
        directory = self._dir(environment)
        if directory is None or not directory.exists():
            return None
        try:
            models = EnvironmentModels.load(directory)
        except NotImplementedError:
            return None
        except Exception as exc:  # a damaged save must not stop the worker
            log.warning("could not load models of %s from %s: %s", environment, directory, exc)
            return None
        self.counters["models_restored_observations"] += models.observations  # learned before a restart
        return models

    def _seen_path(self) -> Path | None:
        return None if self.state_dir is None else self.state_dir / "stage2-seen.json"

    def _load_seen(self) -> None:
        """The observation ids learned before a restart (saved with the models), so a replay is not learned twice."""
        path = self._seen_path()
        if path is None or not path.exists():
            return
        try:
            self.seen.extend(json.loads(path.read_text()))
        except Exception as exc:
            log.warning("could not load the seen observation ids from %s: %s", path, exc)

    def _save_seen(self) -> None:
        path = self._seen_path()
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.seen.items(), separators=(",", ":")))
        os.replace(tmp, path)

    def save(self) -> int:
        """Save the ids learned, every environment's models where persistence is available, then the offsets
        they cover; return how many were saved."""
        covers = dict(self.positions)
        self._save_seen()  # first: a crash in between loses learning rather than doubling it
        saved = self._save_models()
        self._save_covers(covers)  # last: an older one only makes a rebuild read (and skip) more
        return saved

    # ------------------------------------------------------- rebuild from the topic
    # Models are a function of the observations topic's history: the snapshot on disk is a
    # cache that says which offset of each partition it covers (stage2-covers.json).
    def _covers_path(self) -> Path | None:
        return None if self.state_dir is None else self.state_dir / "stage2-covers.json"

    def _load_covers(self) -> None:
        path = self._covers_path()
        if path is None or not path.exists():
            return
        try:
            self.covers = {int(p): int(o) for p, o in json.loads(path.read_text()).items()}
        except Exception as exc:
            log.warning("could not load the offsets the model snapshot covers from %s: %s", path, exc)

    def _save_covers(self, covers: Mapping[int, int]) -> None:
        path = self._covers_path()
        if path is None:
            return
        merged = {**self.covers, **covers}
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({str(p): o for p, o in merged.items()}))
        os.replace(tmp, path)

    def start_of(self, partition: int) -> int:
        """The first offset of ``partition`` these models have not learned (0 when neither memory nor the snapshot has it)."""
        last = self.positions.get(partition, self.covers.get(partition))
        return 0 if last is None else last + 1

    def applied(self, partition: int, offset: int) -> None:
        self.positions[partition] = offset

    def replay(self, obs: Observation) -> bool:
        """Learn a historical observation (a rebuild): no prediction, no alert; False when already learned
        (or not a co-located window: nothing to learn)."""
        if not obs.colocated:
            return False
        if not self.seen.add(obs.observation_id):
            self.counters["duplicates"] += 1
            return False
        known = self.job_types.setdefault(obs.environment, {})
        if obs.solo:
            known[obs.job_type] = obs.solo
        for jt, prof in zip(obs.co_job_types, obs.co_solo, strict=False):
            if prof:
                known.setdefault(jt, prof)
        self.models_for(obs.environment).learn(obs)
        self._learned_at(obs.environment, obs.window_end)
        self.counters["rebuilt"] += 1
        return True

    def leaderboard_of(self, env: str) -> Leaderboard | None:
        """The environment's leaderboard when it changed (after a rebuild)."""
        return self._leaderboard(env) if env in self.models else None

    def _save_models(self) -> int:
        saved = 0
        for env, m in self.models.items():
            directory = self._dir(env)
            if directory is None:
                continue
            try:
                directory.mkdir(parents=True, exist_ok=True)
                m.save(directory)
                saved += 1
            except NotImplementedError:
                return saved
            except Exception as exc:
                log.warning("could not save models of %s: %s", env, exc)
        return saved

    # ------------------------------------------------------------ observations
    def on_observation(self, obs: Observation, *, leaderboard: bool = True) -> Output:
        """Predict, alert and learn one observation.  ``leaderboard`` False: ``Output.leaderboard`` stays None and
        the caller asks :meth:`leaderboard_of` once for a batch (a worker publishes one per environment and batch;
        building the record costs more than the rest of a solo window)."""
        if not obs.colocated:
            return self.on_solo(obs)
        out = Output()
        if not self.seen.add(obs.observation_id):
            self.counters["duplicates"] += 1
            return out
        self.counters["observations"] += 1
        env = obs.environment
        models = self.models_for(env)
        known = self.job_types.setdefault(env, {})
        if obs.solo:
            known[obs.job_type] = obs.solo
        for jt, prof in zip(obs.co_job_types, obs.co_solo, strict=False):
            if prof:
                known.setdefault(jt, prof)
        now = self.clock()
        served = None
        if self.serve:
            served = models.serve(obs)
            out.predictions = predictions_of(models, obs, lambda: self._what_if(models, obs), now, self.counters, served)
            for pred in out.predictions:
                self.latest.setdefault(obs.gpu_uuid, {}).setdefault(obs.job_id, {})[pred.mode] = to_dict(pred)
        value, source = alert_value(obs, out.predictions)
        if value is not None and self.serve:
            self._alert(out, obs, value, source, now)
        models.learn(obs, served)
        self._learned_at(env, obs.window_end)
        if leaderboard:
            out.leaderboard = self._leaderboard(env)
        return out

    def on_solo(self, obs: Observation) -> Output:
        """A window in which the job ran alone: the what-if entries of every known job type joining it, in one
        :func:`solo_prediction`.  Nothing is learned (a solo window measures no interference), nothing deduped."""
        out = Output()
        if obs.occupancy != "solo" or obs.co_job_types:
            self.counters["windows_not_understood"] += 1
            return out
        self.counters["solo_windows"] += 1
        models = self.models_for(obs.environment)
        if obs.solo:
            self.job_types.setdefault(obs.environment, {})[obs.job_type] = obs.solo
        if not self.serve:
            return out
        now = self.clock()
        pred = solo_prediction(obs, self._what_if(models, obs), now=now)
        out.predictions.append(pred)
        value, source = alert_value(obs, [])  # alone, the job is not slowed: a raised alert clears
        if value is not None and self.alerts.is_raised((obs.gpu_uuid, obs.job_id)):
            self._alert(out, obs, value, source, now)
        self.latest.setdefault(obs.gpu_uuid, {}).setdefault(obs.job_id, {})[pred.mode] = to_dict(pred)
        return out

    def _alert(self, out: Output, obs: Observation, value: float, source: AlertSource, now: float) -> None:
        """Feed the job's hysteresis; a change of state is an alert in ``out``."""
        change = self.alerts.update((obs.gpu_uuid, obs.job_id), value)
        if change is not None:
            out.alerts.append(alert_of(obs, change, value, source, self.alerts.threshold, self.alerts.clear_level, now))

    def _what_if(self, models: EnvironmentModels, obs: Observation) -> list[WhatIf]:
        """Each known job type as a newcomer to this GPU's running set (see :class:`WhatIfCache`)."""
        known = self.job_types.get(obs.environment, {})
        running_types = [obs.job_type, *obs.co_job_types]
        running_solos: list[Mapping[str, float | None]] = [obs.solo, *obs.co_solo]
        return self.what_ifs.entries(models, known, running_types, running_solos, obs.window_end)

    def _leaderboard(self, env: str) -> Leaderboard | None:
        board = self.models[env].leaderboard()
        if leaderboard_changed(self.leaderboards.get(env), board):
            self.leaderboards[env] = board
            return board
        return None

    # ------------------------------------------------------------------ refits
    def refits_due(self) -> list[tuple[str, Callable[[], Any]]]:
        """The refit task of every environment whose models want one and whose wait after its last refit is over
        (see :attr:`refit_share`); a refit held back is counted once per call (``refits_waited``)."""
        now = self.refit_clock()
        out = []
        for env, m in self.models.items():
            if not m.refit_due():
                continue
            if now < self.refit_ready_at.get(env, -math.inf):
                self.counters["refits_waited"] += 1
                continue
            out.append((env, self.refit_task(env)))
        return out

    def _learned_at(self, env: str, window_end: float) -> None:
        """Event time learned: the latest window end, and the first one with the wall clock (models restored or new
        count as fit then)."""
        self.learned_ts[env] = max(window_end, self.learned_ts.get(env, window_end))
        if env not in self.fit_at:
            self.fit_at[env] = (window_end, self.refit_clock())

    def refit_task(self, env: str) -> Callable[[], Any]:
        """The refit task of ``env`` now, whatever :attr:`refit_share` says (the caller checked it is due)."""
        if env in self.learned_ts:
            self.refit_at[env] = (self.learned_ts[env], self.refit_clock())
        return self.models[env].refit_task()

    def behind(self, env: str, event_ts: float) -> bool:
        """True when ``env`` has a refit due or in flight and, since the rows its served models were fit on were
        taken, the stream has advanced more than :attr:`refit_max_lag_s` seconds of event time further than the
        wall clock: the caller then waits for that refit, starting it at once if it is only due.

        In real time event time and the wall clock advance together, so it never binds, whatever a refit and its
        :attr:`refit_share` wait take.  Faster than real time (a backlog after an outage, a paced benchmark) the
        wall-clock seconds of each refit become minutes of event time, and predictions would come from models fit
        on a fraction of what was learned; bounded, they are what the same stream in real time would get."""
        if self.refit_max_lag_s <= 0:  # the default: one comparison per observation
            return False
        m = self.models.get(env)
        if m is None or env not in self.fit_at:
            return False
        fit_ts, fit_clock = self.fit_at[env]
        ahead_s = (event_ts - fit_ts) - (self.refit_clock() - fit_clock)
        return ahead_s > self.refit_max_lag_s and (m.refit_in_flight or m.refit_due())

    def apply_refit(self, env: str, result: Any) -> Leaderboard | None:
        self.models[env].apply_refit(result)
        taken = self.refit_at.pop(env, None)
        if result is not None:
            self.counters["refits_applied"] += 1
            self.counters["refit_ms"] += round(getattr(result, "seconds", 0.0) * 1e3)
            if taken is not None:
                self.fit_at[env] = taken
        seconds = getattr(result, "seconds", None)
        if seconds is not None and 0.0 < self.refit_share < 1.0:
            self.refit_ready_at[env] = self.refit_clock() + seconds * (1.0 / self.refit_share - 1.0)
        return self._leaderboard(env)


def predictions_of(
    models: EnvironmentModels,
    obs: Observation,
    what_if: Callable[[], list[WhatIf]],
    now: float,
    counters: Counter[str],
    served: Served | None = None,
) -> list[Prediction]:
    """The predictions of a co-located observation in both modes (none where ``models`` cannot serve it), the
    placement one with ``what_if()``'s entries; counts what was served, clipped or withheld in ``counters``.
    ``served``: ``models.serve(obs)`` already made (learning reuses it), else made here."""
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
                interval_pct=None if result.interval_pct is None else list(result.interval_pct),
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


def what_if_entries(
    models: EnvironmentModels,
    known: Mapping[str, Mapping[str, float | None]],
    running_types: Sequence[str],
    running_solos: Sequence[Mapping[str, float | None]],
) -> list[WhatIf]:
    """For each known job type (sorted) as a newcomer: its predicted slowdown and the summed slowdown of the jobs
    already there.  Every question of the window is asked in one :meth:`EnvironmentModels.predict_placements`."""
    asks: list[PlacementAsk] = []
    for jt in sorted(known):
        asks.append((jt, known[jt], list(running_types), list(running_solos)))
        for i, (rt, rs) in enumerate(zip(running_types, running_solos, strict=True)):
            others = [j for j in range(len(running_types)) if j != i]
            asks.append((rt, rs, [running_types[j] for j in others] + [jt], [running_solos[j] for j in others] + [known[jt]]))
    results = iter(models.predict_placements(asks))
    entries = []
    for jt in sorted(known):
        newcomer = next(results)
        existing = sum(float(r.interference_pct) for r in itertools.islice(results, len(running_types)) if r is not None)
        if newcomer is not None:
            interval = None if newcomer.interval_pct is None else list(newcomer.interval_pct)
            entries.append(
                WhatIf(
                    job_type=jt, newcomer_pct=float(newcomer.interference_pct), existing_pct=existing,
                    interval_pct=interval, regime=newcomer.regime,
                )
            )  # fmt: skip
    return entries


class Version(NamedTuple):
    """Where the models were when the entries served now were first computed."""

    refits: int
    measured_types: int
    observations: int
    event_ts: float


class WhatIfCache:
    """What-if entries by (environment, running job types, known job types), per version of the models.

    An entry of a set of running job types is computed once per version, with the solo profiles of the first
    window that asks, and served to every window of that set (any GPU, any job of it) until the version moves on
    (:meth:`stale`): at a refit, when a job type is measured for the first time, and once the models have learned
    ``every`` more observations (1, 2, 4, ... while they are younger than that) and, past that age, ``min_s`` more
    seconds of event time have gone by.  The models change a little with every observation; the entries served
    are at most that old.  The count bounds a small fleet's staleness, the time a large one's cost: 10,000 GPUs
    learn 256 observations in about a second, while every distinct job set of an environment asks its own
    entries.  Without the cache every window paid its own (docs/BENCHMARKS.md, "Stage 2 per observation")."""

    def __init__(self, every: int = 256, min_s: float = 60.0, capacity: int = 50_000) -> None:
        self.every = max(1, every)
        self.min_s = min_s
        self.capacity = capacity
        self.entries_by_key: dict[tuple[Any, ...], list[WhatIf]] = {}
        self.version: dict[str, Version] = {}
        self.hits = 0
        self.misses = 0

    def stale(self, v: Version, models: EnvironmentModels, event_ts: float) -> bool:
        """Whether entries computed at ``v`` are no longer served by ``models`` at ``event_ts``.

        >>> from models.environment import EnvironmentModels
        >>> m, c = EnvironmentModels("v100"), WhatIfCache(every=256, min_s=60.0)
        >>> m.observations = 300
        >>> c.stale(Version(0, 0, 100, 0.0), m, 10.0), c.stale(Version(0, 0, 256, 0.0), m, 10.0)
        (True, False)
        >>> m.observations = 600; c.stale(Version(0, 0, 256, 0.0), m, 10.0), c.stale(Version(0, 0, 256, 0.0), m, 70.0)
        (False, True)
        """
        if v.refits != models.refits or v.measured_types != len(models.measurements.types):
            return True
        learned = models.observations - v.observations
        if v.observations < self.every:  # young models: again after as many as they had
            return learned >= max(1, v.observations)
        return learned >= self.every and event_ts - v.event_ts >= self.min_s

    def entries(
        self,
        models: EnvironmentModels,
        known: Mapping[str, Mapping[str, float | None]],
        running_types: Sequence[str],
        running_solos: Sequence[Mapping[str, float | None]],
        event_ts: float = 0.0,
    ) -> list[WhatIf]:
        """The entries of ``running_types`` (``event_ts``: the window's end, event time)."""
        env = models.environment
        v = self.version.get(env)
        if v is None or self.stale(v, models, event_ts):  # entries of an older version are never served again
            self.entries_by_key = {k: e for k, e in self.entries_by_key.items() if k[0] != env}
            self.version[env] = Version(models.refits, len(models.measurements.types), models.observations, event_ts)
        key = (env, tuple(sorted(running_types)), tuple(sorted(known)))
        hit = self.entries_by_key.get(key)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        if len(self.entries_by_key) >= self.capacity:
            self.entries_by_key.clear()
        entries = self.entries_by_key[key] = what_if_entries(models, known, running_types, running_solos)
        return entries

    def forget(self, environment: str) -> None:
        """Drop the entries of ``environment`` (its models were replaced: a new snapshot, see :mod:`streams.serving`)."""
        self.version.pop(environment, None)
        self.entries_by_key = {k: e for k, e in self.entries_by_key.items() if k[0] != environment}


SOLO_MODEL = "solo"
IDLE_MODEL = "idle"
"""The ``model`` of a prediction for a GPU running one job / none: no model, the answer is known."""


def solo_prediction(obs: Observation, what_if: list[WhatIf], *, now: float) -> Prediction:
    """The answer of a GPU whose job ran alone in the window: the job is not slowed (0, interval ``[0, 0]``), and
    ``what_if`` says what each newcomer would do there."""
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
    )

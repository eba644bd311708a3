"""Stage 2's learning, without Kafka: observations in; models and leaderboards out.

:class:`Stage2` hosts one :class:`models.environment.EnvironmentModels` per environment through exactly its public
interface, dedupes observations by ``observation_id``, notes every job type's solo profile (the newcomers of the
what-if entries), learns co-located windows and hands out refits as snapshot callables for the caller to run in an
executor.  A solo window (an observation with ``occupancy`` ``solo``) is never learned.  Serving is
:class:`streams.serving.Serving`'s, in both settings of ``serving``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from events import Leaderboard, Observation
from models.environment import EnvironmentModels, Served
from models.modelconfig import ModelConfig
from streams.dedupe import SeenSet

log = logging.getLogger(__name__)


def leaderboard_changed(before: Leaderboard | None, after: Leaderboard) -> bool:
    """True when anything but the timestamp differs."""
    if before is None:
        return True
    return msgspec.structs.replace(before, ts=after.ts) != after  # records compare field by field


class Stage2:
    """Models and leaderboards for every environment seen."""

    def __init__(
        self,
        *,
        state_dir: str | Path | None = None,
        models_factory: Callable[[str], EnvironmentModels] | None = None,
        dedupe_capacity: int = 200_000,
        max_pct: float = ModelConfig.max_pct,
        refit_share: float = 0.25,
        refit_clock: Callable[[], float] = time.monotonic,
        refit_max_lag_s: float = 0.0,
        refit_interval_s: float = 0.0,
    ) -> None:
        self.models: dict[str, EnvironmentModels] = {}
        self.max_pct = max_pct
        self.models_factory = models_factory or (lambda env: EnvironmentModels(env, config=ModelConfig(max_pct=max_pct)))
        self.state_dir = Path(state_dir) if state_dir else None
        self.seen = SeenSet(dedupe_capacity)
        self.job_types: dict[str, dict[str, Mapping[str, float | None]]] = {}  # env -> job type -> solo profile
        self.leaderboards: dict[str, Leaderboard] = {}
        self.counters: Counter[str] = Counter()
        self.refit_share = refit_share
        """Refits of an environment take at most this share of the time: after a refit of ``d`` seconds the next
        one waits ``d * (1 / share - 1)`` (:meth:`refits_due`).  A worker that keeps up is not held back (its
        refits are due every ``ModelConfig.refit_every`` observations and :attr:`refit_interval_s`, further apart); a saturated one spends
        the rest on its observations.  1.0: no wait."""
        self.refit_clock = refit_clock
        self.refit_ready_at: dict[str, float] = {}
        self.refit_max_lag_s = refit_max_lag_s
        """How far the stream may outrun an environment's refits (:meth:`behind`), in seconds of event time beyond
        the wall-clock seconds passed; 0: no bound."""
        self.refit_interval_s = refit_interval_s
        """Seconds of event time at least between an environment's refits (:meth:`due`): from when the rows of its
        served models were taken to the latest window learned; 0: no wait."""
        self.learned_ts: dict[str, float] = {}
        """Per environment: the latest window end learned."""
        self.fit_at: dict[str, tuple[float, float]] = {}
        """Per environment: (latest window end, :attr:`refit_clock`) when the served models' rows were taken (their
        first observation's before the first refit); ``refit_at``: the same of the refit in flight."""
        self.refit_at: dict[str, tuple[float, float]] = {}
        self.refit_on_drift: dict[str, bool] = {}
        """Per environment, whether the refit in flight was made due by drift (counted ``refits_on_drift`` when applied)."""
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
        self.seen.extend(_read_json(self._seen_path(), "the seen observation ids") or [])

    def _save_seen(self) -> None:
        _write_json(self._seen_path(), self.seen.items())

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
        covers = _read_json(self._covers_path(), "the offsets the model snapshot covers")
        try:
            self.covers = {int(p): int(o) for p, o in (covers or {}).items()}
        except (AttributeError, TypeError, ValueError) as exc:
            log.warning("could not load the offsets the model snapshot covers: %s", exc)

    def _save_covers(self, covers: Mapping[int, int]) -> None:
        _write_json(self._covers_path(), {str(p): o for p, o in {**self.covers, **covers}.items()})

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
        self._note_profiles(obs)
        self.learn(obs)
        self.counters["rebuilt"] += 1
        return True

    def leaderboard_of(self, env: str) -> Leaderboard | None:
        """The environment's leaderboard when it changed since the last one published."""
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
    def admit(self, obs: Observation) -> bool:
        """Note the solo profiles of ``obs``; True: it is to be served (and learned, if co-located), False: a
        duplicate of a co-located window learned before, or a window not understood (both counted)."""
        if not obs.colocated:
            if obs.occupancy != "solo" or obs.co_job_types:
                self.counters["windows_not_understood"] += 1
                return False
            self.counters["solo_windows"] += 1
            self.models_for(obs.environment)
            if obs.solo:
                self.job_types.setdefault(obs.environment, {})[obs.job_type] = obs.solo
            return True
        if not self.seen.add(obs.observation_id):
            self.counters["duplicates"] += 1
            return False
        self.counters["observations"] += 1
        self.models_for(obs.environment)
        self._note_profiles(obs)
        return True

    def _note_profiles(self, obs: Observation) -> None:
        known = self.job_types.setdefault(obs.environment, {})
        if obs.solo:
            known[obs.job_type] = obs.solo
        for jt, prof in zip(obs.co_job_types, obs.co_solo, strict=False):
            if prof:
                known.setdefault(jt, prof)

    def learn(self, obs: Observation, served: Served | None = None) -> None:
        """Learn a co-located observation :meth:`admit` let in (``served``: what its models answered it)."""
        self.models_for(obs.environment).learn(obs, served)
        self._learned_at(obs.environment, obs.window_end)

    def on_observation(self, obs: Observation, *, leaderboard: bool = True) -> Leaderboard | None:
        """Learn one observation (a solo window: note its profile); the environment's leaderboard when it changed
        (``leaderboard`` False: None, the caller asks :meth:`leaderboard_of` once for a batch)."""
        if not self.admit(obs) or not obs.colocated:
            return None
        self.learn(obs)
        return self._leaderboard(obs.environment) if leaderboard else None

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
        for env in self.models:
            if not self.due(env):
                continue
            if now < self.refit_ready_at.get(env, -math.inf):
                self.counters["refits_waited"] += 1
                continue
            out.append((env, self.refit_task(env)))
        return out

    def due(self, env: str) -> bool:
        """``env``'s models want a refit (:meth:`models.environment.EnvironmentModels.refit_due`: every
        ``refit_every`` observations, at drift, the first one) and, but for the first, :attr:`refit_interval_s` of
        event time has passed since the rows of its served models were taken.  A refit's cost does not depend on how
        many observations came since the last: without the interval a large fleet refits back to back (2,000 GPUs
        give ``refit_every`` = 500 observations every 3 s, and its served error rises as new job sets come: drift),
        a quarter of a core (:attr:`refit_share`) per environment."""
        m = self.models.get(env)
        if m is None or not m.refit_due():
            return False
        if self.refit_interval_s <= 0 or m.last_refit is None or env not in self.fit_at:
            return True
        fit_ts = self.fit_at[env][0]
        return self.learned_ts.get(env, fit_ts) - fit_ts >= self.refit_interval_s

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
        self.refit_on_drift[env] = self.models[env].drift.detected
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
        return ahead_s > self.refit_max_lag_s and (m.refit_in_flight or self.due(env))

    def apply_refit(self, env: str, result: Any) -> Leaderboard | None:
        self.models[env].apply_refit(result)
        taken = self.refit_at.pop(env, None)
        on_drift = self.refit_on_drift.pop(env, False)
        if result is not None:
            self.counters["refits_applied"] += 1
            self.counters["refits_on_drift"] += on_drift
            self.counters["refit_ms"] += round(getattr(result, "seconds", 0.0) * 1e3)
            if taken is not None:
                self.fit_at[env] = taken
        seconds = getattr(result, "seconds", None)
        if seconds is not None and 0.0 < self.refit_share < 1.0:
            self.refit_ready_at[env] = self.refit_clock() + seconds * (1.0 / self.refit_share - 1.0)
        return self._leaderboard(env)


def _read_json(path: Path | None, what: str) -> Any:
    """The JSON in ``path`` (None: no path, no file, or not JSON: logged as ``what``)."""
    if path is None or not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except Exception as exc:  # a damaged file must not stop the worker
        log.warning("could not load %s from %s: %s", what, path, exc)
        return None


def _write_json(path: Path | None, value: Any) -> None:
    """Write ``value`` to ``path`` as JSON, atomically (nothing without a path)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(value, separators=(",", ":")))
    os.replace(tmp, path)

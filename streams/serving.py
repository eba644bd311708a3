"""Serving sharded by GPU (setting ``serving`` sharded, issue 23): predictions, what-if entries and alerts of the
GPUs whose stage 1 runs here, from the latest model snapshot of their environment.  No Kafka, no faust.

Learning stays per environment (:class:`streams.stage2.Stage2` with ``serve=False``) and publishes snapshots
(:mod:`models.snapshot`, :mod:`streams.snapshots`); every worker applies the newest complete one
(:meth:`Serving.install`) and serves each observation its stage 1 emits (:meth:`Serving.serve`).  What is served
is a function of the snapshot and the observation only, so any worker serves a GPU as any other would:

- predictions: :func:`streams.stage2.predictions_of` with the snapshot's models;
- what-if entries: computed once per snapshot and set of running job types, with the snapshot's solo profiles of
  the running types (not the first asking window's: that would make the entries depend on which GPU asked first),
  in sorted order; a set with a type the snapshot does not know is computed for its window, uncached;
- alerts: the hysteresis state of a GPU's jobs lives in its stage-1 state (``GpuState.raised``), which moves
  with the GPU's partition through the stage-1 changelog, so a GPU's alerts neither repeat nor get lost when
  another worker takes it over.

Before the first snapshot of an environment arrives, its GPUs are served by models that learned nothing, as a
fresh stage 2 serves them: a solo window's prediction without what-if entries, no prediction for a co-located
window, alerts from measured rates only.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from events import Observation, WhatIf, to_dict
from models.environment import EnvironmentModels
from models.modelconfig import ModelConfig
from models.snapshot import ServingSnapshot, serving_models
from streams.hysteresis import next_state
from streams.stage2 import Output, WhatIfCache, alert_of, alert_value, predictions_of, solo_prediction, what_if_entries

Profile = Mapping[str, float | None]
MAX_RAISED = 16
"""Raised alerts a GPU remembers (its latest jobs')."""


class Serving:
    """The serving half of stage 2 for the GPUs read here."""

    def __init__(
        self,
        threshold_pct: float = 50.0,
        clear_pct: float = 35.0,
        *,
        clock: Callable[[], float] = time.time,
        max_pct: float = ModelConfig.max_pct,
    ) -> None:
        self.threshold = threshold_pct
        self.clear_level = clear_pct
        self.clock = clock
        self.max_pct = max_pct
        self.models: dict[str, EnvironmentModels] = {}
        self.known: dict[str, dict[str, Profile]] = {}
        self.versions: dict[str, int] = {}
        self.what_ifs = WhatIfCache()
        self.latest: dict[str, dict[str, dict[str, Any]]] = {}  # gpu -> job -> mode -> prediction dict
        self.counters: Counter[str] = Counter()

    # ------------------------------------------------------------ snapshots
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

    def apply(self, snapshot: ServingSnapshot, key: bytes) -> bool:
        """Build and :meth:`install` a decoded snapshot (in-process use; a worker builds in its reader's thread)."""
        return self.install(snapshot.environment, snapshot.version, serving_models(snapshot, key), snapshot.known)

    def models_for(self, environment: str) -> EnvironmentModels:
        m = self.models.get(environment)
        if m is None:  # no snapshot yet: models that learned nothing (see the module's docstring)
            m = self.models[environment] = EnvironmentModels(environment, config=ModelConfig(max_pct=self.max_pct))
            self.versions[environment] = -1
            self.counters["served_before_snapshot_envs"] += 1
        return m

    # --------------------------------------------------------------- serving
    def serve(self, obs: Observation, raised: list[str]) -> Output:
        """Predictions and alerts of one observation of a GPU read here; ``raised``: the job ids of the GPU with a
        raised alert (its stage-1 state, updated in place)."""
        out = Output()
        models = self.models_for(obs.environment)
        if self.versions.get(obs.environment, -1) < 0:
            self.counters["served_before_snapshot"] += 1
        now = self.clock()
        if obs.colocated:
            out.predictions = predictions_of(models, obs, lambda: self._what_if(models, obs), now, self.counters)
        elif obs.occupancy == "solo" and not obs.co_job_types:
            out.predictions = [solo_prediction(obs, self._what_if(models, obs), now=now)]
        else:
            self.counters["windows_not_understood"] += 1
            return out
        self.counters["served"] += 1
        value, source = alert_value(obs, out.predictions)
        if value is not None and (obs.colocated or obs.job_id in raised):  # alone: a raised alert clears
            before = obs.job_id in raised
            after = next_state(before, value, self.threshold, self.clear_level)
            if after != before:
                if after:
                    raised.append(obs.job_id)
                    del raised[:-MAX_RAISED]  # jobs that finished raised, long ago
                else:
                    raised.remove(obs.job_id)
                change = "raised" if after else "cleared"
                out.alerts.append(alert_of(obs, change, value, source, self.threshold, self.clear_level, now))
        for pred in out.predictions:
            self.latest.setdefault(obs.gpu_uuid, {}).setdefault(obs.job_id, {})[pred.mode] = to_dict(pred)
        return out

    def _what_if(self, models: EnvironmentModels, obs: Observation) -> list[WhatIf]:
        known = self.known.get(obs.environment, {})
        running = sorted(zip([obs.job_type, *obs.co_job_types], [obs.solo, *obs.co_solo], strict=False), key=lambda r: r[0])
        types = [t for t, _ in running]
        if all(t in known for t in types):
            return self.what_ifs.entries(models, known, types, [known[t] for t in types])
        self.counters["what_if_uncached"] += 1
        return what_if_entries(models, known, types, [s for _, s in running])

    def forget(self, gpus: Iterable[str]) -> None:
        """GPUs now read elsewhere: their latest predictions are that worker's to show."""
        for g in gpus:
            self.latest.pop(g, None)

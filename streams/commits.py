"""The one place that commits offsets, and what a commit covers.

Offsets are committed only right after the state they cover is saved: the input offsets (metrics, lifecycle) after a
stage-1 checkpoint (:meth:`Commits.checkpoint_and_commit`, on a timer), the observations offsets after the models are
saved (:meth:`Commits.save_models_and_commit`), and every topic's when faust commits on its own (a rebalance, a clean
stop), through :class:`WorkerMonitor`'s hook (:meth:`Commits.on_commit_initiated`).  faust's periodic commits are off
(:data:`AUTO_COMMIT_OFF_S`, :data:`AUTO_COMMIT_OFF_EVERY`).  Every output is acknowledged before the offsets that made
it are committed and before the checkpoint is written (:func:`streams.outputs.guard`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from faust.sensors import Monitor

from streams.metrics import StreamMetrics
from streams.outputs import Deliveries, guard
from streams.stage2 import Stage2
from streams.state import Stage1State

AUTO_COMMIT_OFF_S = 10.0**9  # faust's periodic commit timer: effectively never
AUTO_COMMIT_OFF_EVERY = 2**62  # faust's commit every N acked messages: never


class WorkerMonitor(Monitor):
    """faust's Monitor without its per-event bookkeeping, plus the worker's commit hook.

    The worker serves its own /metrics, so the Monitor's per-message counters, timings and
    per-stream lookups (four calls per event) are skipped; ``stream_inbound_time``, which
    faust's stalled-stream warnings read, is kept.  ``on_commit_initiated`` saves the state an
    offset commit covers right before faust computes the offsets (no await in between).
    """

    def __init__(self, on_commit: Callable[[], None]) -> None:
        super().__init__()
        self._on_commit = on_commit

    def on_message_in(self, tp: Any, offset: int, message: Any) -> None:
        return None

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> None:
        self.stream_inbound_time[tp] = time.monotonic()
        return None

    def on_stream_event_out(self, tp: Any, offset: int, stream: Any, event: Any, state: Any = None) -> None:
        return None

    def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
        return None

    def on_commit_initiated(self, consumer: Any) -> Any:
        self._on_commit()
        return super().on_commit_initiated(consumer)


@dataclass(eq=False)
class Commits:
    """Commit offsets after the state they cover (see the module's docstring)."""

    app: Any
    state: Stage1State
    stage2: Stage2
    deliveries: Deliveries
    metrics: StreamMetrics
    observations_topic: str
    publish_profiles: Callable[[], int]
    _own_commit: bool = False

    def on_commit_initiated(self) -> None:
        """Before faust commits offsets (our timers, a rebalance, a clean stop): take the state they cover, and put
        the changelog and profiles in the producer's buffer.  faust then flushes the buffer, which waits until every
        output is acknowledged and only then writes the stage-1 checkpoint taken here (:mod:`streams.outputs`)."""
        self.guard_outputs()
        self.publish_profiles()
        with self.state.encoding_once():  # each GPU's state encoded once for both
            self.publish_changelog()
            self.state.prepare_checkpoint()
        if not self._own_commit:  # a commit of every topic: observations too
            self.stage2.save()

    def publish_changelog(self) -> int:
        sent = self.state.publish_changelog()
        self.metrics.published["stage1_changelog"] += sent
        return sent

    async def commit(self, topics: set[str]) -> bool:
        """Commit the acked offsets of ``topics`` (the state they cover was just saved by the caller)."""
        self._own_commit = True
        try:
            return bool(await self.app.consumer.commit(topics))
        finally:
            self._own_commit = False

    def guard_outputs(self) -> None:
        """Outputs acknowledged before offsets are committed and the checkpoint written (once; :mod:`streams.outputs`)."""
        guard(self.app.producer, self.deliveries, self.state.write_prepared)

    async def checkpoint_and_commit(self) -> None:
        await self.state.offsets.commit()  # the input offsets; on_commit_initiated takes the checkpoint first
        await self.app.producer.buffer.flush()  # no offsets to commit: faust did not flush, and the checkpoint waits

    async def save_models_and_commit(self) -> None:
        self.stage2.save()
        await self.commit({self.observations_topic})
        self.stage2.counters["models_saved_committed"] += 1  # saved, and the offsets it covers committed

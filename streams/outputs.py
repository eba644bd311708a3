"""The worker's outputs: put on their topics (:class:`Publisher`, :class:`DirectSends`), and every one acknowledged by
the broker before the offsets that produced it are committed (:class:`Deliveries`, :func:`guard`).

The worker hands its outputs to the producer without awaiting them: predictions, alerts and the stage-1 changelog
through :class:`DirectSends` (faust's transport ``send`` from a task of their own), the rest (observations, dead
letters, profiles, snapshots) with faust's ``send_soon`` into its buffer, which faust flushes before it commits
offsets.  faust's flush (``ProducerBuffer.flush_atmost``) returns as soon as no record has left the buffer for 0.1 s,
however many are still in it, and the commit goes ahead.  Measured at 2,000 GPUs on this machine: it returned with up
to 855 records still buffered (docs/RELIABILITY.md, "Outputs before offsets").  A worker killed then had committed
input offsets, and written the stage-1 checkpoint, for observations that were never sent: lost, since the events
read again after a restart are duplicates of the checkpoint's.

:class:`Deliveries` keeps every record handed over (a future done when the broker acknowledged it), and :func:`guard`
puts :meth:`Deliveries.drain` in the place of the buffer's flush, which every commit of faust's awaits right before it
commits (our timers', a rebalance's, a clean stop's): it waits until every record handed over before the commit is
acknowledged (each path sends its records in order, in a task of its own), then calls ``after`` (the stage-1
checkpoint taken when the commit began, written only now: the saved state never claims an output the broker has not
got).  Nothing is faust-specific but the names it uses: ``producer.send_soon``, ``producer.buffer.flush`` and
``producer.send``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from events import Observation, Prediction, encode, observation_batches

if TYPE_CHECKING:
    from config import Settings
    from streams.metrics import StreamMetrics
    from streams.serving import Output

log = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 30.0
"""How long a commit waits for its outputs; past it the commit goes ahead as faust's would (logged and counted)."""


class Deliveries:
    """The records handed to the producer and not yet acknowledged; what draining them found (``counters``)."""

    def __init__(self, counters: Counter[str] | None = None) -> None:
        self.pending: set[asyncio.Future[Any]] = set()
        self.counters: Counter[str] = counters if counters is not None else Counter()

    def track(self, fut: asyncio.Future[Any]) -> None:
        self.pending.add(fut)
        fut.add_done_callback(self._done)

    def _done(self, fut: asyncio.Future[Any]) -> None:
        self.pending.discard(fut)
        if not fut.cancelled() and fut.exception() is not None:
            self.counters["outputs_failed"] += 1  # faust logged it; the commit does not wait for a record that failed

    async def drain(self, flush: Callable[[], Awaitable[None]], buffered: Callable[[], int], timeout_s: float) -> bool:
        """Wait until every record handed over so far is acknowledged (faust's ``flush`` first, for any handed over
        before tracking began); False when ``timeout_s`` passed first (those left are counted and logged).

        Records handed over while it waits are not waited for: they come from events beyond the offsets this commit
        covers, and under a steady input the buffer is never empty for long."""
        deadline = time.monotonic() + timeout_s
        waiting = set(self.pending)
        await flush()
        if buffered():
            self.counters["outputs_flush_short"] += 1  # faust's flush returned with records still buffered
        waiting = {f for f in waiting if not f.done()}
        if waiting:
            await asyncio.wait(waiting, timeout=max(0.0, deadline - time.monotonic()))
        left = sum(not f.done() for f in waiting)
        if left:
            self.counters["outputs_undelivered_at_commit"] += left
            log.warning("%d outputs not acknowledged within %.0f s of a commit: committing as faust would", left, timeout_s)
            return False
        return True


def guard(producer: Any, deliveries: Deliveries, after: Callable[[], None], timeout_s: float = DRAIN_TIMEOUT_S) -> None:
    """Track every record ``producer`` is handed and replace its buffer's flush by :meth:`Deliveries.drain` followed by
    ``after()`` (once per producer: a second call does nothing)."""
    if getattr(producer, "aip_deliveries", None) is deliveries:
        return
    buffer = producer.buffer
    faust_flush = buffer.flush
    faust_send_soon = producer.send_soon

    def send_soon(fut: Any) -> None:
        deliveries.track(fut)
        faust_send_soon(fut)

    async def flush() -> None:
        await deliveries.drain(faust_flush, lambda: int(buffer.size), timeout_s)
        after()

    producer.send_soon = send_soon
    buffer.flush = flush
    producer.aip_deliveries = deliveries


class DirectSends:
    """Records handed straight to faust's producer (its transport's ``send``, which hands each to aiokafka), in the
    order given, by one task of their own while any are waiting.

    A record sent with faust's ``send_soon`` becomes a ``FutureMessage`` (its key and value through the topic's
    schema), waits in faust's buffer for its task, goes out through the topic's ``publish_message`` (the sensors,
    the producer looked up) and comes back through ``_on_published`` and the ``FutureMessage``'s callbacks: at 2,000
    GPUs about 4.5 % of a worker's CPU, predictions most of it (docs/BENCHMARKS.md, "Outputs sent without faust's
    buffer").  Here a record is a tuple and a future.  The records on the topic are the same: the same producer, key
    partitioner, key and value bytes, no headers, the time it is handed to aiokafka as its timestamp.

    Each record's future is tracked by :class:`Deliveries` from the moment it is handed over, so that a commit
    waits for it (and a stop that leaves it unsent keeps the last checkpoint) as for faust's buffer."""

    def __init__(self, producer: Callable[[], Any], deliveries: Deliveries) -> None:
        self.producer, self.deliveries = producer, deliveries
        """``producer()``: faust's producer (the app's, made when first asked)."""
        self.queue: deque[tuple[str, bytes | None, bytes, int | None, asyncio.Future[Any]]] = deque()
        self.task: asyncio.Task[None] | None = None

    def soon(self, topic: str, key: bytes | None, value: bytes, partition: int | None = None) -> None:
        """Hand a record over (from the event loop's thread); it is sent after those handed over before it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self.deliveries.track(fut)
        self.queue.append((topic, key, value, partition, fut))
        if self.task is None or self.task.done():  # a task ends when nothing waits: no task to stop with the worker
            self.task = loop.create_task(self._send())

    async def _send(self) -> None:
        send, queue = self.producer().send, self.queue
        while queue:
            topic, key, value, partition, fut = queue.popleft()
            try:
                ack = await send(topic, key, value, partition, None, [])
            except Exception as exc:  # counted (Deliveries); the records after it are still sent
                log.warning("could not send a record to %s: %r", topic, exc)
                fut.set_exception(exc)
                continue
            ack.add_done_callback(functools.partial(_settle, fut, topic))


def _settle(fut: asyncio.Future[Any], topic: str, ack: asyncio.Future[Any]) -> None:
    """``fut`` as the broker answered ``ack`` (its acknowledgement, or why not)."""
    if fut.done():
        return
    if ack.cancelled():
        fut.cancel()
    elif (exc := ack.exception()) is not None:
        log.warning("a record to %s was not acknowledged: %r", topic, exc)
        fut.set_exception(exc)
    else:
        fut.set_result(ack.result())


class Publisher:
    """Sends the worker's records on its output topics, and counts them (``metrics.published``).

    Most are handed over without being awaited (an awaited faust send cost about 1 ms per record here): every commit
    waits for them first (:class:`Deliveries`), so delivery stays at least once."""

    def __init__(
        self, settings: Settings, out: dict[str, Any], observations: Any, metrics: StreamMetrics, direct: DirectSends
    ) -> None:
        self.settings, self.observations, self.metrics = settings, observations, metrics
        self.out = out
        """Topic name (predictions, alerts, leaderboard, deadletter) -> faust topic."""
        self.direct = direct
        """Predictions and alerts go out through it (a few per observation)."""
        self.names = {name: topic.get_topic_name() for name, topic in out.items()}

    async def send(self, name: str, key: str | None, record: Any) -> None:
        await self.out[name].send(key=None if key is None else key.encode(), value=encode(record))
        self.metrics.published[name] += 1

    def served(self, out: Output) -> None:
        """Buffer what serving an observation gave, its predictions and alerts (an awaited send each held stage 2 at
        about 1 ms per record)."""
        for p in out.predictions:
            self.prediction(p)
        for a in out.alerts:
            self.direct.soon(self.names["alerts"], a.gpu_uuid.encode(), encode(a))
        self.metrics.published["alerts"] += len(out.alerts)

    def prediction(self, p: Prediction) -> None:
        """Hand one prediction over (:class:`DirectSends`); count it, and its delay from its window's end."""
        self.direct.soon(self.names["predictions"], p.gpu_uuid.encode(), encode(p))
        self.metrics.published["predictions"] += 1
        if p.window_end is not None:
            self.metrics.prediction_delay.observe(max(0.0, p.ts - p.window_end))  # a replay's event time may be ahead

    def observations_out(self, observations: list[Observation]) -> None:
        """Buffer observations and count them (observations, not records): one :class:`events.ObservationBatch` per
        environment (setting ``observation_batch_bytes``), or one record each (0)."""
        if not observations:
            return
        if self.settings.observation_batch_bytes:
            self.emit_observations(observations)
        else:
            for o in observations:
                self.emit_observation(o)
        self.metrics.published["observations"] += len(observations)

    def emit_observations(self, observations: list[Observation]) -> None:
        """Buffer observations as :class:`events.ObservationBatch` records of one environment each.

        Measured (docs/BENCHMARKS.md, "Host-batched samples"): one record per observation cost the host-batched
        stage 1 most of its time outside stage 1 itself (faust's and aiokafka's per-message work, and one produce
        request per few records)."""
        for env, value, _n in observation_batches(observations, self.settings.observation_batch_bytes):
            self.observations.send_soon(key=env.encode(), value=value)

    def emit_observation(self, obs: Observation) -> None:
        self.observations.send_soon(key=obs.environment.encode(), value=encode(obs))

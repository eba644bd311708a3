"""The worker's faust app: faust's Kafka transport with the fetch wait a setting (``fetch_max_wait_s``), whose
consumer leaves its group when it stops (``leave_group_on_stop``, static members too: :mod:`streams.membership`).

faust's aiokafka driver fixes ``fetch_max_wait_ms`` at 1,500 ms.  On Apache Kafka the wait only bounds how
long a fetch is held while fewer than ``fetch_min_bytes`` (1) are new, so a shorter one costs a few more
empty fetches per second when idle and nothing when busy.  Measured on the embedded broker (docs/BENCHMARKS.md,
"Host-batched samples"): stage 1 read the same host-batched fleet in 3.4-6.4 s with 1,500 ms and 1.7-1.9 s with
100 or 250 ms, with the same observations; consumers of host batches spent the difference idle in ``epoll``.

Its fetch loop hands each message to faust's conductor by :func:`deliver` (``direct_delivery``): faust's awaited
``wait_first(callback(message), suspend_flow.wait())`` per message, four tasks made and three cancelled, three
event-loop turns, about a third of faust's cost per message (docs/BENCHMARKS.md, "Stage 1").  The agents take
their batches straight from their streams' queues (:func:`take_batches`), without faust's stream iterator.
"""

from __future__ import annotations

import asyncio
import math
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from typing import Any, cast

import faust
from aiokafka.partitioner import DefaultPartitioner
from faust.tables import TableManager
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as driver
from mode.utils.futures import maybe_async

from streams.membership import leave_on_close


class _ConsumerThread(driver.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = self.app.fetch_max_wait_ms  # read by aiokafka when it starts its fetcher
        return consumer

    async def on_start(self) -> None:
        await super().on_start()  # starts the aiokafka consumer, which creates its group coordinator
        coordinator = getattr(self._consumer, "_coordinator", None)
        if self.app.leave_group_on_stop and coordinator is not None:
            leave_on_close(coordinator)

    def group_member(self) -> dict[str, Any]:
        """What the consumer knows of its group membership (for the liveness log): member id, generation, instance."""
        coordinator = getattr(self._consumer, "_coordinator", None)
        if coordinator is None:
            return {}
        return {
            "member_id": coordinator.member_id,
            "generation": coordinator.generation,
            "group_instance_id": coordinator._group_instance_id,
        }


@types.coroutine
def _resumed(coro: Coroutine[Any, Any, Any], yielded: Any) -> Generator[Any, Any, Any]:
    """The rest of ``coro``, which yielded ``yielded`` at its first step: what ``yield from coro`` would have done
    from there (each value it yields passed to the task that drives this, each result or exception sent back)."""
    try:
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation or the awaited future's exception: coro's to handle
                yielded = coro.throw(exc)
            else:
                yielded = coro.send(sent)
    except StopIteration as stop:
        return stop.value


async def _finish(coro: Coroutine[Any, Any, Any], yielded: Any) -> Any:
    return await _resumed(coro, yielded)


async def deliver(
    callback: Callable[[Any], Coroutine[Any, Any, Any]], message: Any, suspend_flow: asyncio.Event,
    wait_first: Callable[..., Awaitable[Any]],
) -> None:  # fmt: skip
    """Hand ``message`` to faust's ``callback`` (the conductor: decode, then each subscribed stream's buffer) as faust's
    fetcher does, ``wait_first(callback(message), suspend_flow.wait())``, without its four tasks per message when the
    callback does not have to wait.  The callback's first step runs here: done (the common case: a stream buffer with
    room), it is delivered; else (a full buffer, the flow suspended by a rebalance) the rest of it runs in a task
    raced against ``suspend_flow`` exactly as faust's does.  With the flow already suspended, faust's own way."""
    if suspend_flow.is_set():
        await wait_first(callback(message), suspend_flow.wait())
        return
    coro = callback(message)
    try:
        yielded = coro.send(None)
    except StopIteration:
        return
    await wait_first(asyncio.ensure_future(_finish(coro, yielded)), suspend_flow.wait())


TAKE_SLICE_S = 0.005
"""The shortest slice of a batch wait after which :func:`take_batches` looks whether ``max_`` events wait (an eighth
of the wait, at least this): reading a backlog, a batch goes as soon as it is full, as faust's does."""


async def take_batches(stream: Any, max_: int, within_s: float) -> AsyncIterator[list[Any]]:
    """Lists of up to ``max_`` events of an agent's ``stream``, as faust's ``stream.take_events(max_, within_s)``
    gives them, taken straight from the queue of the stream's channel: faust's stream hands each event through its
    iterator, one event-loop turn (``sleep(0)``) and one processor call an event, and wakes every ``within_s`` with
    nothing to take (docs/BENCHMARKS.md, "Batches taken from the stream's queue").

    A batch is taken ``within_s`` after the previous one was handled (faust's timeout), as soon as ``max_`` events
    wait (looked at every eighth of the wait), and after a quiet spell as soon as an event comes.  An event of an
    earlier generation of the group, or read while the flow is stopped (a rebalance), is dropped unacknowledged as
    faust's stream drops it; the others are tracked as faust's stream tracks them (a rebalance waits for them to be
    acknowledged).  A batch's events are acknowledged when the next batch is asked for, once the caller has handled
    them, and not when the caller gave up on them (an exception, a cancelled task): an event that was not handled
    is never committed.  faust stops an agent's actor by throwing ``StopAsyncIteration`` into the channel: the
    batches end there."""
    app, queue = stream.app, stream.channel.queue
    consumer, acking = app.consumer, app.topics.acking_topics
    loop = asyncio.get_running_loop()
    handled = -math.inf
    while not stream.should_stop:
        try:
            taken = [] if not queue.empty() else [await queue.get()]
            while len(taken) + queue.qsize() < max_ and (wait_s := handled + within_s - loop.time()) > 0:
                await asyncio.sleep(min(wait_s, max(TAKE_SLICE_S, within_s / 8)))  # a slice: not a turn an event
            while len(taken) < max_ and not queue.empty():
                taken.append(queue.get_nowait())
        except StopAsyncIteration:  # the actor stopped
            return
        events = []
        for event in taken:
            message = event.message
            if not app.flow_control.is_active() or message.generation_id != app.consumer_generation_id:
                continue
            if message.topic in acking and not message.tracked:
                message.tracked = True
                consumer.unacked.add(message)
                stream._on_message_in(message.tp, message.offset, message)
            stream._on_stream_event_in(message.tp, message.offset, stream, event)
            for processor in stream._processors:  # none in the worker; faust's test wrapper counts events so
                await maybe_async(processor(event.value))
            events.append(event)
        if events:
            yield events
            for event in events:
                await stream.ack(event)
        handled = loop.time()


PRESSURE_FETCH_S = 0.05
"""The fetch's wait while some partition is out of the fetch for its stream's full buffer (faust's: 1 s)."""


class _Consumer(driver.Consumer):
    _room: asyncio.Event | None = None
    """Set when a stream buffer that was under pressure drops back (faust's ``on_buffer_drop``)."""

    def _new_consumer_thread(self) -> Any:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def on_buffer_drop(self, tp: Any) -> None:
        super().on_buffer_drop(tp)
        if self._room is not None:
            self._room.set()

    async def _wait_for_room(self, timeout_s: float = 1.0) -> None:
        """While every partition waits for its stream's buffer (taken out of the fetch under pressure), until one has
        room again, at most ``timeout_s``: faust's ``getmany`` with no partition to fetch sleeps 1 s whatever happens.
        Delivering without faust's tasks fills a buffer faster than its stream empties it."""
        if self._room is None:
            self._room = asyncio.Event()
        self._room.clear()
        if self._buffered_partitions and not self._get_active_partitions():
            try:
                await asyncio.wait_for(self._room.wait(), timeout_s)
            except TimeoutError:
                pass

    async def _drain_messages(self, fetcher: Any) -> None:  # pragma: no cover  (the worker's fetch loop; run by faust)
        """faust's fetch loop (faust-streaming 0.15.3, ``Consumer._drain_messages``), each message handed over by
        :func:`deliver`: faust's ``wait_first`` per message made four tasks and cancelled three, a third of its cost
        per message (docs/BENCHMARKS.md, "Stage 1").  The fetch waits :data:`PRESSURE_FETCH_S` while a partition is
        out for its stream's full buffer, and for a buffer to drop when none is left (:meth:`_wait_for_room`).
        Unchanged otherwise: offsets read, gaps, commits."""
        if not self.app.direct_delivery:
            await super()._drain_messages(fetcher)
            return
        callback = self.callback
        getmany = self.getmany
        consumer_should_stop = cast(Any, self)._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        get_read_offset = self._read_offset.__getitem__
        set_read_offset = self._read_offset.__setitem__
        set_flag, unset_flag = self.diag.set_flag, self.diag.unset_flag
        commit_every = self._commit_every
        acks_enabled_for = self.app.topics.acks_enabled_for
        suspend_flow, wait_first = self.suspend_flow, self.wait_first
        yield_every, num_since_yield = 100, 0
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                await self._wait_for_room()
                set_flag(CONSUMER_FETCHING)
                # with partitions out of the fetch for a full buffer, a short fetch: a 1 s one of the others, which
                # may have nothing new, kept the buffer's partitions waiting (measured: 1 s stalls, half the run)
                ait = getmany(timeout=PRESSURE_FETCH_S if self._buffered_partitions else 1.0)
                await self.sleep(0)  # as faust: getmany may be called in a loop never releasing the event loop
                if not self.should_stop:
                    async for tp, message in ait:
                        num_since_yield += 1
                        if num_since_yield > yield_every:
                            await asyncio.sleep(0)
                            num_since_yield = 0
                        offset = message.offset
                        r_offset = get_read_offset(tp)
                        if r_offset is None or offset >= r_offset:
                            gap = offset - (r_offset or 0)
                            if gap > 1 and r_offset and acks_enabled_for(message.topic):
                                await self._add_gap(tp, r_offset + 1, offset)
                            if commit_every is not None and self._n_acked >= commit_every:
                                self._n_acked = 0
                                await self.commit()
                            await deliver(callback, message, suspend_flow, wait_first)
                            set_read_offset(tp, offset)
                    unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            unset_flag(CONSUMER_FETCHING)


class RawSchema(faust.Schema):
    """Keys and values as the broker gave them (bytes, or None), for topics whose serializers are ``raw``.

    faust's schema passes each key and value through its codec registry and model reconstruction, which with ``raw``
    serializers return the same bytes: 4-5 us a message against 2 us (docs/BENCHMARKS.md, "Followers that wait,
    messages without faust's codecs").  Sending is faust's (``dumps_key``/``dumps_value``)."""

    def __init__(self) -> None:
        super().__init__(key_serializer="raw", value_serializer="raw")

    def compile(self, app: Any, *, default_propagate: bool = False, **_on_errors: Any) -> Any:
        create_event = app.create_event

        async def decode(message: Any, *, propagate: bool = default_propagate) -> Any:
            return create_event(message.key, message.value, message.headers, message)

        return decode


class KeyPartitioner:
    """aiokafka's default partitioner (murmur2 of the key, as Java's clients), its answer kept per key and partition
    list: a worker sends each GPU's predictions under the same few thousand keys, and murmur2 in Python costs 6-8 us a
    key against 0.5-1.4 us from the cache (docs/BENCHMARKS.md).  A key-less record goes where the default sends it."""

    def __init__(self, capacity: int = 65_536) -> None:
        self.default = DefaultPartitioner()
        self.capacity = capacity
        self.known: dict[tuple[bytes, tuple[int, ...]], int] = {}

    def __call__(self, key: Any, all_partitions: list[int], available: list[int]) -> int:
        if type(key) is not bytes:
            return int(self.default(key, all_partitions, available))
        k = (key, tuple(all_partitions))
        partition = self.known.get(k)
        if partition is None:
            if len(self.known) >= self.capacity:
                self.known.clear()
            partition = self.known[k] = int(self.default(key, all_partitions, available))
        return partition


class _Transport(driver.Transport):
    Consumer = _Consumer


class _TableManager(TableManager):  # type: ignore[misc]
    async def on_start(self) -> None:
        """faust's, without its first 1 s sleep (it lets tables defined late register; this app defines none, and
        its consumer subscribes only once the manager started: every worker start waited it)."""
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


class App(faust.App):
    """:class:`faust.App` whose consumers wait at most ``fetch_max_wait_s`` for new records, hand messages over by
    :func:`deliver` (``direct_delivery``) and leave their group when they stop (``leave_group_on_stop``), and whose
    table manager starts at once."""

    def __init__(
        self, *args: Any, fetch_max_wait_s: float = 1.5, leave_group_on_stop: bool = True, direct_delivery: bool = True,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        self.fetch_max_wait_ms = max(1, round(fetch_max_wait_s * 1000.0))
        self.leave_group_on_stop = leave_group_on_stop
        self.direct_delivery = direct_delivery
        """Each fetched message handed to faust's conductor by :func:`deliver` (False: by faust's own fetch loop)."""
        kwargs.setdefault("TableManager", _TableManager)
        super().__init__(*args, **kwargs)

    def group_member(self) -> dict[str, Any]:
        """The consumer's group membership as far as it knows (empty before it started)."""
        thread = getattr(self.consumer, "_thread", None)
        member = getattr(thread, "group_member", None)
        return member() if member is not None else {}

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)

    async def _on_partitions_revoked(self, revoked: set[Any]) -> None:
        """faust's, with the flow stopped at every rebalance.  faust stops it only when the worker held partitions:
        a worker whose last assignment was empty (a third member of a group of 4 partitions gets none) kept fetching
        through the rebalance, and what it fetched for its new partitions before the recovery's seek to the committed
        offsets was lost (its stream buffer cleared when the flow resumed, or the seek's re-read dropped as read
        already): the `rebalance` fault scenario lost 10-44 of 381 windows that way, 2026-12-04, the worker's
        ``input_offsets_skipped`` 200-499.  The recovery resumes the flow once it has sought (faust's
        ``Recovery._resume_streams``)."""
        if not self.should_stop and not self.consumer.assignment():
            self.consumer.stop_flow()
            self.flow_control.suspend()
        await super()._on_partitions_revoked(revoked)

    async def maybe_start_producer(self) -> Any:
        """The started producer at once.  faust's is a ``stampede`` (callers share one future): three event-loop turns
        per call, and faust's producer buffer calls it for every record it sends.  With a task holding the loop 50 ms
        a turn, a buffered record waited 9.5 s at the median, 0.11 s with this (docs/BENCHMARKS.md, "The producer
        buffer's pace")."""
        producer = self.producer
        if producer.started and not self.in_transaction:
            return producer
        return await super().maybe_start_producer()

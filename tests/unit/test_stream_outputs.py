"""Outputs acknowledged before offsets are committed (streams/outputs.py), against faust's own ProducerBuffer."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace
from typing import Any

from faust.transport.producer import ProducerBuffer

from streams.outputs import Deliveries, DirectSends, guard


class _Channel:
    """A topic whose broker takes ``send_s`` to take each record, and acknowledges it ``ack_s`` later."""

    def __init__(self, send_s: float, ack_s: float) -> None:
        self.send_s, self.ack_s = send_s, ack_s
        self.acked: list[int] = []

    async def publish_message(self, fut: Any, wait: bool = False) -> None:
        await asyncio.sleep(self.send_s)
        asyncio.get_running_loop().call_later(self.ack_s, self._ack, fut)

    def _ack(self, fut: Any) -> None:
        self.acked.append(fut.message.n)
        fut.set_result(fut.message.n)


def _message(channel: _Channel, n: int) -> asyncio.Future[Any]:
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    fut.message = SimpleNamespace(channel=channel, n=n)  # type: ignore[attr-defined]
    return fut


class _Producer:
    """The two names :func:`streams.outputs.guard` wraps, around faust's real buffer."""

    def __init__(self, buffer: ProducerBuffer) -> None:
        self.buffer = buffer

    def send_soon(self, fut: Any) -> None:
        self.buffer.put(fut)


async def _run(guarded: bool) -> tuple[int, list[int], Counter[str], list[int]]:
    """Ten records through a slow broker (0.15 s a record: longer than faust's 0.1 s patience), then a commit's flush.
    Returns (records left in the buffer after the flush, acknowledged by then, counters, acknowledged when ``after``
    ran)."""
    buffer = ProducerBuffer()
    buffer.app = SimpleNamespace(conf=SimpleNamespace(producer_threaded=False))  # type: ignore[assignment]
    await buffer.start()
    channel = _Channel(send_s=0.15, ack_s=0.05)
    producer = _Producer(buffer)
    counters: Counter[str] = Counter()
    at_after: list[int] = []
    if guarded:
        guard(producer, Deliveries(counters), lambda: at_after or at_after.extend(channel.acked), timeout_s=10.0)
    try:
        for n in range(10):
            producer.send_soon(_message(channel, n))
        await buffer.flush()  # what faust awaits right before it commits offsets
        return buffer.size, list(channel.acked), counters, at_after
    finally:
        while buffer.size:  # let the rest go before stopping (faust refuses to stop with records buffered)
            await asyncio.sleep(0.05)
        await buffer.stop()


def test_faust_flush_returns_before_the_buffer_is_sent() -> None:
    """The gap itself: faust's flush gives up after 0.1 s without a send, records still buffered."""
    left, acked, _counters, _after = asyncio.run(_run(guarded=False))
    assert left > 0
    assert len(acked) < 10


def test_guarded_flush_waits_for_every_acknowledgement_then_writes_the_checkpoint() -> None:
    left, acked, counters, at_after = asyncio.run(_run(guarded=True))
    assert left == 0
    assert sorted(acked) == list(range(10))
    assert sorted(at_after) == list(range(10))  # the checkpoint was written after the last acknowledgement
    assert counters["outputs_flush_short"] >= 1  # faust's flush came back early, and was asked again
    assert counters["outputs_undelivered_at_commit"] == 0


def test_records_handed_over_during_the_drain_are_not_waited_for() -> None:
    """Under a steady input the buffer is never empty: the drain waits for what came before the commit only."""

    async def run() -> tuple[bool, Counter[str], int]:
        loop = asyncio.get_running_loop()
        deliveries = Deliveries()
        before = [loop.create_future() for _ in range(3)]
        for f in before:
            deliveries.track(f)
            loop.call_later(0.05, f.set_result, None)
        later: list[asyncio.Future[Any]] = []

        async def flush() -> None:  # the agents keep producing while the commit waits, and nothing after is acked
            for _ in range(3):
                fut = loop.create_future()
                later.append(fut)
                deliveries.track(fut)

        ok = await deliveries.drain(flush, lambda: len(later), timeout_s=5.0)
        for f in later:
            f.cancel()
        return ok, deliveries.counters, sum(f.done() for f in before)

    ok, counters, acked = asyncio.run(run())
    assert ok is True and acked == 3
    assert counters["outputs_undelivered_at_commit"] == 0


def test_drain_past_its_timeout_reports_what_is_left() -> None:
    async def run() -> tuple[bool, Counter[str]]:
        deliveries = Deliveries()
        never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        deliveries.track(never)

        async def flush() -> None:
            return None

        ok = await deliveries.drain(flush, lambda: 0, timeout_s=0.05)
        never.cancel()
        return ok, deliveries.counters

    ok, counters = asyncio.run(run())
    assert ok is False
    assert counters["outputs_undelivered_at_commit"] == 1


def test_failed_records_are_counted_and_not_waited_for() -> None:
    async def run() -> tuple[bool, Counter[str], int]:
        deliveries = Deliveries()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        deliveries.track(fut)
        fut.set_exception(RuntimeError("MessageSizeTooLarge"))
        await asyncio.sleep(0)  # done callbacks run on the loop

        async def flush() -> None:
            return None

        return await deliveries.drain(flush, lambda: 0, timeout_s=1.0), deliveries.counters, len(deliveries.pending)

    ok, counters, pending = asyncio.run(run())
    assert ok is True and pending == 0
    assert counters["outputs_failed"] == 1


def test_guard_installs_once() -> None:
    buffer = SimpleNamespace(flush=None, size=0)
    producer = SimpleNamespace(buffer=buffer, send_soon=lambda fut: None)
    deliveries = Deliveries()
    guard(producer, deliveries, lambda: None)
    first = (producer.send_soon, buffer.flush)
    guard(producer, deliveries, lambda: None)
    assert (producer.send_soon, buffer.flush) == first


class _Broker:
    """faust's producer ``send`` (its transport's): takes ``send_s`` to take a record, acknowledges it ``ack_s``
    later; a record whose value is ``refused`` raises at the send, one that is ``lost`` is never acknowledged well."""

    def __init__(self, send_s: float = 0.01, ack_s: float = 0.05) -> None:
        self.send_s, self.ack_s = send_s, ack_s
        self.taken: list[tuple[Any, ...]] = []
        self.acked: list[bytes] = []

    async def send(self, topic: str, key: Any, value: bytes, partition: Any, timestamp: Any, headers: Any) -> Any:
        await asyncio.sleep(self.send_s)
        if value == b"refused":
            raise RuntimeError("MessageSizeTooLarge")
        self.taken.append((topic, key, value, partition, timestamp, headers))
        ack: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(self.ack_s, self._ack, ack, value)
        return ack

    def _ack(self, ack: asyncio.Future[Any], value: bytes) -> None:
        if value == b"lost":
            ack.set_exception(RuntimeError("NotLeaderForPartition"))
        else:
            self.acked.append(value)
            ack.set_result(len(self.acked))


def test_direct_sends_go_out_in_order_and_a_commit_waits_for_their_acknowledgements() -> None:
    async def run() -> tuple[_Broker, list[bytes], bool, int]:
        broker, deliveries = _Broker(), Deliveries()
        direct = DirectSends(lambda: broker, deliveries)
        for n in range(5):
            direct.soon("preds", b"GPU-1", b"%d" % n)
        direct.soon("log", b"bucket", b"5", 3)
        acked_at_commit: list[bytes] = []

        async def flush() -> None:  # faust's buffer holds nothing here
            return None

        ok = await deliveries.drain(flush, lambda: 0, timeout_s=5.0)
        acked_at_commit.extend(broker.acked)
        await asyncio.sleep(0)
        return broker, acked_at_commit, ok, len(deliveries.pending)

    broker, acked_at_commit, ok, pending = asyncio.run(run())
    assert ok is True and pending == 0
    assert acked_at_commit == [b"0", b"1", b"2", b"3", b"4", b"5"]  # every record handed over before the commit
    assert broker.taken[0] == ("preds", b"GPU-1", b"0", None, None, []) and broker.taken[-1] == (
        "log",
        b"bucket",
        b"5",
        3,
        None,
        [],
    )
    assert [t[2] for t in broker.taken] == [b"0", b"1", b"2", b"3", b"4", b"5"]


def test_a_direct_send_that_fails_is_counted_and_the_records_after_it_still_go() -> None:
    async def run() -> tuple[_Broker, Counter[str], bool]:
        broker, deliveries = _Broker(), Deliveries()
        direct = DirectSends(lambda: broker, deliveries)
        for value in (b"a", b"refused", b"lost", b"b"):
            direct.soon("preds", None, value)

        async def flush() -> None:
            return None

        ok = await deliveries.drain(flush, lambda: 0, timeout_s=5.0)
        await asyncio.sleep(0)
        return broker, deliveries.counters, ok

    broker, counters, ok = asyncio.run(run())
    assert ok is True
    assert broker.acked == [b"a", b"b"]
    assert counters["outputs_failed"] == 2  # refused at the send, and never acknowledged

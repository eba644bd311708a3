"""The worker's fetch loop hands each message to faust's conductor by ``streams.consumer.deliver``: at once when the
callback does not wait, else the rest of it raced against the suspended flow as faust does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streams.consumer import deliver


class Recorder:
    """faust's ``Service.wait_first`` stand-in: runs the awaitables given, records what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def wait_first(self, *aws: Any) -> None:
        self.calls.append(aws)
        tasks = [asyncio.ensure_future(a) for a in aws]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for t in done:
            t.result()


def test_a_callback_that_does_not_wait_is_delivered_without_tasks() -> None:
    got: list[str] = []

    async def callback(message: str) -> str:
        got.append(message)
        return message

    async def main() -> None:
        r = Recorder()
        await deliver(callback, "m1", asyncio.Event(), r.wait_first)
        assert got == ["m1"]
        assert r.calls == []

    asyncio.run(main())


def test_a_callback_that_waits_finishes_in_a_task_raced_against_the_flow() -> None:
    got: list[Any] = []

    async def main() -> None:
        room: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def callback(message: str) -> None:
            got.append(("first", message))
            value = await room  # a full stream buffer: waits for room
            got.append(("after", value))
            await asyncio.sleep(0)  # a bare yield too
            got.append("done")

        r = Recorder()
        asyncio.get_running_loop().call_later(0.01, room.set_result, 7)
        await deliver(callback, "m2", asyncio.Event(), r.wait_first)
        assert got == [("first", "m2"), ("after", 7), "done"]
        assert len(r.calls) == 1 and len(r.calls[0]) == 2  # the callback's rest, the flow's wait

    asyncio.run(main())


def test_exceptions_reach_the_fetch_loop_before_and_after_a_wait() -> None:
    async def bad_at_once(message: str) -> None:
        raise ValueError(message)

    async def main() -> None:
        r = Recorder()
        with pytest.raises(ValueError, match="now"):
            await deliver(bad_at_once, "now", asyncio.Event(), r.wait_first)
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def bad_later(message: str) -> None:
            await gate
            raise KeyError(message)

        asyncio.get_running_loop().call_later(0.01, gate.set_result, None)
        with pytest.raises(KeyError, match="later"):
            await deliver(bad_later, "later", asyncio.Event(), r.wait_first)

    asyncio.run(main())


def test_a_waiting_callback_sees_the_exception_of_what_it_awaits() -> None:
    got: list[str] = []

    async def main() -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def callback(message: str) -> None:
            try:
                await fut
            except RuntimeError as exc:
                got.append(f"handled {exc}")

        asyncio.get_running_loop().call_later(0.01, fut.set_exception, RuntimeError("gone"))
        await deliver(callback, "m", asyncio.Event(), Recorder().wait_first)
        assert got == ["handled gone"]

    asyncio.run(main())


def test_a_suspended_flow_cancels_a_waiting_callback() -> None:
    got: list[str] = []

    async def main() -> None:
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        flow = asyncio.Event()

        async def callback(message: str) -> None:
            try:
                await never
            finally:
                got.append("cleaned up")

        asyncio.get_running_loop().call_later(0.01, flow.set)
        await deliver(callback, "m", flow, Recorder().wait_first)
        assert got == ["cleaned up"]  # the rest of the callback was cancelled, as faust's wait_first does

    asyncio.run(main())


def test_with_the_flow_already_suspended_faust_races_the_whole_callback() -> None:
    async def callback(message: str) -> None:
        return None

    async def main() -> None:
        flow = asyncio.Event()
        flow.set()
        r = Recorder()
        await deliver(callback, "m", flow, r.wait_first)
        assert len(r.calls) == 1 and asyncio.iscoroutine(r.calls[0][0])

    asyncio.run(main())


class HeldConsumer:
    """The consumer's flow flags as faust's (``stop_flow``/``resume_flow``) and the partitions it held."""

    def __init__(self, held: set[Any]) -> None:
        self.held, self.flow_active = held, True

    def assignment(self) -> set[Any]:
        return self.held

    def stop_flow(self) -> None:
        self.flow_active = False

    def resume_flow(self) -> None:
        self.flow_active = True


@pytest.mark.parametrize("held", [set(), {"t.gpu.metrics[0]"}])
def test_every_rebalance_stops_the_flow_until_the_recovery_resumes_it(monkeypatch: pytest.MonkeyPatch, held: set[Any]) -> None:
    """faust stops the flow at a rebalance only where partitions were held; a worker that held none fetched its new
    partitions before the recovery's seek, and lost what it fetched.  Here the flow stops either way (faust's own
    steps stand in: they stop it where partitions were held)."""
    import faust

    from streams.consumer import App

    async def fausts(self: Any, revoked: set[Any]) -> None:
        if self.consumer.assignment():
            self.consumer.stop_flow()
            self.flow_control.suspend()

    monkeypatch.setattr(faust.App, "_on_partitions_revoked", fausts)
    app = App("flow-test", broker="kafka://127.0.0.1:9")
    app.consumer = HeldConsumer(held)  # type: ignore[assignment]
    asyncio.run(app._on_partitions_revoked(set()))
    assert not app.consumer.flow_active and not app.flow_control.is_active()
    app.flow_control.resume()  # the recovery, once it has sought
    app.consumer.resume_flow()
    assert app.consumer.flow_active and app.flow_control.is_active()

"""``streams.consumer.take_batches``: an agent's events in batches, straight from its stream's queue, through faust's
own agent test wrapper (no broker)."""

from __future__ import annotations

import asyncio
from typing import Any

import faust
import pytest

from streams.consumer import take_batches


def agent_of(max_: int, within_s: float, handle: Any) -> Any:
    app = faust.App("take-batches-test", broker="kafka://localhost:1", store="memory://", web_enabled=False)

    @app.agent(app.topic("t", value_serializer="raw"), name="t")
    async def consume(stream: Any) -> None:
        async for batch in take_batches(stream, max_, within_s):
            await handle(batch)

    return consume


def recorded() -> tuple[list[list[Any]], Any]:
    """The batches handed over, and the agent's handler that records them."""
    batches: list[list[Any]] = []

    async def handle(batch: list[Any]) -> None:
        batches.append(batch)

    return batches, handle


async def until(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "not within the test's timeout"
        await asyncio.sleep(0.01)


def test_batches_hold_every_event_in_order_at_most_max_each_acked_once_handled() -> None:
    batches: list[list[Any]] = []
    unacked_while_handled: list[bool] = []

    async def handle(batch: list[Any]) -> None:
        unacked_while_handled.extend(not e.message.acked for e in batch)
        batches.append(batch)

    async def go() -> None:
        async with agent_of(4, 0.05, handle).test_context() as agent:
            events = [await agent.put(str(i).encode(), wait=False) for i in range(10)]
            await until(lambda: sum(len(b) for b in batches) == 10)
            await agent.put(b"last")  # asks for the batch after the tenth event's: the tenth is acked
            await until(lambda: all(e.message.acked for e in events))

    asyncio.run(go())
    values = [e.value for b in batches for e in b]
    assert values[:10] == [str(i).encode() for i in range(10)]
    assert all(len(b) <= 4 for b in batches) and len(batches) >= 3
    assert all(unacked_while_handled)


def test_a_batch_the_caller_failed_on_is_never_acked() -> None:
    seen: list[Any] = []

    async def handle(batch: list[Any]) -> None:
        seen.extend(batch)
        raise RuntimeError("the agent failed on this batch")

    async def go() -> None:
        async with agent_of(10, 0.01, handle).test_context() as agent:
            await agent.put(b"a", wait=False)
            await until(lambda: len(seen) == 1)
            await asyncio.sleep(0.1)

    asyncio.run(go())
    assert seen and not seen[0].message.acked


def test_an_event_of_an_earlier_generation_is_dropped_unacked() -> None:
    batches, handle = recorded()

    async def go() -> None:
        async with agent_of(10, 0.01, handle).test_context() as agent:
            stale = await agent.put(b"stale", wait=False)
            stale.message.generation_id = agent.app.consumer_generation_id - 1  # read before a rebalance
            fresh = await agent.put(b"fresh", wait=False)
            await until(lambda: any(e is fresh for b in batches for e in b))
            assert not stale.message.acked and all(e is not stale for b in batches for e in b)

    asyncio.run(go())


def test_an_event_after_a_quiet_spell_is_handed_over_without_the_batch_wait() -> None:
    batches, handle = recorded()

    async def go() -> None:
        async with agent_of(10, 3600.0, handle).test_context() as agent:
            await agent.put(b"a", wait=False)
            await until(lambda: len(batches) == 1)  # not an hour later

    asyncio.run(go())
    assert [e.value for e in batches[0]] == [b"a"]


@pytest.mark.parametrize("waiting", [True, False], ids=["waiting-for-an-event", "within-a-batch-wait"])
def test_the_actor_stops_when_faust_stops_it(waiting: bool) -> None:
    """faust stops an agent's actor by throwing StopAsyncIteration into its channel, then cancelling its task: the
    batches end without an error (a generator that let StopAsyncIteration out would raise RuntimeError: the actor
    crashed, and was restarted), and an event taken but not handed over is not acked."""
    batches, handle = recorded()

    async def go() -> None:
        async with agent_of(10, 0.0 if waiting else 3600.0, handle).test_context() as agent:
            await agent.put(b"a", wait=False)
            await until(lambda: len(batches) == 1)
            late = None
            if not waiting:  # the next event waits out the batch wait (an hour) when the actor stops
                late = await agent.put(b"b", wait=False)
                await asyncio.sleep(0.05)
            actor = next(iter(agent._actors))
            if waiting:
                actor.cancel()  # the throw alone ends a stream waiting for an event
            else:
                await actor.stop()
            await until(actor.actor_task.done)
            assert actor.actor_task.cancelled() or actor.actor_task.exception() is None
            assert late is None or not late.message.acked
            assert not waiting or not agent._crash_reason  # a stopped actor's task is cancelled: faust's test wrapper says so

    asyncio.run(go())
    assert [e.value for b in batches for e in b] == [b"a"]

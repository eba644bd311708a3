"""A static member whose application stops fetching for longer than ``max_poll_interval`` (a worker saturated, waiting
on its producer and commits) stays in the group: aiokafka's poll check does not send it a LeaveGroup
(streams.membership.leave_on_close leaves only on close), and it consumes again once it fetches (docs/RELIABILITY.md).

Before, the worker's hook sent LeaveGroup from that check too: on the embedded broker, a 10,000-GPU fleet run lost its
learner mid-run and the group never formed again."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from streams.membership import leave_on_close
from transport import ensure_topics

PARTITIONS = [0, 1, 2, 3]
MAX_POLL_MS = 3_000


def test_a_static_member_that_stops_fetching_for_a_while_stays_in_the_group(settings: Any, broker: Any, group_id: str) -> None:
    topic = f"{settings.topic_prefix}slow"
    ensure_topics(settings, [topic], partitions=len(PARTITIONS))

    async def scenario() -> tuple[list[int], list[list[int]], dict[str, list[int]], list[str], str]:
        members: dict[str, AIOKafkaConsumer] = {}
        polls: dict[str, asyncio.Task[None]] = {}
        sent: list[str] = []

        fetching = {"a": asyncio.Event(), "b": asyncio.Event()}

        got: dict[str, set[int]] = {"a": set(), "b": set()}  # partitions each member read records of

        async def poll(name: str) -> None:
            while True:
                await fetching[name].wait()  # between fetches, as an application busy elsewhere
                for tp, records in (await members[name].getmany(timeout_ms=200)).items():
                    if records:
                        got[name].add(tp.partition)

        async def start(name: str) -> None:
            consumer = AIOKafkaConsumer(
                topic, bootstrap_servers=broker.address, group_id=group_id, group_instance_id=f"{group_id}-{name}",
                session_timeout_ms=10_000, heartbeat_interval_ms=1_000, rebalance_timeout_ms=3_000,
                max_poll_interval_ms=MAX_POLL_MS, enable_auto_commit=False,
            )  # fmt: skip
            members[name] = consumer
            await consumer.start()
            coordinator = consumer._coordinator
            send = coordinator._send_req

            async def watched(request: Any) -> Any:  # the requests the member sends, by name
                sent.append(f"{name}:{type(request).__name__}")
                return await send(request)

            coordinator._send_req = watched
            leave_on_close(coordinator)  # what every worker's consumer does once started (streams/consumer.py)
            fetching[name].set()
            polls[name] = asyncio.ensure_future(poll(name))

        def assignment(names: list[str]) -> dict[str, list[int]]:
            return {n: sorted(tp.partition for tp in members[n].assignment()) for n in names}

        async def formed(timeout_s: float) -> dict[str, list[int]] | None:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                now = assignment(["a", "b"])
                if all(now.values()) and sorted(p for ps in now.values() for p in ps) == PARTITIONS:
                    return now
                await asyncio.sleep(0.2)
            return None

        try:
            await asyncio.gather(start("a"), start("b"))
            first = await formed(60)
            assert first, f"the two members never formed a group: {assignment(['a', 'b'])}"
            stall_began = len(sent)
            fetching["b"].clear()  # b's application fetches nothing ...
            a_during = []
            for _ in range(int(3 * MAX_POLL_MS / 500)):  # ... for three poll intervals
                a_during.append(assignment(["a"])["a"])
                await asyncio.sleep(0.5)
            stalled = sent[stall_began:]
            fetching["b"].set()
            producer = AIOKafkaProducer(bootstrap_servers=broker.address)
            await producer.start()
            try:
                deadline = time.monotonic() + 45
                while time.monotonic() < deadline and not (got["a"] and got["b"] and got["a"] | got["b"] == set(PARTITIONS)):
                    # b rejoined and reads again, and between them every partition was read
                    for p in PARTITIONS:
                        await producer.send_and_wait(topic, b"x", partition=p)
                    await asyncio.sleep(1.0)
            finally:
                await producer.stop()
            b_member = members["b"]._coordinator.member_id
            return first["a"], a_during, {k: sorted(v) for k, v in got.items()}, stalled, b_member
        finally:
            for task in polls.values():
                task.cancel()
            for consumer in members.values():
                await asyncio.wait_for(consumer.stop(), 15)

    a_before, a_during, read, stalled, b_member = asyncio.run(scenario())
    assert "b:LeaveGroup" not in stalled, stalled
    assert all(a == a_before for a in a_during), a_during  # nobody left: a kept its partitions while b was silent
    assert read["a"] and read["b"] and sorted(read["a"] + read["b"]) == PARTITIONS, read  # both read again, all of it
    assert b_member, "b is not a member of the group after it fetched again"

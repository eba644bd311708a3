"""A static group whose leader stops while another member joins forms again (docs/RELIABILITY.md).

On the embedded broker (Tansu 0.6.0) a rebalance started by a joining member keeps the last leader, and only a
Heartbeat expires a member's session; aiokafka neither heartbeats while it joins nor sends LeaveGroup for a static
member.  Without the worker's LeaveGroup on stop (``streams.membership.leave_on_close``) the remaining members waited
for the stopped leader for good (reproduced: still unassigned after 60 s, six session timeouts).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.membership import leave_on_close

PARTITIONS = [0, 1, 2, 3]


def test_the_group_forms_again_when_its_static_leader_stops_as_a_member_joins(broker: Any, group_id: str) -> None:
    topic = f"t{uuid.uuid4().hex[:10]}"

    async def scenario() -> dict[str, list[int]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.address)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, len(PARTITIONS), 1)])
        finally:
            await admin.close()
        members: dict[str, AIOKafkaConsumer] = {}
        polls: list[asyncio.Task[None]] = []

        async def poll(consumer: AIOKafkaConsumer) -> None:
            while True:
                await consumer.getmany(timeout_ms=200)

        async def start(name: str) -> None:
            consumer = AIOKafkaConsumer(
                topic, bootstrap_servers=broker.address, group_id=group_id, group_instance_id=f"{group_id}-{name}",
                session_timeout_ms=10_000, heartbeat_interval_ms=1_000, rebalance_timeout_ms=3_000, enable_auto_commit=False,
            )  # fmt: skip
            members[name] = consumer
            await consumer.start()
            polls.append(asyncio.ensure_future(poll(consumer)))

        def assignment(names: list[str]) -> dict[str, list[int]]:
            return {n: sorted(tp.partition for tp in members[n].assignment()) if n in members else [] for n in names}

        async def formed(names: list[str], timeout_s: float) -> dict[str, list[int]] | None:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                now = assignment(names)
                if all(now.values()) and sorted(p for ps in now.values() for p in ps) == PARTITIONS:
                    return now
                await asyncio.sleep(0.2)
            return None

        joiner: asyncio.Task[None] | None = None
        try:
            await asyncio.gather(start("a"), start("b"))
            assert await formed(["a", "b"], 60), f"the first two members never formed a group: {assignment(['a', 'b'])}"
            leader = next(n for n in ("a", "b") if members[n]._coordinator._group_subscription is not None)
            other = "b" if leader == "a" else "a"
            leave_on_close(members[leader]._coordinator)  # what every worker's consumer does (streams/consumer.py)
            await members.pop(leader).stop()
            joiner = asyncio.ensure_future(start("c"))  # joins well within the stopped leader's 10 s session
            got = await formed([other, "c"], 45)
            assert got, f"the group never formed again after its leader stopped: {assignment([other, 'c'])}"
            return got
        finally:
            for task in polls:
                task.cancel()
            if joiner is not None:
                joiner.cancel()
            for consumer in members.values():
                await asyncio.wait_for(consumer.stop(), 15)

    got = asyncio.run(scenario())
    assert sorted(p for ps in got.values() for p in ps) == PARTITIONS

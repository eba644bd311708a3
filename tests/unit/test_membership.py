"""A worker's group membership (streams/membership.py): LeaveGroup for static members on a clean stop, and the
liveness check that says when a worker stays out of the group."""

from __future__ import annotations

import asyncio
import logging
from io import BytesIO
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.protocol.group import LeaveGroupRequest_v1

from streams.membership import GroupWatch, LeaveGroup, LeaveGroupRequest_v3, LeaveGroupResponse_v3, leave_on_close


class FakeCoordinator:
    """The parts of aiokafka's GroupCoordinator that leaving touches."""

    def __init__(
        self, member_id: str = "w-1-abc", instance: str | None = "host-1", answer: Any = None, fail: bool = False,
        closing: bool = True,
    ) -> None:  # fmt: skip
        self._closing = SimpleNamespace(done=lambda: closing)  # aiokafka's future, done once close() began
        self.group_id = "aip-streams"
        self.member_id = member_id
        self.generation = 4
        self._group_instance_id = instance
        self.sent: list[Any] = []
        self.answer = answer if answer is not None else LeaveGroupResponse_v3(0, 0, [(member_id, instance, 0)])
        self.fail = fail

    async def _send_req(self, request: Any) -> Any:
        self.sent.append(request)
        if self.fail:
            raise ConnectionError("coordinator gone")
        return self.answer

    async def _maybe_leave_group(self) -> None:  # aiokafka's: nothing for a static member
        self.sent.append("aiokafka's own")

    def reset_generation(self) -> None:
        self.member_id = ""
        self.generation = -1


def test_leave_group_v3_names_the_static_member() -> None:
    request = LeaveGroup("g", "member-1", "host-1")
    struct = request.prepare({13: (0, 5)})  # the embedded broker's LeaveGroup versions
    assert isinstance(struct, LeaveGroupRequest_v3)
    decoded = LeaveGroupRequest_v3.decode(BytesIO(struct.encode()))
    assert decoded.group == "g"
    assert [tuple(m) for m in decoded.members] == [("member-1", "host-1")]


def test_leave_group_falls_back_to_v1_on_old_brokers() -> None:
    struct = LeaveGroup("g", "member-1", "host-1").prepare({13: (0, 2)})
    assert isinstance(struct, LeaveGroupRequest_v1)
    assert (struct.group, struct.member_id) == ("g", "member-1")


def test_a_static_member_leaves_on_close() -> None:
    """aiokafka sends no LeaveGroup for a static member (nor for generation 0, the embedded broker's first); the
    worker's coordinator does, then forgets its generation."""
    coordinator = FakeCoordinator()
    leave_on_close(coordinator)
    asyncio.run(coordinator._maybe_leave_group())
    assert len(coordinator.sent) == 1
    request = coordinator.sent[0]
    assert isinstance(request, LeaveGroup)
    assert (request.group, request.member_id, request.group_instance_id) == ("aip-streams", "w-1-abc", "host-1")
    assert coordinator.member_id == "" and coordinator.generation == -1


def test_a_member_that_fetched_nothing_for_the_poll_interval_does_not_leave() -> None:
    """aiokafka's heartbeat task calls the same hook when the application has fetched nothing for
    ``max_poll_interval``: there a static member does what aiokafka does (no LeaveGroup), since the worker is only
    slow, not stopping."""
    coordinator = FakeCoordinator(closing=False)
    leave_on_close(coordinator)
    asyncio.run(coordinator._maybe_leave_group())
    assert coordinator.sent == ["aiokafka's own"]


def test_a_dynamic_member_leaves_too() -> None:
    coordinator = FakeCoordinator(instance=None)
    leave_on_close(coordinator)
    asyncio.run(coordinator._maybe_leave_group())
    assert coordinator.sent[0].group_instance_id is None


def test_nothing_to_leave_before_joining() -> None:
    coordinator = FakeCoordinator(member_id="")
    leave_on_close(coordinator)
    asyncio.run(coordinator._maybe_leave_group())
    assert coordinator.sent == []


def test_a_failed_leave_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    coordinator = FakeCoordinator(fail=True)
    leave_on_close(coordinator)
    with caplog.at_level(logging.WARNING, logger="streams.membership"):
        asyncio.run(coordinator._maybe_leave_group())
    assert "LeaveGroup for w-1-abc (instance host-1) failed" in caplog.text
    assert coordinator.member_id == ""  # the stop goes on; the session timeout is the fallback


def test_an_error_answer_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    coordinator = FakeCoordinator(answer=LeaveGroupResponse_v3(0, 0, [("w-1-abc", "host-1", 25)]))  # UNKNOWN_MEMBER_ID
    leave_on_close(coordinator)
    with caplog.at_level(logging.WARNING, logger="streams.membership"):
        asyncio.run(coordinator._maybe_leave_group())
    assert "answered error codes [25]" in caplog.text


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_group_watch_reports_a_stuck_member_once_per_episode(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    watch = GroupWatch(60.0, describe=lambda: "member m, generation 1", clock=clock)
    clock.now += 30
    assert watch.check() is None  # starting: joining takes a while
    watch.assigned()
    assert watch.out_for() == 0.0
    watch.rebalancing()
    clock.now += 59
    assert watch.check() is None
    with caplog.at_level(logging.WARNING, logger="streams.membership"):
        clock.now += 2
        assert watch.check() == pytest.approx(61.0)
        clock.now += 5
        assert watch.check() == pytest.approx(66.0)
    assert caplog.text.count("no partitions assigned for 61 s") == 1
    assert "member m, generation 1" in caplog.text
    assert watch.episodes == 1
    with caplog.at_level(logging.WARNING, logger="streams.membership"):
        watch.assigned()
    assert "back in the consumer group after 66.0 s" in caplog.text
    watch.rebalancing()
    watch.rebalancing()  # a rebalance that restarts does not restart the clock
    clock.now += 61
    watch.check()
    assert watch.episodes == 2


def test_the_worker_leaves_on_stop_by_default(tmp_path: Any) -> None:
    from config import Settings
    from streams.app import app_config

    assert app_config(Settings(state_dir=str(tmp_path)), web=False)["leave_group_on_stop"] is True
    assert app_config(Settings(state_dir=str(tmp_path), leave_group_on_stop=False), web=False)["leave_group_on_stop"] is False

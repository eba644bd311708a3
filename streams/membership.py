"""Consumer-group membership of a worker: a static member leaves the group when it stops, and a member that stays
out of a stable generation says so.

**Why a static member leaves.** Workers join with a static ``group.instance.id`` (streams.app.group_instance_id), so a
worker restarted after a crash gets its partitions back without waiting for its old session.  aiokafka, like the Java
client, sends no LeaveGroup for a static member when it closes: the coordinator learns that it is gone only when its
session expires.  On the embedded broker (Tansu 0.6.0) that is not enough:

- a rebalance started by a member that joins keeps the last generation's leader as the leader of the next one;
- a member's session is checked only when a Heartbeat arrives (aiokafka's Heartbeat v1 carries no instance id, so
  Tansu treats it as a dynamic member's request), never on a static member's JoinGroup or SyncGroup;
- aiokafka stops heartbeating while it joins and syncs.

So when the leader stops and another worker joins within the leader's session timeout, every live member waits in
JoinGroup/SyncGroup for a leader that is gone, and no request that would expire it ever comes: the group never forms
again (reproduced without any load: docs/RELIABILITY.md, "Consumer-group membership").  Apache Kafka completes the rebalance after
the rebalance timeout without the members that did not rejoin, so it never wedges; but there too a stopped static
member's partitions wait for its session to expire.

:func:`leave_on_close` makes a worker that stops cleanly leave at once with LeaveGroup v3 naming its member id and
``group.instance.id`` (KIP-345's removal of a static member; v1 with the member id where a broker has no v3), at the
point where aiokafka lets a dynamic member leave: after the consumer stopped and its last commit.  Its partitions move
right away on either broker.  A worker restarted after a clean stop rejoins as a new member of the same instance (one
more rebalance than before on Kafka); a crashed one (SIGKILL) sends nothing and still gets its partitions back as the
same static member.

:class:`GroupWatch` is the liveness check: it notes each completed assignment and each rebalance start, and a worker
whose consumer has been out of a stable generation for longer than ``stuck_after_s`` logs why (member id,
generation, for how long) once per episode, so that a wedge is visible in the worker's log and counted in
``/metrics`` instead of silently consuming nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeAlias

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.group import LeaveGroupRequest_v1
from aiokafka.protocol.types import Array, Int16, Int32, Schema, String

log = logging.getLogger(__name__)

UNKNOWN_MEMBER_ID = ""


class LeaveGroupResponse_v3(Response):  # type: ignore[misc]
    API_KEY = 13
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("members", Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")), ("error_code", Int16))),
    )


class LeaveGroupRequest_v3(RequestStruct):  # type: ignore[misc]
    API_KEY = 13
    API_VERSION = 3
    RESPONSE_TYPE = LeaveGroupResponse_v3
    SCHEMA = Schema(
        ("group", String("utf-8")),
        ("members", Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")))),
    )


LeaveStruct: TypeAlias = LeaveGroupRequest_v1 | LeaveGroupRequest_v3


class LeaveGroup(Request[LeaveStruct]):  # type: ignore[misc]
    """LeaveGroup for one member: v3 names its member id and ``group.instance.id`` (a static member), v1 its member id
    (brokers before Kafka 2.4)."""

    API_KEY = 13

    def __init__(self, group: str, member_id: str, group_instance_id: str | None) -> None:
        self.group = group
        self.member_id = member_id
        self.group_instance_id = group_instance_id

    def build(self, request_struct_class: type[LeaveStruct]) -> LeaveStruct:
        if request_struct_class.API_VERSION >= 3:
            return request_struct_class(self.group, [(self.member_id, self.group_instance_id)])
        return request_struct_class(self.group, self.member_id)


def leave_errors(response: Any) -> list[int]:
    """The non-zero error codes of a LeaveGroup response (top level, then per member for v3)."""
    codes = [response.error_code]
    codes += [m[2] for m in getattr(response, "members", None) or []]
    return [c for c in codes if c]


async def leave_group(coordinator: Any) -> bool:
    """Send LeaveGroup for ``coordinator``'s member (an aiokafka GroupCoordinator), static or not; then forget the
    generation as aiokafka does.  True when the broker accepted it; a failure is logged, never raised (the worker is
    stopping: the session timeout is the fallback)."""
    member_id = coordinator.member_id
    if member_id == UNKNOWN_MEMBER_ID:
        return False
    request = LeaveGroup(coordinator.group_id, member_id, coordinator._group_instance_id)
    try:
        response = await coordinator._send_req(request)
        errors = leave_errors(response)
    except Exception as exc:  # kafka errors, a closed connection: the session expires instead
        log.warning("LeaveGroup for %s (instance %s) failed: %r", member_id, coordinator._group_instance_id, exc)
        ok = False
    else:
        ok = not errors
        if ok:
            log.info("left group %s: member %s (instance %s)", coordinator.group_id, member_id, coordinator._group_instance_id)
        else:
            log.warning(
                "LeaveGroup for %s (instance %s) answered error codes %s", member_id, coordinator._group_instance_id, errors
            )
    coordinator.reset_generation()
    return ok


def leave_on_close(coordinator: Any) -> None:
    """Make ``coordinator`` (an aiokafka GroupCoordinator) leave the group when it closes, static membership or not.

    aiokafka calls ``_maybe_leave_group`` on close after the last commit; it skips a static member, and also a member
    of generation 0 (the embedded broker's first generation).  It calls it too from its heartbeat task when the
    application has fetched nothing for ``max_poll_interval``: there aiokafka's own runs (a static member forgets its
    generation and rejoins under the same instance id when it fetches again, KIP-345), since a LeaveGroup would take
    a worker that is only slow out of the group (measured: docs/RELIABILITY.md, "Consumer-group membership")."""
    aiokafka_maybe_leave = coordinator._maybe_leave_group

    async def maybe_leave_group() -> None:
        if coordinator._closing.done():
            await leave_group(coordinator)
        else:
            await aiokafka_maybe_leave()

    coordinator._maybe_leave_group = maybe_leave_group


class GroupWatch:
    """Liveness of a worker's group membership.

    ``assigned()`` at every completed assignment, ``rebalancing()`` when a rebalance starts (partitions revoked);
    ``check()`` (a timer) returns the seconds the member has been out of a stable generation once that passed
    ``stuck_after_s``, logging the reason once per episode (``describe`` adds what the consumer knows)."""

    def __init__(
        self, stuck_after_s: float, describe: Callable[[], str] = lambda: "", clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stuck_after_s = stuck_after_s
        self.describe = describe
        self.clock = clock
        self.since: float | None = clock()  # a worker starts out of the group
        self.episodes = 0
        self._reported = False

    def assigned(self) -> None:
        if self._reported and self.since is not None:
            log.warning("back in the consumer group after %.1f s out of it", self.clock() - self.since)
        self.since = None
        self._reported = False

    def rebalancing(self) -> None:
        if self.since is None:
            self.since = self.clock()

    def out_for(self) -> float:
        """Seconds out of a stable generation (0 while in one)."""
        return 0.0 if self.since is None else self.clock() - self.since

    def check(self) -> float | None:
        out = self.out_for()
        if out < self.stuck_after_s:
            return None
        if not self._reported:
            self._reported = True
            self.episodes += 1
            log.warning(
                "no partitions assigned for %.0f s: this worker has been out of a stable consumer-group generation "
                "since its last rebalance started (%s). A group whose leader left without a LeaveGroup can wait for it "
                "for good on the embedded broker (docs/RELIABILITY.md, Known limitations)",
                out,
                self.describe(),
            )
        return out

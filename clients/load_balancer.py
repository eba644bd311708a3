"""A load balancer's reaction to interference alerts.

:class:`LoadBalancer` reads ``interference.alerts`` records and calls its
``on_move`` callback at most once per raised alert: the callback receives a
:class:`MoveRequest` (which job to move off which GPU, and why) and does
whatever the cluster needs (ask the scheduler to migrate the job, drain the
GPU, page someone).  Two rules keep it calm:

* once a (GPU, job) alert is raised, repeats of it are ignored until it is
  cleared (redelivered or duplicated records never act twice);
* after acting on a GPU, further raised alerts on that GPU are ignored for
  ``cooldown_s`` seconds (moving one job usually fixes the others).

>>> moves = []
>>> lb = LoadBalancer(moves.append, cooldown_s=60.0, clock=lambda: 1e9)
>>> from events import Alert
>>> a = Alert(ts=1e9, state="raised", gpu_uuid="GPU-a", job_id="j1", interference_pct=72.0, threshold=50.0, source="measured")
>>> lb.handle(a).job_id, lb.handle(a)   # a repeat does nothing
('j1', None)
>>> len(moves)
1
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from events import Alert

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MoveRequest:
    """What the load balancer asks for: move ``job_id`` off ``gpu_uuid``."""

    gpu_uuid: str
    job_id: str
    job_type: str | None
    interference_pct: float
    threshold_pct: float
    source: str
    alert_ts: float


def in_cooldown(last_action_s: float | None, now_s: float, cooldown_s: float) -> bool:
    """Whether an action at ``last_action_s`` still blocks a new one at ``now_s``.

    >>> in_cooldown(None, 100.0, 30.0), in_cooldown(80.0, 100.0, 30.0), in_cooldown(60.0, 100.0, 30.0)
    (False, True, False)
    """
    return last_action_s is not None and now_s - last_action_s < cooldown_s


class LoadBalancer:
    """Turns raised alerts into move requests, once each, with a per-GPU cool-down.

    ``on_move(request)`` is the documented callback; an exception it raises is
    logged and counted, and the alert still counts as handled (no retry storm).
    ``clock`` gives epoch seconds (injectable for tests).
    """

    def __init__(
        self,
        on_move: Callable[[MoveRequest], Any],
        *,
        cooldown_s: float = 120.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.on_move = on_move
        self.cooldown_s = cooldown_s
        self.clock = clock
        self._raised: set[tuple[str, str]] = set()
        self._last_action: dict[str, float] = {}
        self.counters = {"alerts": 0, "moves": 0, "repeats": 0, "cooled_down": 0, "cleared": 0, "callback_errors": 0}

    def handle(self, alert: Alert) -> MoveRequest | None:
        """Take one alert; return the move request when the callback was called."""
        self.counters["alerts"] += 1
        key = (alert.gpu_uuid, alert.job_id)
        if alert.state == "cleared":
            self._raised.discard(key)
            self.counters["cleared"] += 1
            return None
        if key in self._raised:
            self.counters["repeats"] += 1
            return None
        self._raised.add(key)
        now = self.clock()
        if in_cooldown(self._last_action.get(alert.gpu_uuid), now, self.cooldown_s):
            self.counters["cooled_down"] += 1
            return None
        self._last_action[alert.gpu_uuid] = now
        request = MoveRequest(
            gpu_uuid=alert.gpu_uuid,
            job_id=alert.job_id,
            job_type=alert.job_type,
            interference_pct=alert.interference_pct,
            threshold_pct=alert.threshold,
            source=alert.source,
            alert_ts=alert.ts,
        )
        self.counters["moves"] += 1
        try:
            self.on_move(request)
        except Exception as exc:
            self.counters["callback_errors"] += 1
            log.warning("load balancer: on_move failed for %s on %s: %s", alert.job_id, alert.gpu_uuid, exc)
        return request

    def run(
        self, settings: Any, *, stop: threading.Event | None = None, from_beginning: bool = False, consumer: Any = None
    ) -> None:
        """Consume ``interference.alerts`` and handle each alert until ``stop`` is set (or Ctrl-C)."""
        from events import Topics
        from events.topics import ALERTS
        from transport import RecordConsumer, ensure_topics

        stop = stop or threading.Event()
        if consumer is None:
            ensure_topics(settings, [Topics(settings.topic_prefix).alerts])
            consumer = RecordConsumer(settings, [ALERTS], from_beginning=from_beginning)
        try:
            while not stop.is_set():
                for item in consumer.poll(timeout_s=0.5):
                    if item.error is None and isinstance(item.record, Alert):
                        self.handle(item.record)
        finally:
            consumer.close()

"""Pace a stream of timestamped records against the wall clock."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def due_after_s(ts: float, first_ts: float, speedup: float) -> float:
    """Wall seconds after the start at which a record stamped ``ts`` is due.

    >>> due_after_s(1060.0, 1000.0, 60.0)
    1.0
    >>> due_after_s(1060.0, 1000.0, 0.0)  # as fast as possible
    0.0
    """
    return (ts - first_ts) / speedup if speedup > 0 else 0.0


def paced(
    items: Iterable[tuple[str, Any]],
    speedup: float,
    first_ts: float | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[tuple[str, Any]]:
    """Yield ``(topic, record)`` no earlier than ``record.ts`` allows at ``speedup`` x real time (0: no pacing)."""
    wall0 = clock()
    for topic, record in items:
        if first_ts is None:
            first_ts = record.ts
        if speedup > 0:
            delay = wall0 + due_after_s(record.ts, first_ts, speedup) - clock()
            if delay > 0:
                sleep(delay)
        yield topic, record

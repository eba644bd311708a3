"""Send items on a schedule: each is due some seconds after the start, and the loop sleeps until then.

Two schedules, as pure functions: by event time at a speedup (:func:`due_after_s`, :func:`paced`)
and at a fixed rate (:func:`nth_due_after_s`, :func:`at_rate`).  Both run through :func:`on_schedule`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from typing import Any, TypeVar

T = TypeVar("T")


def due_after_s(ts: float, first_ts: float, speedup: float) -> float:
    """Wall seconds after the start at which a record stamped ``ts`` is due at ``speedup`` x event time.

    >>> due_after_s(1060.0, 1000.0, 60.0)
    1.0
    >>> due_after_s(1060.0, 1000.0, 0.0)  # as fast as possible
    0.0
    """
    return (ts - first_ts) / speedup if speedup > 0 else 0.0


def nth_due_after_s(n: int, rate_per_s: float) -> float:
    """Wall seconds after the start at which item ``n`` (from 0) is due at ``rate_per_s`` items per second.

    >>> nth_due_after_s(500, 2000.0)
    0.25
    >>> nth_due_after_s(500, 0.0)  # as fast as possible
    0.0
    """
    return n / rate_per_s if rate_per_s > 0 else 0.0


def on_schedule(
    items: Iterable[T],
    due_s: Callable[[int, T], float],
    *,
    min_sleep_s: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Any] = time.sleep,
) -> Iterator[T]:
    """Yield item ``n`` no earlier than ``due_s(n, item)`` seconds after the first is asked for.

    Sleeps only when ahead by more than ``min_sleep_s`` (items go out in small bursts, not one
    sleep each).  A ``sleep`` that returns true ends the schedule: pass ``threading.Event.wait``
    to stop it from another thread.
    """
    start = clock()
    for n, item in enumerate(items):
        ahead_s = start + due_s(n, item) - clock()
        if ahead_s > min_sleep_s and sleep(ahead_s):
            return
        yield item


def paced(
    items: Iterable[tuple[str, Any]], speedup: float, first_ts: float | None = None, **schedule: Any
) -> Iterator[tuple[str, Any]]:
    """Yield ``(topic, record)`` no earlier than ``record.ts`` allows at ``speedup`` x real time (0: no pacing),
    counting from ``first_ts`` (default: the first record's ``ts``).  ``schedule``: :func:`on_schedule`'s options."""
    it = iter(items)
    head = next(it, None)
    if head is None:
        return
    start_ts = head[1].ts if first_ts is None else first_ts
    yield from on_schedule(chain([head], it), lambda _n, item: due_after_s(item[1].ts, start_ts, speedup), **schedule)


def at_rate(items: Iterable[T], rate_per_s: float, **schedule: Any) -> Iterator[T]:
    """Yield ``items`` at ``rate_per_s`` per second (0: at once).  ``schedule``: :func:`on_schedule`'s options."""
    return on_schedule(items, lambda n, _item: nth_due_after_s(n, rate_per_s), **schedule)

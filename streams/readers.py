"""Readers of shared state on Kafka, outside the worker's consumer group.

:class:`PartitionReader` reads one partition from an offset up to another one (models are
rebuilt from ``interference.observations``); :class:`TopicFollower` follows every
partition of a topic from the beginning in a thread (``interference.profiles``, which
every stage-1 worker reads whole).

Neither asks the broker where a partition ends: the embedded broker's ListOffsets
undercounts (measured: 2,341 for 3,000 readable records), which once broke faust's table
recovery.  A rebuild reads until the consumer's position reaches an offset the worker
knows from its own group's fetch (the first record handed over after an assignment);
the follower never ends.  Both are correct on Apache Kafka and on the embedded broker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from config import Settings

log = logging.getLogger(__name__)


class PartitionReader:
    """Raw records ``(offset, key, value)`` of one partition from ``start`` until the position reaches ``end``.

    ``consumer`` is injectable (tests): by default a :class:`transport.RawConsumer` of the settings.
    """

    def __init__(
        self, settings: Settings, topic: str, partition: int, start: int, end: int, stall_s: float = 30.0, consumer: Any = None
    ) -> None:
        from transport import RawConsumer

        self.topic, self.partition = topic, partition
        self.start, self.end, self.stall_s = start, end, stall_s
        self.consumer = RawConsumer(settings, consumer).assign(topic, partition, start)
        self._last_progress = time.monotonic()
        self.position = start

    @property
    def done(self) -> bool:
        return self.position >= self.end

    def read(self, max_records: int = 500) -> list[tuple[int, bytes | None, bytes | None]]:
        """The next records below ``end`` (blocking up to half a second); [] once done or stalled for ``stall_s``."""
        out: list[tuple[int, bytes | None, bytes | None]] = []
        while not out and not self.done:
            records = self.consumer.poll(timeout_s=0.5, max_records=max_records)
            out.extend(r for r in records if r[0] < self.end)
            self.position = self.consumer.position()
            if records:
                self._last_progress = time.monotonic()
            elif time.monotonic() - self._last_progress > self.stall_s:
                log.warning(
                    "reading %s[%d] from %d stalled at %d before %d",
                    self.topic,
                    self.partition,
                    self.start,
                    self.position,
                    self.end,
                )
                self.position = self.end  # records below end were deleted (retention): rebuild from what exists
                break
        return out

    def close(self) -> None:
        self.consumer.close()


FOLLOW_FETCH_WAIT_S = 5.0
"""How long a follower's fetch waits at the broker for a record (at most half the request timeout).  A broker
answers a fetch as soon as a record is there (measured on the embedded broker: 4-6 ms from the send to the poll
with 0.5 s and 3 s alike), so a long wait delays nothing; with kafka-python's 0.5 s, two idle followers took
0.9 % of a core, a worker's largest cost at rest (docs/BENCHMARKS.md, "Followers that wait, messages without
faust's codecs")."""


def follow_fetch_wait_ms(request_timeout_s: float) -> int:
    """The follower's fetch wait in ms: :data:`FOLLOW_FETCH_WAIT_S`, below half the request timeout (kafka-python
    requires it below the timeout).

    >>> follow_fetch_wait_ms(30.0), follow_fetch_wait_ms(4.0)
    (5000, 2000)
    """
    return int(min(FOLLOW_FETCH_WAIT_S, request_timeout_s / 2.0) * 1000)


class TopicFollower:
    """A thread that reads every partition of ``topic`` from the beginning and hands each batch of
    decoded records to ``deliver`` (called in the thread: hand them over to your event loop); ``raw``:
    ``(key, value)`` pairs instead (a topic without a record class: ``models.snapshots``); ``idle`` is
    called after a poll that read nothing.  ``poll_s``: how long a poll waits for records (a poll returns as soon
    as it has some; an empty one is what ``idle`` hears of, and each costs the thread a few hundred microseconds)."""

    def __init__(
        self,
        settings: Settings,
        topic: str,
        deliver: Callable[[list[Any]], None],
        *,
        raw: bool = False,
        idle: Callable[[], None] | None = None,
        poll_s: float = 0.5,
    ) -> None:
        self.settings, self.topic, self.deliver, self.raw = settings, topic, deliver, raw
        self.poll_s = poll_s
        self.idle = idle
        """Called (in the thread) after a poll that read nothing: the follower has caught up for now."""
        self.stopping = threading.Event()
        self.records = 0
        self.thread = threading.Thread(target=self._run, name=f"follow-{topic}", daemon=True)

    def start(self) -> TopicFollower:
        self.thread.start()
        return self

    def _run(self) -> None:
        from transport import RecordConsumer

        while not self.stopping.is_set():
            try:
                consumer = RecordConsumer(
                    self.settings, [self.topic], from_beginning=True,
                    fetch_max_wait_ms=follow_fetch_wait_ms(self.settings.request_timeout_s),
                )  # fmt: skip
            except Exception as exc:  # the topic does not exist yet, or the broker is away: try again
                log.warning("cannot follow %s yet: %s", self.topic, exc)
                self.stopping.wait(2.0)
                continue
            try:
                while not self.stopping.is_set():
                    items = consumer.poll(timeout_s=self.poll_s, max_records=2000)
                    if self.raw:
                        records: list[Any] = [(i.key, i.value) for i in items]
                    else:
                        records = [i.record for i in items if i.record is not None]
                    try:
                        if records:
                            self.records += len(records)
                            self.deliver(records)
                        elif self.idle is not None:
                            self.idle()
                    except RuntimeError:  # the event loop is closed: the worker is stopping
                        self.stopping.set()
            except Exception as exc:
                log.warning("following %s failed (%s); starting over from the beginning", self.topic, exc)
            finally:
                try:
                    consumer.close()
                except Exception:
                    pass

    def stop(self) -> None:
        self.stopping.set()

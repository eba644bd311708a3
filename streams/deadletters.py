"""Dead letters: every record a stage cannot use, with where it came from and why."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from events import DeadLetter, Topics, b64, encode
from streams.metrics import StreamMetrics, dead_letter_reason
from streams.outputs import Publisher

MAX_PAYLOAD_BYTES = 600_000
"""Payloads are cut to this so that a dead letter (base64, +33 %) stays under Kafka's 1 MB default message size."""


def dead_letter(
    source_topic: str,
    partition: int,
    offset: int,
    payload: bytes | None,
    error: str,
    key: bytes | None = None,
    stage: str | None = None,
    now: float | None = None,
) -> DeadLetter:
    """Build the DeadLetter record (reason trimmed to the schema's limit).

    >>> dead_letter("gpu.metrics", 0, 7, b"{", "not valid JSON", stage="stage1", now=1e9).offset
    7
    """
    payload = payload or b""
    if len(payload) > MAX_PAYLOAD_BYTES:
        error = f"{error[:1900]} (payload cut to {MAX_PAYLOAD_BYTES} of {len(payload)} bytes)"
        payload = payload[:MAX_PAYLOAD_BYTES]
    return DeadLetter(
        ts=time.time() if now is None else now,
        source_topic=source_topic,
        partition=partition,
        offset=offset,
        payload_b64=b64(payload),
        error=error[:2000] or "unknown error",
        key=None if key is None else key.decode("utf-8", "replace")[:4096],
        stage=stage,
    )


@dataclass(eq=False)
class DeadLetters:
    """Dead-letters (part of) consumed events on the dead-letter topic, counted by reason."""

    topics: Topics
    publisher: Publisher
    metrics: StreamMetrics
    clock: Callable[[], float]

    def _record(self, event: Any, payload: bytes | None, error: str, stage: str) -> DeadLetter:
        m = event.message
        record = dead_letter(self.topics.base(m.topic), m.partition, m.offset, payload, error, m.key, stage, now=self.clock())
        self.metrics.dead_letters[dead_letter_reason(error)] += 1
        return record

    def soon(self, event: Any, payload: bytes, error: str, stage: str) -> None:
        """Buffer a dead letter for part of ``event`` (``payload``); flushed before the input offsets are committed."""
        record = self._record(event, payload, error, stage)
        self.publisher.out["deadletter"].send_soon(key=None if record.key is None else record.key.encode(), value=encode(record))
        self.metrics.published["deadletter"] += 1

    async def send(self, event: Any, error: str, stage: str) -> None:
        """Dead-letter the whole of ``event``."""
        record = self._record(event, event.message.value, error, stage)
        await self.publisher.send("deadletter", record.key, record)

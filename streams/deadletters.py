"""Dead letters: every record a stage cannot use, with where it came from and why."""

from __future__ import annotations

import time

from events import DeadLetter, b64

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

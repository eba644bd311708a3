"""Dead letters: every record a stage cannot use, with where it came from and why."""

from __future__ import annotations

import time

from events import DeadLetter, b64


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
    return DeadLetter(
        ts=time.time() if now is None else now,
        source_topic=source_topic,
        partition=partition,
        offset=offset,
        payload_b64=b64((payload or b"")[:2_000_000]),
        error=error[:2000] or "unknown error",
        key=None if key is None else key.decode("utf-8", "replace")[:4096],
        stage=stage,
    )

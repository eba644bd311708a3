"""Replay recorded ``gpu.metrics`` and ``jobs.lifecycle`` lines (as written by ``aip tail --json``).

A recorded batch (:class:`HostMetrics`, :class:`HostJobEvents`) is loaded as its records (``aip produce replay``
batches them again).

>>> import json, tempfile
>>> line = {"_topic": "jobs.lifecycle", "ts": 1.7e9, "kind": "started", "job_id": "j", "job_type": "t",
...         "gpu_uuid": "GPU-1", "host": "h", "schema_version": 1}
>>> path = tempfile.mktemp()
>>> _ = open(path, "w").write(json.dumps(line) + "\\n" + '{"_topic": "gpu.metrics", "_error": "bad"}\\n')
>>> records, skipped = load(path)
>>> [(t, r.kind) for t, r in records], skipped
([('jobs.lifecycle', 'started')], 1)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from events import RecordError, decode_obj
from events.topics import BATCH_OF, LIFECYCLE, METRICS, RECORD_OF
from producers.batching import per_gpu

REPLAYABLE = (METRICS, LIFECYCLE)


def load(path: str | Path) -> tuple[list[tuple[str, Any]], int]:
    """Records of the replayable topics, sorted by timestamp (stable), and how many lines were skipped."""
    out: list[tuple[str, Any]] = []
    skipped = 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                skipped += 1
                continue
            topic = obj.get("_topic") if isinstance(obj, dict) else None
            if topic not in REPLAYABLE or "_error" in obj:
                skipped += 1
                continue
            fields = {k: v for k, v in obj.items() if not k.startswith("_")}
            try:
                batch = topic in BATCH_OF and ("samples" in fields or "events" in fields)
                record = decode_obj(BATCH_OF[topic] if batch else RECORD_OF[topic], fields)
            except RecordError:
                skipped += 1
                continue
            out.extend(per_gpu([(topic, record)]))
    out.sort(key=lambda item: item[1].ts)
    return out, skipped


def shifted(records: list[tuple[str, Any]], offset_s: float) -> list[tuple[str, Any]]:
    """The same records with every timestamp moved by ``offset_s``."""
    return [(t, msgspec.structs.replace(r, ts=r.ts + offset_s)) for t, r in records]

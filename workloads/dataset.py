"""Recordings (``aip tail --json`` lines) -> observations -> the observations CSV of docs/ARCHITECTURE.md ("Dataset formats").

The arithmetic is stage 1's own (:class:`streams.stage1.Stage1`): the recorded
``gpu.metrics`` and ``jobs.lifecycle`` records are fed to it in event-time
order, so the CSV holds exactly the observations the stream would publish for
the same records.  This module only orders the input and lays out the rows.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from events import PARAMETERS, Observation
from events.topics import LIFECYCLE
from producers import replay
from streams.stage1 import LateEvent, Stage1

PROFILE_KEYS = (*PARAMETERS, "M", "throughput")
ATTRIBUTION = ("proc_sm_util_pct", "proc_mem_util_pct", "sm_share_pct", "rw_source")
NEVER_S = 1e9  # a hold longer than any recording: windows wait for both streams
COLUMNS = (
    "environment",
    "gpu_uuid",
    "group",
    "window_start",
    "window_end",
    "job_id",
    "job_type",
    "co_job_types",
    "interference_pct",
    "throughput_steps_per_s",
    *(f"{p}_pct" for p in PARAMETERS),
    *(f"solo_{k}" for k in PROFILE_KEYS),
    *(f"other_solo_{k}" for k in PROFILE_KEYS),
    "samples",
    *ATTRIBUTION,
)
"""Columns of the observations CSV: observed mode (``<P>_pct``), placement mode
(``solo_<P>``, ``other_solo_<P>``: the co-runners' solo profiles summed), the target, and the
job's own utilisation with the source of R/W (empty where the GPU cannot attribute)."""


def load_recordings(paths: Iterable[str | Path]) -> tuple[list[tuple[str, Any]], int]:
    """Records of all ``paths``, in event-time order (lifecycle before metrics at the same instant), and lines skipped."""
    records: list[tuple[str, Any]] = []
    skipped = 0
    for path in paths:
        got, bad = replay.load(path)
        records.extend(got)
        skipped += bad
    records.sort(key=lambda item: (item[1].ts, item[0] != LIFECYCLE))
    return records, skipped


def observations(
    records: Iterable[tuple[str, Any]], window_s: float, lateness_s: float = 0.0
) -> tuple[list[Observation], Counter[str]]:
    """Run stage 1 over time-ordered records and close every window at the end.

    Returns the observations and stage 1's counters (windows by kind, late events).
    """
    stage = Stage1(window_s=window_s, lateness_s=lateness_s, hold_s=NEVER_S)  # sorted input: windows close on both streams
    out: list[Observation] = []
    for topic, record in records:
        try:
            out.extend(stage.on_job(record) if topic == LIFECYCLE else stage.on_metric(record))
        except LateEvent:
            pass  # counted by stage 1
    out.extend(stage.flush())
    return out, stage.counters


def combination(job_type: str, co_job_types: Sequence[str]) -> str:
    """The unordered job set, the group that cross-validation must never split.

    >>> combination("vgg16-bs32", ["resnet50-bs16"])
    'resnet50-bs16 + vgg16-bs32'
    """
    return " + ".join(sorted((job_type, *co_job_types)))


def _summed(profiles: Sequence[dict[str, float | None]], key: str) -> float | None:
    values = [p.get(key) for p in profiles]
    if not values or any(v is None for v in values):
        return None
    return float(sum(v for v in values if v is not None))


def row(obs: Observation) -> dict[str, Any]:
    """One CSV row (a dict keyed by :data:`COLUMNS`; None for unknown values)."""
    out: dict[str, Any] = {
        "environment": obs.environment,
        "gpu_uuid": obs.gpu_uuid,
        "group": combination(obs.job_type, obs.co_job_types),
        "window_start": obs.window_start,
        "window_end": obs.window_end,
        "job_id": obs.job_id,
        "job_type": obs.job_type,
        "co_job_types": ";".join(obs.co_job_types),
        "interference_pct": obs.interference_pct,
        "throughput_steps_per_s": obs.throughput_steps_per_s,
        "samples": obs.samples,
        **{k: getattr(obs, k) for k in ATTRIBUTION},
    }
    for p in PARAMETERS:
        out[f"{p}_pct"] = obs.pct(p)
    for k in PROFILE_KEYS:
        out[f"solo_{k}"] = obs.solo.get(k)
        out[f"other_solo_{k}"] = _summed(obs.co_solo, k)
    return out


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if not math.isfinite(value) else f"{value:.6g}"
    return str(value)


def write_csv(rows: Iterable[dict[str, Any]], path: str | Path) -> int:
    """Write rows with the :data:`COLUMNS` header; unknown values are empty cells. Returns the row count."""
    n = 0
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for r in rows:
            writer.writerow([_cell(r.get(c)) for c in COLUMNS])
            n += 1
    return n


def convert(recordings: Iterable[str | Path], csv_path: str | Path, window_s: float) -> dict[str, Any]:
    """Recordings -> observations CSV; returns a summary (rows, groups, stage-1 counters, skipped lines)."""
    records, skipped = load_recordings(recordings)
    obs, counters = observations(records, window_s)
    rows = [row(o) for o in obs]
    write_csv(rows, csv_path)
    return {
        "records": len(records),
        "skipped_lines": skipped,
        "rows": len(rows),
        "labelled_rows": sum(r["interference_pct"] is not None for r in rows),
        "groups": sorted({r["group"] for r in rows}),
        "environments": sorted({r["environment"] for r in rows}),
        "stage1": dict(sorted(counters.items())),
    }

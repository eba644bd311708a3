"""Readable one-line renderings of records, for ``aip tail`` and the live views."""

from __future__ import annotations

import datetime as dt
from typing import Any

from events import Alert, DeadLetter, HostJobEvents, HostMetrics, JobEvent, Leaderboard, MetricSample, Observation, Prediction


def fmt_ts(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%H:%M:%S.%f")[:-3]


def _num(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _short(uuid: str) -> str:
    return uuid if len(uuid) <= 16 else uuid[:12] + "…"


def render(record: Any) -> str:
    """One readable line for a record.

    >>> from events import JobEvent
    >>> render(JobEvent(ts=1e9, kind="started", job_id="j1", job_type="resnet", gpu_uuid="GPU-0", host="h"))
    '01:46:40.000 started  j1 (resnet) on GPU-0 host h'
    """
    if isinstance(record, HostMetrics):  # one line per GPU, as per-GPU records
        return "\n".join(render(s) for s in record.samples)
    if isinstance(record, HostJobEvents):  # one line per event
        return "\n".join(render(e) for e in record.events)
    if isinstance(record, MetricSample):
        procs = len(record.processes) if record.processes is not None else "-"
        return (
            f"{fmt_ts(record.ts)} {_short(record.gpu_uuid)} [{record.gpu_model}] seq={record.seq} "
            f"E={_num(record.power_w, 'W')} T={_num(record.temp_c, 'C', 0)} S={_num(record.sm_util_pct, '%', 0)} "
            f"V={_num(record.mem_util_pct, '%', 0)} mem={_num(record.mem_used_mb, 'MB', 0)} "
            f"R={_num(record.pcie_rx_kbps, 'KB/s', 0)} W={_num(record.pcie_tx_kbps, 'KB/s', 0)} procs={procs}"
        )
    if isinstance(record, JobEvent):
        extra = ""
        if record.kind == "progress":
            extra = f" steps={record.steps} step_time={_num(record.step_time_s, 's', 4)}"
        elif record.kind == "finished" and record.exit_code is not None:
            extra = f" exit={record.exit_code}"
        return f"{fmt_ts(record.ts)} {record.kind:<8} {record.job_id} ({record.job_type}) on {_short(record.gpu_uuid)} host {record.host}{extra}"
    if isinstance(record, Observation):
        pcts = " ".join(f"{p}={_num(record.pct(p), '%')}" for p in "ETSVRW")
        return (
            f"{fmt_ts(record.window_end)} {_short(record.gpu_uuid)} [{record.environment}] {record.job_id} ({record.job_type}) "
            f"with {','.join(record.co_job_types)}: interference={_num(record.interference_pct, '%')} {pcts}"
        )
    if isinstance(record, Prediction):
        what_if = ""
        if record.what_if:
            what_if = " what-if: " + ", ".join(f"+{w.job_type}={w.newcomer_pct:.0f}%" for w in record.what_if[:4])
        return (
            f"{fmt_ts(record.ts)} {_short(record.gpu_uuid)} {record.job_id} ({record.job_type}) {record.mode} "
            f"predicted={record.interference_pct:.1f}% measured={_num(record.measured_pct, '%')} "
            f"by {record.model}/cat {record.category}{what_if}"
        )
    if isinstance(record, Alert):
        return (
            f"{fmt_ts(record.ts)} ALERT {record.state.upper()} {_short(record.gpu_uuid)} {record.job_id} "
            f"{record.interference_pct:.1f}% (threshold {record.threshold:g}%, {record.source})"
        )
    if isinstance(record, Leaderboard):
        served = ", ".join(served_text(s) for s in record.served)
        return f"{fmt_ts(record.ts)} leaderboard [{record.environment}] n={record.observations} served: {served or '-'}"
    if isinstance(record, DeadLetter):
        return f"{fmt_ts(record.ts)} DEAD LETTER from {record.source_topic} p{record.partition}@{record.offset}: {record.error}"
    return repr(record)


def served_text(s: Any) -> str:
    """``observed:seen=ExtraTrees/2 (3.50)``: a served model (``events.ServedModel``) and the error it was chosen by."""
    err = "-" if s.error_pct is None else f"{s.error_pct:.2f}"
    return f"{s.mode}:{s.regime}={s.model}/{s.category} ({err})"

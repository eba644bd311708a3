"""What the sampler actually read during an experiment: field support and per-process utilisation.

    python -m workloads.telemetry RUN_DIR > telemetry.json     # RUN_DIR: the --out of `aip experiment`

From ``RUN_DIR/recordings/*.jsonl`` and ``RUN_DIR/runs.json``:

* ``fields``: per MetricSample field (``processes.<field>`` per process entry) how many samples
  read it, how many listed it in ``unavailable``, and the mean of what was read: which NVML
  fields and GPM metrics the GPU supported, as the producer saw them under load;
* ``runs``: per run (solo and co-located), each job's own SM and memory utilisation from its
  process's entries (the pid of its ``started`` event) over the run's timed interval, next to the
  device's SM utilisation (NVML and GPM) and DRAM bandwidth: what per-process utilisation read
  while jobs shared the GPU.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from events import MetricSample
from events.topics import LIFECYCLE, METRICS
from producers import replay

SAMPLE_FIELDS = (
    "power_w", "energy_mj", "temp_c", "sm_util_pct", "mem_util_pct", "mem_used_mb", "mem_total_mb",
    "pcie_rx_kbps", "pcie_tx_kbps", "dram_bw_util_pct", "sm_occupancy_pct", "gpm_sm_util_pct",
    "pcie_rx_bytes_per_s", "pcie_tx_bytes_per_s",
)  # fmt: skip
PROCESS_FIELDS = ("used_mem_mb", "sm_util_pct", "mem_util_pct")
DEVICE_MEANS = ("sm_util_pct", "gpm_sm_util_pct", "sm_occupancy_pct", "dram_bw_util_pct")


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 3) if values else None


def field_support(samples: Iterable[MetricSample]) -> dict[str, dict[str, Any]]:
    """Per field: samples (or process entries) that read it, that listed it unavailable, and the mean read.

    >>> from events import GpuProcess
    >>> s = MetricSample(ts=1e9, host="h", gpu_uuid="G", gpu_index=0, gpu_model="m", seq=0, power_w=100.0,
    ...                  unavailable=["dram_bw_util_pct"], processes=[GpuProcess(pid=7, sm_util_pct=40.0)])
    >>> f = field_support([s])
    >>> f["power_w"], f["dram_bw_util_pct"], f["processes.sm_util_pct"]
    ({'samples': 1, 'read': 1, 'unavailable': 0, 'mean': 100.0}, {'samples': 1, 'read': 0, 'unavailable': 1, 'mean': None}, {'samples': 1, 'read': 1, 'unavailable': 0, 'mean': 40.0})
    """
    values: dict[str, list[float]] = {f: [] for f in SAMPLE_FIELDS}
    values.update({f"processes.{f}": [] for f in PROCESS_FIELDS})
    seen = dict.fromkeys(values, 0)
    unavailable = dict.fromkeys(values, 0)
    for s in samples:
        listed = set(s.unavailable or ())
        for f in SAMPLE_FIELDS:
            seen[f] += 1
            unavailable[f] += f in listed
            v = getattr(s, f)
            if v is not None:
                values[f].append(v)
        for p in s.processes or ():
            for f in PROCESS_FIELDS:
                name = f"processes.{f}"
                seen[name] += 1
                unavailable[name] += name in listed
                v = getattr(p, f)
                if v is not None:
                    values[name].append(v)
    return {f: {"samples": seen[f], "read": len(v), "unavailable": unavailable[f], "mean": _mean(v)} for f, v in values.items()}


def process_attribution(
    samples: Sequence[MetricSample], pids: Mapping[str, int | None], runs: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Per run: each job's own utilisation (mean over its process's entries in the run's timed interval)
    and the device's means over the same samples.  ``pids``: job id -> pid of its ``started`` event."""
    out = []
    for run in runs:
        go, end = run.get("go_at"), run.get("end_at")
        if go is None or end is None:
            continue
        window = [s for s in samples if go <= s.ts < end]
        jobs = []
        for job_id, job_type in zip(run["job_ids"], run["job_types"], strict=True):
            pid = pids.get(job_id)
            sm: list[float] = []
            mem: list[float] = []
            null = 0
            for s in window:
                for p in s.processes or ():
                    if p.pid == pid:
                        if p.sm_util_pct is None:
                            null += 1
                        else:
                            sm.append(p.sm_util_pct)
                        if p.mem_util_pct is not None:
                            mem.append(p.mem_util_pct)
            jobs.append(
                {
                    "job_type": job_type,
                    "job_id": job_id,
                    "pid": pid,
                    "proc_sm_util_pct": _mean(sm),
                    "proc_mem_util_pct": _mean(mem),
                    "entries_read": len(sm),
                    "entries_null": null,
                }
            )
        device = {f: _mean([v for s in window if (v := getattr(s, f)) is not None]) for f in DEVICE_MEANS}
        out.append(
            {"run": run.get("index"), "job_types": list(run["job_types"]), "samples": len(window), "jobs": jobs, "device": device}
        )
    return out


def summarise(run_dir: str | Path) -> dict[str, Any]:
    """:func:`field_support` and :func:`process_attribution` of one experiment's output folder."""
    d = Path(run_dir)
    samples: list[MetricSample] = []
    pids: dict[str, int | None] = {}
    for base in ("gpu.metrics", "jobs.lifecycle"):
        path = d / "recordings" / f"{base}.jsonl"
        if not path.exists():
            continue
        records, _ = replay.load(path)
        for topic, r in records:
            if topic == METRICS:
                samples.append(r)
            elif topic == LIFECYCLE and r.kind == "started":
                pids[r.job_id] = r.pid
    runs_path = d / "runs.json"
    runs = json.loads(runs_path.read_text()) if runs_path.exists() else []
    return {
        "samples": len(samples),
        "gpu_models": sorted({s.gpu_model for s in samples}),
        "fields": field_support(samples),
        "runs": process_attribution(samples, pids, runs),
    }


def to_markdown(summary: Mapping[str, Any]) -> str:
    """The co-located runs as a table: each job's own SM utilisation next to the device's."""
    lines = [
        "| combination | job | own SM % | own memory % | entries read / null | device SM % (NVML) | device SM % (GPM) | DRAM BW % |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cell(v: Any) -> str:
        return "" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)

    for run in summary["runs"]:
        if len(run["jobs"]) < 2:
            continue
        combo = " + ".join(run["job_types"])
        dev = run["device"]
        for j in run["jobs"]:
            lines.append(
                f"| {combo} | {j['job_type']} | {cell(j['proc_sm_util_pct'])} | {cell(j['proc_mem_util_pct'])} | "
                f"{j['entries_read']} / {j['entries_null']} | {cell(dev['sm_util_pct'])} | {cell(dev['gpm_sm_util_pct'])} | "
                f"{cell(dev['dram_bw_util_pct'])} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (1, 2):
        print("usage: python -m workloads.telemetry RUN_DIR [ATTRIBUTION.md]", file=sys.stderr)
        return 2
    summary = summarise(args[0])
    if len(args) == 2:
        Path(args[1]).write_text(to_markdown(summary))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The H200 experiment's CPU rehearsal: the real sampler over a fake Hopper NVML, recorded, then turned
into observations (with each job's own SM share) and the telemetry summary the script brings back."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from events import JobEvent, to_dict
from producers.fakenvml import FakeGpu, FakeNvml, hopper_gpm, mig_instance
from producers.metrics import ProducerMetrics
from producers.nvml import NvmlSampler
from workloads import dataset, telemetry
from workloads.nvml_probe import probe

T0 = 1_800_000_000.0  # a window boundary for 10 s windows
RUNS = [  # (job ids, start, end): a solo, b solo, then a and b together, 10 s apart (warm-up)
    (("a",), T0, T0 + 20.0),
    (("b",), T0 + 30.0, T0 + 50.0),
    (("a", "b"), T0 + 60.0, T0 + 90.0),
]
TYPES = {"a": "resnet50-bs32", "b": "lstm-bs40"}
PIDS = {"a": 101, "b": 102}
SOLO_UTIL = {"a": (90, 40), "b": (70, 30)}
CO_UTIL = {"a": (55, 25), "b": (35, 15)}
STEP_S = {("a",): 0.1, ("b",): 0.2, ("a", "b"): None}  # co-located: a 0.15 s/step, b 0.3 s/step
CO_STEP_S = {"a": 0.15, "b": 0.3}


def record(tmp_path: Path, gpu: FakeGpu) -> Path:
    """Sample ``gpu`` every 0.5 s through the real sampler while the jobs of RUNS run; write the run folder."""
    now = [T0 - 1.0]
    sampler = NvmlSampler(FakeNvml([gpu]), host="h", producer_id="p", clock=lambda: now[0], metrics=ProducerMetrics()).open()
    uuid = gpu.uuid
    lines: dict[str, list[str]] = {"gpu.metrics": [], "jobs.lifecycle": []}

    def job(ts: float, kind: str, j: str, **kw: object) -> None:
        ev = JobEvent(ts=ts, kind=kind, job_id=f"r{i}{j}", job_type=TYPES[j], gpu_uuid=uuid, host="h", pid=pid(j), **kw)  # type: ignore[arg-type]
        lines["jobs.lifecycle"].append(json.dumps({"_topic": "jobs.lifecycle", **to_dict(ev)}))

    runs = []
    i = 0

    def pid(j: str) -> int:  # every run starts new processes
        return PIDS[j] + 10 * i

    for i, (ids, start, end) in enumerate(RUNS, 1):
        for j in ids:
            job(start - 0.25, "started", j, steps=0)
        steps = dict.fromkeys(ids, 0)
        t = start
        while t < end:
            now[0] = t + 0.1
            util = CO_UTIL if len(ids) > 1 else SOLO_UTIL
            gpu.processes = [(pid(j), 2 * 1024**3) for j in ids]
            gpu.process_util = {pid(j): util[j] for j in ids}
            gpu.sm_util_pct = 95 if len(ids) > 1 else 80
            for s in sampler.sample():
                lines["gpu.metrics"].append(json.dumps({"_topic": "gpu.metrics", **to_dict(s)}))
            for j in ids:
                step = STEP_S[ids] or CO_STEP_S[j]
                steps[j] += round(0.5 / step)
                job(t + 0.2, "progress", j, steps=steps[j], step_time_s=step)
            t += 0.5
        for j in ids:
            job(end + 0.05, "finished", j, steps=steps[j])
        runs.append(
            {
                "index": i,
                "job_types": [TYPES[j] for j in ids],
                "job_ids": [f"r{i}{j}" for j in ids],
                "go_at": start,
                "end_at": end,
            }
        )
    sampler.close()
    out = tmp_path / "exp"
    (out / "recordings").mkdir(parents=True)
    for base, ls in lines.items():
        (out / "recordings" / f"{base}.jsonl").write_text("\n".join(ls) + "\n")
    (out / "runs.json").write_text(json.dumps(runs))
    return out


def csv_rows(out: Path) -> list[dict[str, str]]:
    recordings = [out / "recordings" / f"{b}.jsonl" for b in ("gpu.metrics", "jobs.lifecycle")]
    dataset.convert(recordings, out / "observations.csv", 10.0)
    with open(out / "observations.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_hopper_rehearsal_attributes_each_job_and_uses_dram_for_r_and_w(tmp_path: Path) -> None:
    out = record(tmp_path, FakeGpu("GPU-h", gpm=hopper_gpm()))
    rows = csv_rows(out)
    assert {r["job_type"] for r in rows} == set(TYPES.values()) and len(rows) == 6  # 3 co-located windows x 2 jobs
    for r in rows:
        own = CO_UTIL["a" if r["job_type"] == TYPES["a"] else "b"]
        assert float(r["proc_sm_util_pct"]) == own[0] and float(r["proc_mem_util_pct"]) == own[1]
        assert float(r["sm_share_pct"]) == pytest.approx(own[0] / 90 * 100)
        assert r["rw_source"] == "dram_bw_util_pct" and float(r["R_pct"]) == pytest.approx(0.0)  # the fake's DRAM is constant
        assert float(r["interference_pct"]) == pytest.approx(50.0)
    summary = telemetry.summarise(out)
    fields = summary["fields"]
    n = summary["samples"]
    assert n == 140 and fields["dram_bw_util_pct"] == {"samples": n, "read": n, "unavailable": 0, "mean": 42.25}
    assert fields["processes.sm_util_pct"]["read"] == fields["processes.sm_util_pct"]["samples"] > 0
    co = summary["runs"][2]
    assert [(j["job_type"], j["pid"], j["proc_sm_util_pct"]) for j in co["jobs"]] == [
        (TYPES["a"], 131, 55.0),
        (TYPES["b"], 132, 35.0),
    ]
    assert co["device"]["sm_util_pct"] == 95.0 and co["device"]["gpm_sm_util_pct"] == 64.0
    md = telemetry.to_markdown(summary)
    assert md.count("\n") == 4 and "| 55.0 |" in md  # header, rule, one line per job of the one pair


def test_pre_hopper_rehearsal_names_what_is_missing(tmp_path: Path) -> None:
    gpu = FakeGpu("GPU-v", name="Tesla V100", unsupported={"nvmlDeviceGetProcessUtilization"})
    out = record(tmp_path, gpu)
    rows = csv_rows(out)
    assert rows and all(r["proc_sm_util_pct"] == "" and r["sm_share_pct"] == "" and r["rw_source"] == "pcie_kbps" for r in rows)
    summary = telemetry.summarise(out)
    f = summary["fields"]
    assert f["dram_bw_util_pct"]["read"] == 0 and f["dram_bw_util_pct"]["unavailable"] == summary["samples"]
    assert f["processes.sm_util_pct"]["read"] == 0 and f["processes.sm_util_pct"]["unavailable"] > 0
    assert all(j["proc_sm_util_pct"] is None and j["entries_null"] > 0 for j in summary["runs"][2]["jobs"])


def test_mig_rehearsal_keeps_gpm_and_drops_attribution(tmp_path: Path) -> None:
    parent = FakeGpu("GPU-parent", gpm=hopper_gpm(), mig=[mig_instance("MIG-a", gpu_instance_id=1)])
    # jobs run on the MIG instance: point the run at it by sampling through the parent, recording the instance
    out = record(tmp_path, parent)
    summary = telemetry.summarise(out)
    mig = [json.loads(x) for x in (out / "recordings" / "gpu.metrics.jsonl").read_text().splitlines() if '"MIG-a"' in x]
    assert mig and all(m["dram_bw_util_pct"] == 12.5 and m["pcie_rx_bytes_per_s"] is None for m in mig)
    assert all("processes.sm_util_pct" in m["unavailable"] for m in mig)
    assert summary["gpu_models"] == ["NVIDIA H200", "NVIDIA H200 MIG"]


def test_probe_reads_gpm_and_per_process_utilisation_on_hopper() -> None:
    gpu = FakeGpu("GPU-h", gpm=hopper_gpm(), processes=[(7, None)], process_util={7: (50, 20)})
    report = probe(FakeNvml([gpu]), gpm_interval_s=0.0, sleep=lambda s: None)
    assert report["gpm"]["supported"] is True
    assert report["gpm"]["metrics"]["SM_OCCUPANCY"] == {"supported": True, "value": 31.5}
    assert report["gpm"]["metrics"]["DRAM_BW_UTIL"] == {"supported": True, "value": 42.25}
    (name,) = [k for k in report["fields"] if "nvmlDeviceGetProcessUtilization" in k]
    assert report["fields"][name]["supported"] is True and report["fields"][name]["value"][0]["smUtil"] == 50

"""`aip experiment` end to end on the CPU: real broker, real torch jobs (tiny), fake NVML in-process."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from producers.fakenvml import FakeGpu, FakeNvml
from workloads import dataset
from workloads.experiment import ExperimentConfig, parse_job, run_experiment

pytestmark = pytest.mark.integration


def test_experiment_produces_a_valid_observations_csv(settings: Any, tmp_path: Path) -> None:
    gpu = FakeGpu("GPU-fake-exp", name="NVIDIA H200")
    cfg = ExperimentConfig(
        jobs=[parse_job("cnn:16"), parse_job("lstm:8")],
        out_dir=tmp_path / "exp",
        duration_per_run_s=2.0,  # two 1 s windows per run
        size="tiny",
        device="cpu",
        window_s=1.0,
        sample_interval_s=0.1,
        report_every_s=0.1,
        job_args=["--threads", "1"],
    )
    summary = run_experiment(cfg, settings, nvml=FakeNvml([gpu]))

    assert summary["failed_runs"] == 0 and summary["runs"] == 3
    runs = json.loads((cfg.out_dir / "runs.json").read_text())
    assert [r["job_types"] for r in runs] == [["cnn-bs16"], ["lstm-bs8"], ["cnn-bs16", "lstm-bs8"]]
    assert all(r["exit_codes"] == [0] * len(r["job_types"]) for r in runs)

    # The recordings are `aip tail --json` lines of both topics.
    for base in ("gpu.metrics", "jobs.lifecycle"):
        lines = (cfg.out_dir / "recordings" / f"{base}.jsonl").read_text().splitlines()
        assert lines and all(json.loads(ln)["_topic"] == base for ln in lines)
    kinds = {json.loads(ln)["kind"] for ln in (cfg.out_dir / "recordings" / "jobs.lifecycle.jsonl").read_text().splitlines()}
    assert kinds == {"started", "progress", "finished"}

    with open(cfg.out_dir / "observations.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert set(rows[0]) == set(dataset.COLUMNS)
    assert {r["group"] for r in rows} == {"cnn-bs16 + lstm-bs8"}
    assert {r["job_type"] for r in rows} == {"cnn-bs16", "lstm-bs8"}  # both jobs of the pair
    assert summary["stage1"]["windows_solo"] >= 2
    for r in rows:
        assert r["environment"] == "NVIDIA H200" and r["gpu_uuid"] == "GPU-fake-exp"
        assert r["co_job_types"] == ({"cnn-bs16", "lstm-bs8"} - {r["job_type"]}).pop()
        for col in (
            "E_pct",
            "T_pct",
            "S_pct",
            "V_pct",
            "R_pct",
            "W_pct",
            "solo_E",
            "solo_M",
            "solo_throughput",
            "other_solo_E",
            "other_solo_throughput",
        ):
            assert math.isfinite(float(r[col])), (col, r[col])
        assert float(r["solo_throughput"]) > 0
        # The rate is unknown only in a window where the job reported no progress (a starved CPU).
        assert (r["interference_pct"] == "") == (r["throughput_steps_per_s"] == "")
        if r["interference_pct"]:
            assert math.isfinite(float(r["interference_pct"])) and float(r["interference_pct"]) > -100
    labelled = {r["job_type"] for r in rows if r["interference_pct"]}
    assert labelled == {"cnn-bs16", "lstm-bs8"}
    assert "| cnn-bs16 + lstm-bs8 | cnn-bs16 |" in (cfg.out_dir / "table.md").read_text()

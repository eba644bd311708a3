"""``aip up`` end to end: broker given, simulated fleet, worker, its metrics while it runs, summary as the last line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
import uuid
from typing import Any

import pytest
from conftest import children, exited, wait_for

from aip.faults.worker import metric_values

pytestmark = pytest.mark.integration

METRIC_FAMILIES = (
    "aip_stream_consumed_records_total",
    "aip_stream_published_records_total",
    "aip_stream_consumer_lag_records",
    "aip_observations_total",
    "aip_model_mae_points",
    "aip_model_selected_info",
)


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def test_up_prints_a_summary_with_observations_predictions_and_leaderboard(broker: Any) -> None:
    prefix = f"up{uuid.uuid4().hex[:10]}."
    # 30 s at 50x: 25 simulated minutes; every metric family is there after about 15 s on a loaded 2-core machine (at
    # 100x the worker falls behind, and stopping it with its backlog took 20 s)
    command = ["up", "--duration", "30", "--gpus", "4", "--speedup", "50", "--broker", broker.address, "--topic-prefix", prefix]
    proc = subprocess.Popen(
        [sys.executable, "-m", "aip.cli", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        match = re.search(r"worker at (http://127\.0\.0\.1:\d+)", first)
        assert match, first
        # what an operator's `curl .../metrics` shows while aip up runs
        metrics = wait_for(
            lambda: (
                (body := _get(match.group(1) + "/metrics"))
                and all(metric_values(body, f) for f in METRIC_FAMILIES)
                and body
            ),
            timeout_s=60,
            interval_s=0.5,
            what="the worker's metrics with every family",
        )
        assert metric_values(metrics, "aip_stream_consumed_records_total", topic="gpu.metrics")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = out.strip().splitlines()
    assert lines, err[-2000:]
    summary = json.loads(lines[-1])
    assert summary["errors"] == [], summary
    assert proc.returncode == 0
    assert summary["observations"] > 0 and summary["predictions"] > 0 and summary["leaderboard"] > 0, summary
    assert summary["deadletters"] == 0
    assert summary["selected"]["v100"]
    # what each mode serves, with the error it was chosen by, next to its name
    served = summary["served"]["v100"]
    assert served and {k.split(":")[1] for k in served} <= {"seen", "new"}
    assert all(s["model"] and s["category"] and "error_pct" in s for s in served.values())
    assert {"alerts", "deadletters"} <= summary.keys()


def test_up_killed_leaves_no_worker_behind(broker: Any) -> None:
    """Even SIGKILL of `aip up` (no chance to clean up) ends its worker: children die with their parent."""
    prefix = f"up{uuid.uuid4().hex[:10]}."
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aip.cli",
            "up",
            "--duration",
            "60",
            "--gpus",
            "1",
            "--broker",
            broker.address,
            "--topic-prefix",
            prefix,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        assert "worker at" in proc.stderr.readline()
        pids = wait_for(lambda: children(proc.pid), timeout_s=30, what="aip up's worker process")
    finally:
        proc.kill()
        proc.wait(10)
    for pid in pids:
        wait_for(lambda pid=pid: exited(pid), timeout_s=60, what=f"orphaned child {pid} to exit")  # a clean stop, loaded

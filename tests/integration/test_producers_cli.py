"""`aip produce sim` and `aip run-job` against the embedded broker."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from events import HostJobEvents, HostMetrics, MetricSample
from transport import RecordConsumer

pytestmark = pytest.mark.integration


def aip(settings, *argv: str, timeout: int = 60) -> subprocess.CompletedProcess:
    env = {"AIP_SPOOL_DIR": settings.spool_dir, "PATH": "/usr/bin:/bin"}
    kafka = ["--broker", settings.broker, "--topic-prefix", settings.topic_prefix]
    cut = argv.index("--") if "--" in argv else len(argv)  # before the wrapped command
    return subprocess.run(
        [sys.executable, "-m", "aip.cli", *argv[:cut], *kafka, *argv[cut:]],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_produce_sim_publishes_metrics_and_the_whole_lifecycle(settings, tmp_path) -> None:
    truth = tmp_path / "truth.jsonl"
    proc = aip(
        settings, "produce", "sim", "--gpus", "3", "--gpus-per-host", "2", "--fast", "--duration", "400", "--seed", "2",
        "--ground-truth", str(truth),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["left_in_spool"] == 0 and summary["sent"] == summary["gpu.metrics"] + summary["jobs.lifecycle"]
    with RecordConsumer(settings, ["gpu.metrics", "jobs.lifecycle"], from_beginning=True, keep_host_batches=True) as c:
        items = c.read(until=lambda xs: len(xs) >= summary["sent"], timeout_s=30)
    assert not [i.error for i in items if i.error]
    assert len(items) == summary["sent"]
    batches = [i.record for i in items if i.topic.endswith("gpu.metrics")]
    assert {type(b) for b in batches} == {HostMetrics} and sorted({len(b.samples) for b in batches}) == [1, 2]
    assert summary["gpu_samples"] == sum(len(b.samples) for b in batches) == 3 * 399  # no samples at tick 0
    gpus = {s.gpu_uuid for b in batches for s in b.samples}
    job_batches = [i.record for i in items if i.topic.endswith("jobs.lifecycle")]
    assert {type(b) for b in job_batches} == {HostJobEvents} and max(len(b.events) for b in job_batches) > 1
    assert summary["job_events"] == sum(len(b.events) for b in job_batches) > len(job_batches)
    kinds = Counter(e.kind for b in job_batches for e in b.events)
    assert len(gpus) == 3 and kinds["started"] and kinds["progress"] and kinds["finished"]
    hosts = {i.record.host for i in items}
    assert summary["hosts"] == 2 and hosts == {"sim2-host00", "sim2-host01"}  # 3 GPUs, 2 per host
    assert all(i.key == i.record.host.encode() for i in items)  # a GPU's samples and job events share the host key
    rows = [json.loads(x) for x in truth.read_text().splitlines()]
    assert rows and {r["gpu_uuid"] for r in rows} <= gpus


def test_produce_sim_per_gpu_sends_one_record_per_sample(settings) -> None:
    proc = aip(settings, "produce", "sim", "--gpus", "2", "--fast", "--duration", "30", "--per-gpu")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["gpu.metrics"] == summary["gpu_samples"] == 2 * 29
    with RecordConsumer(settings, ["gpu.metrics"], from_beginning=True) as c:
        items = c.read(until=lambda xs: len(xs) >= summary["gpu.metrics"], timeout_s=30)
    assert len(items) == summary["gpu.metrics"] and {type(i.record) for i in items} == {MetricSample}


CHILD = """
from producers.lifecycle import JobReporter
now = [1_700_000_000.0]
with JobReporter(clock=lambda: now[0]) as job:
    for _ in range(10):
        now[0] += 0.5
        job.step()
raise SystemExit(3)
"""


def test_run_job_reports_exit_status_and_passes_progress_through(settings) -> None:
    proc = aip(
        settings,
        "run-job",
        "--type",
        "ResNet-50 (batch size 64)",
        "--gpu",
        "GPU-test",
        "--batch-size",
        "64",
        "--job-id",
        "j1",
        "--",
        sys.executable,
        "-c",
        CHILD,
    )
    assert proc.returncode == 3, proc.stderr
    with RecordConsumer(settings, ["jobs.lifecycle"], from_beginning=True) as c:
        items = c.read(
            until=lambda xs: sum(x.record.kind == "finished" for x in xs if x.record) >= 1 and len(xs) >= 4, timeout_s=20
        )
    events = sorted((i.record for i in items), key=lambda r: r.ts)
    kinds = Counter(e.kind for e in events)
    assert kinds == {"started": 1, "progress": 2, "finished": 1}
    finished = next(e for e in events if e.kind == "finished")
    assert finished.exit_code == 3 and finished.job_id == "j1" and finished.gpu_uuid == "GPU-test"
    assert len({e.host for e in events}) == 1 and all(i.key == events[0].host.encode() for i in items)  # the script's too
    progress = [e for e in events if e.kind == "progress"]
    assert all(e.batch_size == 64 and e.job_type == "ResNet-50 (batch size 64)" and e.step_time_s == 0.5 for e in progress)

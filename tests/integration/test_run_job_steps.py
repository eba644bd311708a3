"""`aip run-job` on an unmodified PyTorch script: the injected step hook's progress, on the embedded broker,
and a real worker's co-located observation from two such jobs on one GPU."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, wait_for, worker_settings
from records import sample

from events.topics import METRICS
from transport import RecordConsumer

pytestmark = pytest.mark.integration
TRAIN = ROOT / "tests" / "train_steps.py"


def run_job(settings: Any, host: str, job_id: str, out: Path, steps: int, gpu: str = "GPU-hook-0") -> subprocess.Popen[str]:
    """``aip run-job`` of the plain training script (no aip import in it), as a user starts it."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "AIP_SPOOL_DIR": settings.spool_dir or str(out.parent / "spool"),
        "AIP_HOST": host,
    }
    argv = [
        sys.executable, "-m", "aip.cli", "run-job", "--type", "MLP-tiny", "--gpu", gpu, "--job-id", job_id,
        "--broker", settings.broker, "--topic-prefix", settings.topic_prefix,
        "--", sys.executable, str(TRAIN), str(out), str(steps), "0.01",
    ]  # fmt: skip
    return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def lifecycle(settings: Any, until: Any, timeout_s: float = 60.0) -> list[Any]:
    """Every job event on the topic (single records and host batches) once ``until(events)``."""
    with RecordConsumer(settings, ["jobs.lifecycle"], from_beginning=True) as c:
        events: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not until(events):
            for item in c.poll(timeout_s=0.5):
                assert item.error is None, item.error
                events.extend(getattr(item.record, "events", None) or [item.record])
        return events


def weighted_step_time_s(progress: list[Any]) -> float:
    """The mean step time over the progress reports (each weighs its steps)."""
    done = [progress[0].steps - 1] + [b.steps - a.steps for a, b in itertools.pairwise(progress)]
    return sum(d * p.step_time_s for d, p in zip(done, progress, strict=True)) / sum(done)  # the first step is not timed


def test_unmodified_script_reports_its_step_times(settings: Any, tmp_path: Path) -> None:
    out = tmp_path / "own.json"
    proc = run_job(settings, "hook-host", "j-hook", out, steps=400)
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, output
    own = json.loads(out.read_text())
    events = lifecycle(settings, lambda es: any(e.kind == "finished" for e in es))
    kinds = [e.kind for e in sorted(events, key=lambda e: e.ts)]
    assert kinds[0] == "started" and kinds[-1] == "finished" and "progress" in kinds, kinds
    progress = sorted((e for e in events if e.kind == "progress"), key=lambda e: e.steps)
    assert len(progress) >= 2 and progress[-1].steps == 400  # the hook's last report at exit counts every step
    assert {(e.job_id, e.job_type, e.gpu_uuid, e.host) for e in events} == {("j-hook", "MLP-tiny", "GPU-hook-0", "hook-host")}
    measured = weighted_step_time_s(progress)
    assert abs(measured - own["step_time_s"]) <= 0.10 * own["step_time_s"], (measured, own, [e.step_time_s for e in progress])
    finished = next(e for e in events if e.kind == "finished")
    assert finished.exit_code == 0 and finished.steps == 400
    assert len({e.pid for e in events}) == 1  # the training process's, in every event


class MetricFeeder:
    """One fake GPU's samples at 4 Hz in real time (as ``aip produce nvml`` would send them), on a thread."""

    def __init__(self, settings: Any, host: str, gpu: str, gpu_model: str) -> None:
        from producers.publisher import Publisher

        self.pub = Publisher(settings, f"feeder-{uuid.uuid4().hex[:6]}")
        self.host, self.gpu, self.gpu_model = host, gpu, gpu_model
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seq = 0
        while not self.stop.wait(0.25):
            seq += 1
            s = sample(ts=time.time(), host=self.host, gpu_uuid=self.gpu, gpu_model=self.gpu_model, seq=seq, producer_id="feeder")
            self.pub.publish(METRICS, s)

    def __enter__(self) -> MetricFeeder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        self.pub.close(timeout_s=10)


def test_two_unmodified_jobs_on_one_gpu_make_a_colocated_observation(broker: Any, tmp_path: Path) -> None:
    from aip.broker import free_port
    from aip.faults.worker import WorkerProcess

    settings = dataclasses.replace(
        worker_settings(broker, tmp_path, "hook"), window_s=4.0, lateness_s=1.0, spool_dir=str(tmp_path / "spool")
    )
    env_name = f"hook-{uuid.uuid4().hex[:6]}"
    host, gpu = f"host-{env_name}", f"GPU-{env_name}"
    worker = WorkerProcess(settings, free_port(), tmp_path / "worker.log").start()
    try:
        worker.wait_ready(120)
        with MetricFeeder(settings, host, gpu, env_name):
            # 35 s of steps: it outlasts the wait below, the second's start (a torch import) and its 10 s of steps
            first = run_job(settings, host, "j-first", tmp_path / "first.json", steps=3500, gpu=gpu)
            # the first job runs alone for a few progress reports (solo windows with a step rate), then the second joins
            wait_for(
                lambda: sum(e.kind == "progress" for e in lifecycle(settings, lambda es: False, timeout_s=1.0)) >= 4,
                timeout_s=120,
                what="the first job's progress",
            )
            second = run_job(settings, host, "j-second", tmp_path / "second.json", steps=1000, gpu=gpu)
            for p in (second, first):
                output, _ = p.communicate(timeout=240)
                assert p.returncode == 0, output

            def colocated() -> list[Any]:
                with RecordConsumer(settings, ["interference.observations"], from_beginning=True) as c:
                    items = c.read(until=lambda xs: False, timeout_s=2.0)
                obs = [o for i in items for o in (getattr(i.record, "observations", None) or [i.record]) if o is not None]
                return [o for o in obs if o.environment == env_name and o.co_job_ids]

            found = wait_for(colocated, timeout_s=90, interval_s=1.0, what="a co-located observation")
    finally:
        assert worker.stop(60) in (0, -15), worker.log_tail()
    pairs = {(o.job_id, tuple(o.co_job_ids)) for o in found}
    assert pairs & {("j-first", ("j-second",)), ("j-second", ("j-first",))}, pairs
    assert all(o.gpu_uuid == gpu and o.co_job_types == ["MLP-tiny"] for o in found)
    measured = [o for o in found if o.interference_pct is not None]
    assert measured, found  # the hook's progress gave the stream measured step rates in co-located windows

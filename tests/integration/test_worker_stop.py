"""A worker asked to stop is gone within ``AIP_WORKER_STOP_WITHIN_S``, even when its broker went away first.

Without the watchdog (``AIP_TEST_STOP_WITHIN_S=1000``) the hang is not certain: of three such runs of this
scenario, one worker was still retrying the broker 60 s after SIGTERM and two stopped in seconds; orphans of
killed ``aip up`` runs were still there 50 min later.  The watchdog itself is tested exactly in
``tests/unit/test_stream_agents.py``."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
from conftest import wait_for

from aip.broker import EmbeddedBroker, free_port
from aip.faults.scenarios import START_TS, PacedSender, _fleet
from aip.faults.worker import WorkerProcess
from config import Settings
from transport import ensure_project_topics

pytestmark = pytest.mark.integration

STOP_WITHIN_S = float(os.environ.get("AIP_TEST_STOP_WITHIN_S", "5"))


# the simulator's producer is cut off with the broker, by design: its garbage-collected client complains
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_busy_worker_whose_broker_is_gone_still_stops_on_sigterm(tmp_path: Path) -> None:
    broker = EmbeddedBroker(port=free_port()).start()
    try:
        settings = Settings.from_env(
            broker=broker.address,
            topic_prefix=f"stop{uuid.uuid4().hex[:8]}.",
            partitions=2,
            state_dir=str(tmp_path / "state"),
            worker_stop_within_s=STOP_WITHIN_S,
        )
        ensure_project_topics(settings)
        worker = WorkerProcess(settings, free_port(), tmp_path / "worker.log").start()
        worker.wait_ready()
        PacedSender(settings, _fleet(8, 3, START_TS, 600.0), 20.0).start()  # still sending when the broker goes
        wait_for(
            lambda: worker.counter("aip_stream_published_records_total", topic="observations") > 0,
            timeout_s=60,
            interval_s=0.5,
            what="the worker's first observations",
        )
    finally:
        broker.stop()
    time.sleep(2.0)  # its connections fail; it retries
    worker.terminate()
    try:
        wait_for(lambda: not worker.alive(), timeout_s=STOP_WITHIN_S + 30, interval_s=0.5, what="the worker to exit")
    finally:
        worker.stop(5)  # SIGKILL if still there
    assert worker.proc is not None and worker.proc.returncode in (0, 1), worker.log_tail()

"""A worker reading a fleet's history at full speed, with ``refit_max_lag_s`` set: stage 2 waits for its refits
(``Refits.keep_up``) instead of serving models the burst has left behind, and learns every observation."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import wait_for, worker_settings

from aip.faults.scenarios import produce_records
from aip.faults.worker import WorkerProcess

pytestmark = pytest.mark.integration
START_TS = 1_700_000_000.0


@pytest.fixture()
def worker(broker: Any, tmp_path: Any) -> Iterator[WorkerProcess]:
    """A worker started on a fleet's history already in the topics (1,800 s of four GPUs, sent in a few seconds):
    it reads it as a backlog, at full speed."""
    from aip.broker import free_port
    from producers.sim import Simulator

    settings = dataclasses.replace(worker_settings(broker, tmp_path, "keepup"), refit_max_lag_s=60.0)
    produce_records(settings, Simulator(gpus=4, gpu_model="v100", seed=5, start_ts=START_TS, duration_s=1800).events())
    w = WorkerProcess(settings, free_port(), tmp_path / "worker.log").start()
    try:
        wait_for(w.ready, timeout_s=60, what="the worker's web server")
        yield w
    finally:
        assert w.stop(60) in (0, -15), w.log_tail()


def test_a_burst_of_history_waits_for_its_refits_and_loses_nothing(worker: WorkerProcess) -> None:
    def stage2(kind: str) -> float:
        return worker.counter("aip_stream_stage_events_total", stage="stage2", kind=kind)

    def drained() -> bool:
        published = worker.counter("aip_stream_published_records_total", topic="observations")
        return published > 0 and worker.counter("aip_stream_consumed_observations_total") >= published

    wait_for(lambda: stage2("refits_awaited") >= 1 and drained(), timeout_s=180, what="a refit awaited, every observation read")
    awaited, applied = stage2("refits_awaited"), stage2("refits_applied")
    assert 1 <= awaited <= applied, (awaited, applied)
    assert stage2("refit_await_ms") > 0
    # every observation read was served and learned (or answered, a lone job's), none lost while stage 2 waited
    read = worker.counter("aip_stream_consumed_observations_total")
    kinds = ("observations", "duplicates", "solo_windows", "windows_not_understood")
    # a record's observations count as read before stage 2 goes through them, and it may wait for a refit mid-record
    wait_for(lambda: sum(stage2(k) for k in kinds) >= read, timeout_s=60, what="stage 2 through every observation read")
    assert sum(stage2(k) for k in kinds) == read, {k: stage2(k) for k in kinds}
    assert stage2("observations") >= 30 and stage2("duplicates") == 0  # the first refit's rows, at least
    assert worker.counter("aip_stream_deadletters_total") == 0

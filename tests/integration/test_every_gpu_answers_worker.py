"""Every GPU answers the scheduler's question, through a real worker on the embedded broker.

A fleet whose co-located GPUs teach the worker three job types, two GPUs that only ever run one job at a time, and a
GPU that runs nothing: the lone GPUs publish what-if entries every window (``occupancy`` ``solo``), the idle one
says it is idle, and the extender's ``/prioritize`` scores the lone GPUs' node from their entries.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import wait_for
from extender_payloads import kube_args, pod

from events import MetricSample, Prediction

pytestmark = pytest.mark.integration
START_TS = 1_700_000_000.0
DURATION_S = 600
TYPES = ["A3C", "LM (batch size 20)", "ResNet-18 (batch size 32)"]
NEWCOMER = "LM (batch size 20)"
IDLE_GPU = "GPU-idle-0"


def _idle_samples() -> Iterator[tuple[str, MetricSample]]:
    for k in range(DURATION_S):
        yield "gpu.metrics", MetricSample(ts=START_TS + k + 0.1, host="idle-host", gpu_uuid=IDLE_GPU, gpu_index=0,
                                          gpu_model="v100", seq=k, power_w=40.0, sm_util_pct=0.0, producer_id="idle")  # fmt: skip


def _cost(newcomer_pct: float, existing_pct: float) -> float:
    """The placement cost (docs/ARCHITECTURE.md, "Definitions"): the newcomer's slowdown plus the slowdown it causes, speed-ups counted as 0."""
    return max(0.0, newcomer_pct) + max(0.0, existing_pct)


def test_lone_and_idle_gpus_answer_on_the_topic_and_in_prioritize(settings: Any, tmp_path: Any) -> None:
    from aip.broker import free_port
    from aip.faults.worker import WorkerProcess
    from producers.sim import Simulator
    from transport import RecordConsumer, RecordProducer, ensure_project_topics

    ensure_project_topics(settings)
    shared = Simulator(gpus=4, seed=7, start_ts=START_TS, duration_s=DURATION_S, job_types=TYPES, gpus_per_host=4)
    lone = Simulator(gpus=2, seed=5, start_ts=START_TS, duration_s=DURATION_S, job_types=TYPES, gpus_per_host=2,
                     max_jobs_per_gpu=1)  # fmt: skip
    lone_gpus = {g.uuid for g in lone.gpus}
    lone_host = lone.gpus[0].host
    # the lone GPUs' last jobs, running at the end (they started well before it: their solo windows close)
    current = {g: max((j for j in lone.jobs() if j["gpu_uuid"] == g), key=lambda j: j["start_ts"]) for g in lone_gpus}
    assert all(j["start_ts"] < START_TS + DURATION_S - 30 for j in current.values())
    worker = WorkerProcess(settings, free_port(), tmp_path / "worker.log").start()
    env = dict(os.environ, AIP_BROKER=settings.broker, AIP_TOPIC_PREFIX=settings.topic_prefix)
    extender = subprocess.Popen([sys.executable, "-m", "aip.cli", "extender", "--port", "0", "--from-beginning",
                                 "--max-age", "86400"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        worker.wait_ready()
        url = extender.stdout.readline().split()[3]  # type: ignore[union-attr]
        with RecordProducer(settings) as p:
            for topic, record in heapq.merge(shared.events(), lone.events(), _idle_samples(), key=lambda e: e[1].ts):
                p.send(topic, record)
            p.flush(30)

        latest: dict[str, Prediction] = {}  # GPU -> its latest prediction with what-if entries
        answers: list[Prediction] = []
        with RecordConsumer(settings, ["interference.predictions"], from_beginning=True) as consumer:

            def read() -> None:
                for item in consumer.poll(timeout_s=0.5):
                    p = item.record
                    assert p is not None, item.error
                    answers.append(p)
                    if p.what_if and (p.gpu_uuid not in latest or p.window_end >= latest[p.gpu_uuid].window_end):
                        latest[p.gpu_uuid] = p

            def lone_gpus_answer_for_every_type() -> bool:
                read()
                return all(g in latest and {w.job_type for w in latest[g].what_if} == set(TYPES) for g in lone_gpus)

            wait_for(lone_gpus_answer_for_every_type, timeout_s=180, interval_s=0.5,
                     what=f"the lone GPUs' what-if entries for every type; worker log: {worker.log_tail(1500)}")  # fmt: skip
            from_lone = [p for p in answers if p.gpu_uuid in lone_gpus]
            assert from_lone and all(p.occupancy == "solo" and len(p.job_set) == 1 and p.model == "solo" for p in from_lone)
            assert all(p.interference_pct == 0.0 and p.mode == "placement" for p in from_lone)
            # every window of a lone GPU's job answers: one prediction per window, job by job
            windows = {(p.gpu_uuid, p.window_end) for p in from_lone}
            assert len(windows) == len(from_lone) > 20
            # the idle GPU: a newcomer would run there alone
            wait_for(lambda: read() or any(p.gpu_uuid == IDLE_GPU for p in answers), timeout_s=60, what="the idle GPU")
            idle = [p for p in answers if p.gpu_uuid == IDLE_GPU]
            assert all(p.occupancy == "idle" and p.job_set == [] and p.job_id == "" for p in idle)
            assert any({w.job_type for w in p.what_if} == set(TYPES) for p in idle)
            assert all(w.newcomer_pct == w.existing_pct == 0.0 for p in idle for w in p.what_if)

            def prioritized() -> Any:  # /prioritize scores the lone node from its GPUs' latest entries (retried)
                read()
                costs = [_cost(w.newcomer_pct, w.existing_pct) for g in lone_gpus for w in latest[g].what_if
                         if w.job_type == NEWCOMER and latest[g].job_id == current[g]["job_id"]]  # fmt: skip
                if len(costs) != len(lone_gpus):
                    return None
                want = math.floor(10.0 * (1.0 - min(min(costs), 250.0) / 250.0) + 0.5)
                body = json.dumps(kube_args(pod({"aip.io/job-type": NEWCOMER}), [lone_host, "no-such-node"])).encode()
                with urllib.request.urlopen(urllib.request.Request(url + "/prioritize", data=body), timeout=10) as r:
                    answer = json.loads(r.read())
                with urllib.request.urlopen(f"{url}/score?job_type={urllib.parse.quote(NEWCOMER)}&nodes={lone_host}",
                                            timeout=10) as r:  # fmt: skip
                    basis = json.loads(r.read())["nodes"][0]["basis"]
                return answer if answer[0] == {"Host": lone_host, "Score": want} and basis == "predicted" else None

            answer = wait_for(prioritized, timeout_s=90, interval_s=0.5, what="/prioritize from the lone GPUs' entries")
            assert answer[1] == {"Host": "no-such-node", "Score": 5}  # a node without predictions: neutral
        assert worker.alive(), worker.log_tail()
    finally:
        extender.terminate()
        extender.wait(20)
        worker.stop(60)

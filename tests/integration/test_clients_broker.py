"""The scheduler client, the load balancer and both examples on the embedded broker, fed by a real worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, wait_for, worker_settings
from records import placement_prediction

from clients import LoadBalancer, SchedulerClient
from events import Alert, Prediction, WhatIf

pytestmark = pytest.mark.integration
START_TS = 1_700_000_000.0
SIMULATED_S = 900  # of the fed worker's fleet (at 600 the extender test found no node scored from a prediction, once)


def test_client_follows_the_predictions_topic(settings: Any) -> None:
    from transport import RecordProducer, ensure_project_topics

    ensure_project_topics(settings)
    client = SchedulerClient(settings, clock=lambda: START_TS).start()
    try:
        with RecordProducer(settings) as p:
            for gpu, cost in (("GPU-a", 80.0), ("GPU-b", 20.0)):
                p.send("interference.predictions", placement_prediction(gpu, cost, START_TS))
            p.flush(10)
        wait_for(lambda: len(client.snapshot()) == 2, timeout_s=20, what="both GPUs' predictions")
        assert client.best_gpu("X", ["GPU-a", "GPU-b"]) == "GPU-b"
    finally:
        client.close()


def test_client_that_subscribes_mid_run_learns_the_job_set_from_the_predictions(settings: Any) -> None:
    """Jobs started before the client subscribed: one finishing must not make the GPU look idle."""
    from events import JobEvent
    from transport import RecordProducer, ensure_project_topics

    ensure_project_topics(settings)

    def ev(job_id: str, job_type: str, kind: str, ts: float, gpu: str = "GPU-a", host: str = "node-1") -> JobEvent:
        steps = {"steps": 10, "step_time_s": 0.1} if kind == "progress" else {}
        return JobEvent(ts=ts, kind=kind, job_id=job_id, job_type=job_type, gpu_uuid=gpu, host=host, **steps)

    def pred(window_end: float) -> Prediction:
        return Prediction(
            ts=START_TS, gpu_uuid="GPU-a", environment="v100", job_id="j1", job_type="LM", job_set=["GAN", "LM"],
            mode="placement", interference_pct=20.0, model="m", category="all", window_end=window_end,
            what_if=[WhatIf(job_type="X", newcomer_pct=15.0, existing_pct=10.0)],
        )  # fmt: skip

    t = START_TS
    with RecordProducer(settings) as p:
        for record in (ev("j1", "LM", "started", t - 60), ev("j2", "GAN", "started", t - 50), pred(t - 10)):
            p.send("jobs.lifecycle" if isinstance(record, JobEvent) else "interference.predictions", record)
        p.flush(10)
        client = SchedulerClient(settings, clock=lambda: START_TS)  # from the end: the history above is not seen
        try:
            marks = 0

            def positioned() -> bool:  # a marker on another GPU, sent until the client receives one
                nonlocal marks
                marks += 1
                p.send("jobs.lifecycle", ev("m", "LM", "progress", t, gpu="GPU-marker", host="node-marker"))
                p.flush(10)
                return client.poll_once(0.3) > 0

            wait_for(positioned, timeout_s=20, what="the client to be positioned at the end")
            client.start()
            for topic, record in (
                ("jobs.lifecycle", ev("j1", "LM", "progress", t + 1)),
                ("interference.predictions", pred(t + 10)),
                ("jobs.lifecycle", ev("j2", "GAN", "progress", t + 11)),
            ):
                p.send(topic, record)
            p.flush(10)
            wait_for(lambda: client.cost_pct("GPU-a", "X") == 25.0 and client.snapshot()["GPU-a"].complete,
                     timeout_s=20, what="the prediction and the progress after it")  # fmt: skip
            p.send("jobs.lifecycle", ev("j1", "LM", "finished", t + 15))
            p.flush(10)
            wait_for(lambda: client.running_jobs("GPU-a") == 1, timeout_s=20, what="j1's finish")
            assert client.cost_pct("GPU-a", "X") is None  # GAN still runs: not idle, and the entries are stale
            p.send("jobs.lifecycle", ev("j2", "GAN", "finished", t + 18))
            p.flush(10)
            wait_for(lambda: client.cost_pct("GPU-a", "X") == 0.0, timeout_s=20, what="the GPU to be known idle")
            assert client.gpus_by_host()["node-1"] == ["GPU-a"]
        finally:
            client.close()


@pytest.fixture(scope="module")
def fed_worker(broker: Any, tmp_path_factory: Any) -> Iterator[Any]:
    """A worker that has processed a simulated fleet with interference above the alert threshold."""
    from aip.broker import free_port
    from producers.sim import Simulator
    from transport import RecordProducer

    tmp = tmp_path_factory.mktemp("clients")
    settings = worker_settings(broker, tmp, "c")
    # dynamic group membership: Tansu holds a static member's SyncGroup 3 s longer, and this worker never restarts
    env = dict(os.environ, AIP_BROKER=broker.address, AIP_TOPIC_PREFIX=settings.topic_prefix, AIP_STATE_DIR=settings.state_dir,
               AIP_GROUP_INSTANCE_ID="none")  # fmt: skip
    log = tmp / "worker.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "aip.cli", "worker", "--no-create-topics", "--web-port", str(free_port())],
        env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        sim = Simulator(gpus=4, gpu_model="v100", seed=5, start_ts=START_TS, duration_s=SIMULATED_S, gpus_per_host=2)
        with RecordProducer(settings) as p:
            for topic, record in sim.events():
                p.send(topic, record)
            p.flush(30)
        yield settings, env, proc, log
    finally:
        proc.terminate()
        proc.wait(60)  # a worker is gone within worker_stop_within_s (45 s) of SIGTERM


def test_load_balancer_acts_once_per_raised_alert_from_a_worker(fed_worker: Any) -> None:
    settings, _, proc, log = fed_worker
    moves: list[Any] = []
    seen: list[Alert] = []
    lb = LoadBalancer(moves.append, cooldown_s=0.0)
    handle = lb.handle

    def recording(alert: Alert) -> Any:
        seen.append(alert)
        return handle(alert)

    lb.handle = recording  # type: ignore[method-assign]
    stop = threading.Event()
    thread = threading.Thread(target=lb.run, args=(settings,), kwargs={"stop": stop, "from_beginning": True}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: moves or proc.poll() is not None, timeout_s=90, what="a move request from a real alert")
        assert proc.poll() is None, Path(log).read_text()[-2000:]
    finally:
        stop.set()
        thread.join(10)
    raised = [a for a in seen if a.state == "raised"]
    assert raised and all(a.interference_pct >= a.threshold for a in raised)
    keys = [(m.gpu_uuid, m.job_id) for m in moves]
    assert len(keys) == len(set(keys)) or any(a.state == "cleared" for a in seen)
    assert set(keys) <= {(a.gpu_uuid, a.job_id) for a in raised}


def test_client_and_scheduler_example_use_the_workers_what_if(fed_worker: Any) -> None:
    settings, env, _, _ = fed_worker
    # it reads the job lifecycle as the example does: a GPU its jobs fill (max_jobs_per_gpu), or whose job set changed
    # since its last prediction, is no choice; a measured entry (not novel) is costed at its expected values
    client = SchedulerClient(settings, from_beginning=True, max_age_s=float("inf"))

    def state() -> dict[str, Any]:
        return {g: (v.as_of, v.full, sorted(v.what_if)) for g, v in client.snapshot().items()}

    last: list[Any] = [None]

    def settled_choices() -> list[tuple[str, str]]:
        """Once the worker has published everything (the predictions read stay the same for 5 s, the state the
        example will read), the measured entries of GPUs that can take a job."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            client.poll_once(0.5)
        now = state()
        if now != last[0]:  # still changing (or first look): read again
            last[0] = now
            return []
        return [
            (g, jt)
            for g, v in client.snapshot().items()
            if not client.is_full(g)
            for jt in v.what_if
            if v.meta[jt].regime != "novel" and client.cost_pct(g, jt) is not None
        ]

    try:
        gpu, job_type = wait_for(
            settled_choices, timeout_s=150, what="settled what-if entries of a measured kind on a GPU that can take it"
        )[0]
        newcomer_pct, existing_pct = client.snapshot()[gpu].what_if[job_type]
        assert client.cost_pct(gpu, job_type) == max(0.0, newcomer_pct) + max(0.0, existing_pct)
        assert client.best_gpu(job_type, ["GPU-unknown", gpu]) == gpu
    finally:
        client.close()
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "scheduler.py"), job_type, gpu], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"best GPU: {gpu}" in out.stdout and "predicted cost" in out.stdout


def test_load_balancer_example_prints_move_requests(fed_worker: Any) -> None:
    _, env, _, _ = fed_worker
    proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / "load_balancer.py"), "--from-beginning"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert "move" in json.loads(line)
    finally:
        proc.terminate()
        proc.wait(10)


def test_extender_scores_the_workers_nodes(fed_worker: Any) -> None:
    """`aip extender --from-beginning` on a real worker's predictions: two simulated hosts, kube-scheduler's shapes."""
    import urllib.parse
    import urllib.request

    from extender_payloads import kube_args, pod

    from producers.sim import Simulator

    _, env, _, _ = fed_worker
    proc = subprocess.Popen([sys.executable, "-m", "aip.cli", "extender", "--port", "0", "--from-beginning", "--max-age", "3600"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    url = proc.stdout.readline().split()[3]  # type: ignore[union-attr]

    def get(path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        with urllib.request.urlopen(urllib.request.Request(url + path, data=data), timeout=10) as resp:
            return json.loads(resp.read())

    def predicted_score() -> Any:  # a job type for which some node is scored from a prediction
        for t in Simulator(gpus=1, gpu_model="v100").types:
            s = get("/score?job_type=" + urllib.parse.quote(t))
            if any(n["basis"] == "predicted" for n in s["nodes"]):
                return s
        return None

    try:
        hosts = ["sim5-host00", "sim5-host01"]
        wait_for(lambda: get("/healthz")["nodes"] == 2, timeout_s=60, what="both simulated hosts")
        scored = wait_for(predicted_score, timeout_s=90, what="a node scored from the worker's predictions")
        job_type = scored["job_type"]

        def agree() -> Any:  # /prioritize answers what /score says (retried: the worker may still be publishing)
            answer = get("/prioritize", kube_args(pod({"aip.io/job-type": job_type}), hosts))
            score = get("/score?job_type=" + urllib.parse.quote(job_type) + "&nodes=" + ",".join(hosts))
            return answer if {h["Host"]: h["Score"] for h in answer} == {n["node"]: n["score"] for n in score["nodes"]} else None

        answer = wait_for(agree, timeout_s=30, what="/prioritize to agree with /score")
        assert [h["Host"] for h in answer] == hosts and all(isinstance(h["Score"], int) and 0 <= h["Score"] <= 10 for h in answer)
        assert get("/healthz")["gpus"] == 4
    finally:
        proc.terminate()
        proc.wait(20)

"""`aip extender` as a process on the embedded broker: kube-scheduler and Volcano requests answered from the topics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import wait_for
from extender_payloads import kube_args, pod, volcano_predicate, volcano_prioritize

from events import JobEvent, Prediction, WhatIf

pytestmark = pytest.mark.integration
LM = "LM (batch size 20)"


def get(url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def extender(settings: Any) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`aip extender --port 0 --max-age 120` with AIP_EXTENDER_FULL_SCALE_PCT=200, following the test's topics from
    now on (it joins mid-stream)."""
    from transport import ensure_project_topics

    ensure_project_topics(settings)
    env = dict(os.environ, AIP_BROKER=settings.broker, AIP_TOPIC_PREFIX=settings.topic_prefix, AIP_EXTENDER_FULL_SCALE_PCT="200")
    proc = subprocess.Popen([sys.executable, "-m", "aip.cli", "extender", "--port", "0", "--max-age", "120"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("extender ready at http://127.0.0.1:"), line + proc.stderr.read()  # type: ignore[union-attr]
        yield line.split()[3], proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(20)


def test_extender_ranks_nodes_from_the_topics(settings: Any, extender: tuple[str, Any]) -> None:
    from transport import RecordProducer

    url, proc = extender
    now = time.time()

    def ev(gpu: str, host: str, job_id: str, job_type: str, kind: str, ts: float) -> JobEvent:
        steps = {"steps": 10, "step_time_s": 0.1} if kind == "progress" else {}
        return JobEvent(ts=ts, kind=kind, job_id=job_id, job_type=job_type, gpu_uuid=gpu, host=host, **steps)

    with RecordProducer(settings) as p:
        # the extender reads from the end: send a marker until it has seen one, then the fleet
        def positioned() -> bool:
            p.send("jobs.lifecycle", ev("GPU-marker", "node-m", "m", "A3C", "progress", now - 200))
            p.flush(10)
            return get(url + "/healthz")[1]["records_received"] > 0

        wait_for(positioned, timeout_s=30, what="the extender to follow the topics")
        # node-e's prediction is 200 s old: kept by the default --max-age (300), not by 120
        fleet = {"node-a": ("GPU-a", (40.0, 130.0), now), "node-b": ("GPU-b", (5.0, 5.0), now),
                 "node-c": ("GPU-c", (20.0, 60.0), now), "node-e": ("GPU-e", (0.0, 0.0), now - 200)}  # fmt: skip
        for host, (gpu, (newcomer, existing), ts) in fleet.items():
            p.send("jobs.lifecycle", ev(gpu, host, f"{gpu}-1", "A3C", "started", now - 100))
            p.send("jobs.lifecycle", ev(gpu, host, f"{gpu}-2", "GAN", "started", now - 90))
            p.send("interference.predictions", Prediction(
                ts=ts, gpu_uuid=gpu, environment="v100", job_id=f"{gpu}-1", job_type="A3C", job_set=["A3C", "GAN"],
                mode="placement", interference_pct=12.0, model="knn", category="all", window_end=ts - 20,
                what_if=[WhatIf(job_type=LM, newcomer_pct=newcomer, existing_pct=existing)],
            ))  # fmt: skip
        p.flush(10)
        wait_for(lambda: get(url + "/healthz")[1]["job_types"] == 1 and get(url + "/healthz")[1]["nodes"] == 5,
                 timeout_s=30, what="the fleet's predictions")  # fmt: skip

    nodes = ["node-a", "node-b", "node-c", "node-e", "node-new"]
    for cache_capable in (True, False):
        code, answer = get(url + "/prioritize", kube_args(pod({"aip.io/job-type": LM}), nodes, node_cache_capable=cache_capable))
        assert code == 200
        # 10 * (1 - cost / 200), half up: costs 170, 10 and 80 -> 1.5, 9.5, 6; aged out, no predictions: neutral 5
        assert answer == [{"Host": "node-a", "Score": 2}, {"Host": "node-b", "Score": 10}, {"Host": "node-c", "Score": 6},
                          {"Host": "node-e", "Score": 5}, {"Host": "node-new", "Score": 5}]  # fmt: skip
    code, result = get(url + "/filter", kube_args(pod({"aip.io/job-type": LM, "aip.io/max-slowdown-pct": "70"}), nodes))
    assert code == 200 and result["NodeNames"] == ["node-b", "node-c", "node-e", "node-new"]
    assert list(result["FailedNodes"]) == ["node-a"]
    code, vp = get(url + "/volcano/prioritize", volcano_prioritize(pod({"aip.io/job-type": LM}), nodes))
    assert code == 200 and vp["nodeScore"] == {"node-a": 15.0, "node-b": 95.0, "node-c": 60.0, "node-e": 50.0, "node-new": 50.0}
    _, vq = get(url + "/volcano/predicate", volcano_predicate(pod({"aip.io/job-type": LM, "aip.io/max-slowdown-pct": "70"}), "node-a"))
    assert vq["code"] == 2
    code, text = get(url + "/prioritize", {"Pod": "not a pod", "NodeNames": nodes})
    assert code == 400 and text.count("\n") == 1
    proc.terminate()
    assert proc.wait(20) == 0  # SIGTERM stops it cleanly

"""The extender on what a new user runs: the default CLI producer (`aip produce sim`, host batches), a worker and
`aip extender`, all as processes on the embedded broker. While the fleet runs, `/prioritize` scores its nodes from
the predictions (they differ between nodes) and agrees with `/score`'s ranking."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from typing import Any

import pytest
from conftest import wait_for
from extender_payloads import kube_args, pod

pytestmark = pytest.mark.integration
GPUS, GPUS_PER_HOST, SEED = 16, 4, 0
NODES = [f"sim{SEED}-host{h:02d}" for h in range(GPUS // GPUS_PER_HOST)]


def get(url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as resp:
        return json.loads(resp.read())


def test_prioritize_ranks_the_default_producers_nodes_as_score_does(settings: Any, tmp_path: Any) -> None:
    from aip.broker import free_port
    from aip.faults.worker import WorkerProcess
    from producers.sim import Simulator
    from transport import ensure_project_topics

    ensure_project_topics(settings)
    types = Simulator(gpus=GPUS, gpus_per_host=GPUS_PER_HOST, seed=SEED).types
    env = dict(os.environ, AIP_BROKER=settings.broker, AIP_TOPIC_PREFIX=settings.topic_prefix)
    worker = WorkerProcess(settings, free_port(), tmp_path / "worker.log").start()
    extender = subprocess.Popen([sys.executable, "-m", "aip.cli", "extender", "--port", "0"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    producer = None
    try:
        worker.wait_ready()
        url = extender.stdout.readline().split()[3]  # type: ignore[union-attr]
        producer = subprocess.Popen(
            [sys.executable, "-m", "aip.cli", "produce", "sim", "--gpus", str(GPUS), "--gpus-per-host", str(GPUS_PER_HOST),
             "--seed", str(SEED), "--speedup", "20", "--duration", "120"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

        def score(job_type: str) -> dict[str, Any]:
            return get(f"{url}/score?" + urllib.parse.urlencode({"job_type": job_type}))

        agreed: dict[str, Any] = {}

        def ranked_alike() -> bool:
            """For some job type: every node scored (at least two from predictions) and not all alike, the same in /score before and after
            /prioritize (the fleet moves on), and /prioritize's score of each node equal to /score's."""
            assert producer.poll() in (None, 0), producer.stderr.read()  # type: ignore[union-attr]
            for job_type in types:
                before = score(job_type)
                nodes = {n["node"]: n for n in before["nodes"]}
                bases = [n["basis"] for n in nodes.values()]
                if sorted(nodes) != NODES or len({n["score_exact"] for n in nodes.values()}) < 2:
                    continue
                if not set(bases) <= {"predicted", "idle"} or bases.count("predicted") < 2:
                    continue  # every node known, and at least two of them scored from their what-if entries
                prioritized = get(url + "/prioritize", kube_args(pod({"aip.io/job-type": job_type}), NODES))
                if score(job_type) != before:
                    continue
                agreed.update(job_type=job_type, score=before, prioritize={p["Host"]: p["Score"] for p in prioritized})
                return True
            return False

        wait_for(ranked_alike, timeout_s=120, interval_s=1.0, what="the extender to rank the producer's nodes")
    finally:
        for proc in (producer, extender):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(20)
        worker.stop()
    ranking, by_node = agreed["score"]["ranked"], {n["node"]: n for n in agreed["score"]["nodes"]}
    assert agreed["prioritize"] == {node: by_node[node]["score"] for node in NODES}
    assert len(set(agreed["prioritize"].values())) >= 2  # the nodes differ: not the neutral 5 everywhere
    assert [agreed["prioritize"][n] for n in ranking] == sorted(agreed["prioritize"].values(), reverse=True)
    assert {by_node[n]["basis"] for n in NODES} <= {"predicted", "idle"} and agreed["job_type"] in types
    assert all(by_node[n]["best_gpu"] is not None for n in NODES)

"""`aip produce nvml --kubernetes` against the embedded broker, a real PodResources gRPC server on a unix
socket and a fake API server; the fake NVML is given to the command's function (no GPU here)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kubefakes import FakeNode, FakePod, KubeApi, podresources_server

from aip.cli import build_parser
from aip.commands import produce
from events import HostJobEvents, HostMetrics, JobEvent
from producers.fakenvml import FakeGpu, FakeNvml
from transport import RecordConsumer

pytestmark = pytest.mark.integration
NODE = "gpu-node-7"
INVISIBLE_PID = 5_000_000  # above Linux's largest pid_max: no /proc entry, as without the host PID namespace


def run(settings: Any, capsys: Any, nvml: FakeNvml, duration_s: float) -> dict[str, Any]:
    args = build_parser().parse_args(
        ["produce", "nvml", "--kubernetes", "--interval", "100ms", "--duration", str(duration_s),
         "--broker", settings.broker, "--topic-prefix", settings.topic_prefix]
    )  # fmt: skip
    assert produce.run_nvml(args, nvml=nvml) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def step_hook(path: Path, pod_uid: str, stop: threading.Event) -> None:
    """A training pod's step hook: a report of 10 more steps every 0.2 s while the node producer runs (those sent
    before its collector listens, or before it knows the pod, are lost, as the hook's are), until ``stop``."""
    steps = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        while not stop.is_set():
            steps += 10
            with contextlib.suppress(OSError):  # not bound yet
                s.sendto(json.dumps({"v": 1, "pid": 7, "steps": steps, "step_time_s": 0.02, "ts": time.time(),
                                     "pod_uid": pod_uid}).encode(), str(path))  # fmt: skip
            stop.wait(0.2)


def test_produce_nvml_kubernetes_publishes_pods_jobs_and_a_restart_repeats_no_started(
    settings: Any, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    cluster = FakeNode()
    sock = tmp_path / "pr" / "kubelet.sock"  # short: a unix socket path has at most 107 bytes
    sock.parent.mkdir()
    kubelet = podresources_server(cluster, NODE, sock)
    api = KubeApi(cluster).start()
    gpus = [FakeGpu(uuid=f"GPU-00000000-0000-0000-0000-00000000000{i}") for i in range(3)]
    pods = [
        cluster.add(FakePod("ml", "bert-0", NODE, {"train": [gpus[0].uuid]}, job_type="bert")),
        cluster.add(FakePod("ml", "a3c-0", NODE, {"learner": [gpus[1].uuid]})),  # no annotation
        cluster.add(FakePod("ml", "gan-0", NODE, {"train": [f"{gpus[2].uuid}::0"]}, job_type="cyclegan")),
        cluster.add(FakePod("ml", "gan-1", NODE, {"train": [f"{gpus[2].uuid}::1"]}, job_type="cyclegan")),
    ]
    for i, g in enumerate(gpus):
        g.processes = [(INVISIBLE_PID + i, 1 << 30)]
        g.process_util = {INVISIBLE_PID + i: (40, 10)}
    for name, value in {
        "AIP_KUBERNETES_API": api.url,
        "AIP_NODE_NAME": NODE,
        "AIP_PODRESOURCES_SOCKET": str(sock),
        "AIP_SPOOL_DIR": settings.spool_dir,
        "AIP_HOST": NODE,
    }.items():
        monkeypatch.setenv(name, value)
    steps_sock = tmp_path / "aip" / "steps.sock"
    monkeypatch.setenv("AIP_STEP_SOCKET", str(steps_sock))
    hook_done = threading.Event()
    hook = threading.Thread(target=step_hook, args=(steps_sock, pods[0].uid, hook_done), daemon=True)
    hook.start()
    try:
        first = run(settings, capsys, FakeNvml(gpus), 3.0)
        hook_done.set()
        second = run(settings, capsys, FakeNvml(gpus), 2.0)  # a restart
    finally:
        api.stop()
        kubelet.stop(0)
        hook_done.set()
        hook.join(5)
    assert first["left_in_spool"] == second["left_in_spool"] == 0 and first["rounds"] > 5 and second["rounds"] > 3
    with RecordConsumer(settings, ["gpu.metrics", "jobs.lifecycle"], from_beginning=True, keep_host_batches=True) as c:
        items = c.read(until=lambda xs: len(xs) >= first["sent"] + second["sent"], timeout_s=30)
    records = [i.record for i in items]
    assert {type(r) for r in records} == {HostMetrics, HostJobEvents, JobEvent}  # host batches; the hook's progress
    events = [e for r in records if isinstance(r, HostJobEvents) for e in r.events]
    started = Counter((e.job_id, e.job_type, e.gpu_uuid) for e in events if e.kind == "started")
    want = {(p.uid, p.job_type or "unknown", ids[0].split("::")[0]) for p in pods for ids in p.gpus.values()}
    assert set(started) == want and set(started.values()) == {1}  # each once, the restart included
    progress = [r for r in records if isinstance(r, JobEvent) and r.kind == "progress"]
    assert progress and {(e.job_id, e.job_type, e.gpu_uuid) for e in progress} == {(pods[0].uid, "bert", gpus[0].uuid)}
    assert all(e.steps and e.step_time_s == 0.02 for e in progress)  # the pod's step hook, heard by the node's collector
    last = {s.gpu_uuid: s for r in records if isinstance(r, HostMetrics) for s in r.samples}
    owners = {g: [(p.namespace, p.pod, p.container) for p in s.processes] for g, s in last.items()}
    assert owners == {
        gpus[0].uuid: [("ml", "bert-0", "train")],
        gpus[1].uuid: [("ml", "a3c-0", "learner")],
        gpus[2].uuid: [(None, None, None)],  # time-sliced and its PIDs not visible here: the pods cannot be told apart
    }

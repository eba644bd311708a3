"""Kubernetes attribution (``aip produce nvml --kubernetes``) against a real PodResources gRPC server on a unix
socket, a local HTTP server answering the API server's pod list and watch, a fixture /proc and the fake NVML."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import uuid as uuidlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from kubefakes import CGROUP_FORMS, FakeNode, FakePod, KubeApi, cgroup_text, podresources_server, write_proc

from clients.extender import JOB_TYPE_ANNOTATION as EXTENDER_ANNOTATION
from events import GpuProcess, HostJobEvents, HostMetrics, JobEvent, MetricSample, decode, encode
from events.topics import LIFECYCLE, METRICS
from producers.fakenvml import FakeGpu, FakeNvml
from producers.kubernetes.attribution import KubernetesAttribution
from producers.kubernetes.cgroups import ProcPods, pod_of_cgroup
from producers.kubernetes.podresources import Assignment, PodResourcesClient, assignments
from producers.kubernetes.pods import JOB_TYPE_ANNOTATION, PodWatcher, api_client
from producers.nvml import NvmlSampler, run_sampler

NODE = "gpu-node-1"


def gpu_id() -> str:
    return f"GPU-{uuidlib.uuid4()}"


# ---------------------------------------------------------------------- pure parts
@pytest.mark.parametrize("form", CGROUP_FORMS)
def test_a_process_cgroup_names_its_pod_and_container_in_every_form(form: str) -> None:
    pod = FakePod("ml", "p", NODE, {"train": []})
    assert pod_of_cgroup(cgroup_text(pod, "train", form)) == (pod.uid, pod.container_id("train"))
    assert pod_of_cgroup(cgroup_text(None, "", form)) is None


def test_time_sliced_replicas_collapse_to_their_gpu_and_other_resources_are_ignored() -> None:
    from producers.kubernetes.podresources_v1 import api_pb2

    g = gpu_id()
    response = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                name="a",
                namespace="ml",
                containers=[
                    api_pb2.ContainerResources(
                        name="c",
                        devices=[
                            api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[f"{g}::3", f"{g}::4"]),
                            api_pb2.ContainerDevices(resource_name="example.com/fpga", device_ids=["fpga-0"]),
                        ],
                    )
                ],
            )
        ]
    )
    assert assignments(response) == [Assignment("ml", "a", "c", g)]


def test_the_job_type_annotation_is_the_extenders() -> None:
    assert JOB_TYPE_ANNOTATION == EXTENDER_ANNOTATION == "aip.io/job-type"


def test_gpu_process_pod_fields_are_optional_and_old_records_decode() -> None:
    old = MetricSample(ts=1.7e9, host="h", gpu_uuid="GPU-1", gpu_index=0, gpu_model="m", seq=0, processes=[GpuProcess(pid=7)])
    raw = encode(old).replace(b',"namespace":null,"pod":null,"container":null', b"")
    assert b"namespace" not in raw
    back = decode(MetricSample, raw)
    assert back.processes[0].pid == 7 and back.processes[0].pod is None
    new = GpuProcess(pid=8, namespace="ml", pod="bert-0", container="train")
    assert decode(MetricSample, encode(msgspec_replace(old, processes=[new]))).processes[0] == new


def msgspec_replace(record: Any, **fields: Any) -> Any:
    import msgspec

    return msgspec.structs.replace(record, **fields)


# ---------------------------------------------------------------------- servers
@pytest.fixture
def cluster() -> FakeNode:
    return FakeNode()


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "pr" / "kubelet.sock"  # short: a unix socket path has at most 107 bytes


@pytest.fixture
def kubelet(cluster: FakeNode, sock: Path) -> Any:
    sock.parent.mkdir(parents=True, exist_ok=True)
    server = podresources_server(cluster, NODE, sock)
    yield server
    server.stop(0)


@pytest.fixture
def kube_api(cluster: FakeNode) -> Any:
    api = KubeApi(cluster).start()
    yield api
    api.stop()


def watcher_of(url: str, **kwargs: Any) -> PodWatcher:
    client = api_client(url)
    return PodWatcher(NODE, lambda: client, watch_timeout_s=5, **kwargs).start()


def test_podresources_client_lists_the_gpus_of_the_nodes_pods(cluster: FakeNode, kubelet: Any, sock: Path) -> None:
    g0, g1 = gpu_id(), gpu_id()
    cluster.add(FakePod("ml", "a", NODE, {"train": [f"{g0}::0"]}))
    cluster.add(FakePod("ml", "b", NODE, {"train": [f"{g0}::1", g1]}, other_containers=["sidecar"]))
    cluster.add(FakePod("ml", "far", "other-node", {"train": [g1]}))
    got = PodResourcesClient(sock).list()
    assert sorted(got, key=lambda a: (a.pod, a.gpu_uuid)) == sorted(
        [Assignment("ml", "a", "train", g0), Assignment("ml", "b", "train", g0), Assignment("ml", "b", "train", g1)],
        key=lambda a: (a.pod, a.gpu_uuid),
    )


def test_pod_watcher_lists_then_follows_the_pods_of_its_node_only(cluster: FakeNode, kube_api: KubeApi) -> None:
    a = cluster.add(FakePod("ml", "a", NODE, {"train": []}, job_type="bert"))
    cluster.add(FakePod("ml", "far", "other-node", {"train": []}, job_type="bert"))
    w = watcher_of(kube_api.url)
    try:
        assert w.synced.wait(10)
        assert [p.uid for p in w.pods()] == [a.uid]
        assert w.by_name("ml", "a").job_type == "bert"
        b = cluster.add(FakePod("vision", "b", NODE, {"train": []}))
        wait_for(lambda: w.by_uid(b.uid), 10, what="the watch to add pod b")
        assert w.by_uid(b.uid).job_type == "unknown" and w.by_uid(b.uid).containers == {b.container_id("train"): "train"}
        cluster.delete(a)
        wait_for(lambda: w.by_uid(a.uid) is None, 10, what="the watch to delete pod a")
        assert w.by_name("ml", "far") is None
    finally:
        w.stop()
    assert all("fieldSelector=spec.nodeName%3Dgpu-node-1" in r for r in kube_api.requests), kube_api.requests
    lists = [r for r in kube_api.requests if "watch=" not in r]
    assert len(lists) == 1 and len(kube_api.requests) >= 2  # listed once, then followed by a watch


def test_an_expired_watch_is_listed_again_without_a_warning(cluster: FakeNode, kube_api: KubeApi, caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    w = watcher_of(kube_api.url)
    try:
        assert w.synced.wait(10)
        wait_for(lambda: any("watch=" in r for r in kube_api.requests), 10, what="the watch")
        kube_api.expire.set()
        wait_for(lambda: len([r for r in kube_api.requests if "watch=" not in r]) == 2, 10, what="a second list")
        a = cluster.add(FakePod("ml", "a", NODE, {"train": []}))
        wait_for(lambda: w.by_uid(a.uid), 10, what="the new watch to add pod a")
    finally:
        w.stop()
    assert not _warnings(caplog, "Kubernetes API") and w.error == ""


# ---------------------------------------------------------------------- the floor
class Node:
    """8 fake GPUs, 3 of them time-sliced, with pods whose processes map to them through a fixture /proc."""

    def __init__(self, tmp: Path, cluster: FakeNode) -> None:
        self.cluster = cluster
        self.proc = tmp / "proc"
        self.gpus = [FakeGpu(uuid=gpu_id()) for _ in range(8)]
        self.nvml = FakeNvml(self.gpus)
        self.expected: dict[int, tuple[str, str, str] | None] = {}  # pid -> (namespace, pod, container)
        self.next_pid = 1000
        self.pods: list[FakePod] = []
        u = [g.uuid for g in self.gpus]
        spec = [  # namespace, name, job type, container -> device ids, processes per container
            ("ml", "a0", "resnet50", {"train": [f"{u[0]}::0"]}, 1),
            ("ml", "a1", "bert", {"train": [f"{u[0]}::1"]}, 1),
            ("vision", "b0", "a3c", {"learner": [f"{u[1]}::0"]}, 1),
            ("vision", "b1", None, {"train": [f"{u[1]}::1"]}, 2),  # no annotation: job type unknown
            ("ml", "b2", "lstm", {"train": [f"{u[1]}::2", f"{u[1]}::3"]}, 1),  # two replicas of one GPU
            ("ml", "c0", "cyclegan", {"train": [f"{u[2]}::0"]}, 1),
            ("ml", "c1", "transformer", {"train": [f"{u[2]}::1"]}, 1),
            ("ml", "d3", "recoder", {"train": [u[3]]}, 1),
            ("ml", "d4", "resnet18", {"train": [u[4]]}, 1),
            ("ml", "d5", "bert", {"worker": [u[5], u[6]]}, 1),  # two whole GPUs
        ]
        for namespace, name, job_type, gpus, procs in spec:
            self.add(FakePod(namespace, name, NODE, gpus, job_type=job_type, other_containers=["sidecar"]), procs)
        cluster.add(FakePod("ml", "elsewhere", "gpu-node-2", {"train": [u[7]]}, job_type="bert"))  # another node
        self.host_pid = self.spawn(self.gpus[3], None, "")  # a host process beside d3's

    def spawn(self, gpu: FakeGpu, pod: FakePod | None, container: str) -> int:
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        write_proc(self.proc, pid, cgroup_text(pod, container, CGROUP_FORMS[pid % len(CGROUP_FORMS)]))
        gpu.processes.append((pid, 1 << 30))
        gpu.process_util[pid] = (20 + pid % 50, 10)
        self.expected[pid] = (pod.namespace, pod.name, container) if pod else None
        return pid

    def add(self, pod: FakePod, procs: int = 1) -> FakePod:
        self.pods.append(self.cluster.add(pod))
        for container, ids in pod.gpus.items():
            for g in sorted({i.split("::")[0] for i in ids}):
                for _ in range(procs):
                    self.spawn(self.gpu(g), pod, container)
        return pod

    def remove(self, pod: FakePod) -> None:
        self.cluster.delete(pod)
        for g in self.gpus:
            for pid, _ in list(g.processes):
                if self.expected.get(pid) and self.expected[pid][:2] == (pod.namespace, pod.name):
                    g.processes.remove((pid, 1 << 30))
                    g.process_util.pop(pid, None)

    def gpu(self, uuid: str) -> FakeGpu:
        return next(g for g in self.gpus if g.uuid == uuid)

    def jobs(self, pod: FakePod) -> set[tuple[str, str, str]]:
        """(job id, job type, GPU) of the pod's jobs."""
        return {(pod.uid, pod.job_type or "unknown", i.split("::")[0]) for ids in pod.gpus.values() for i in ids}


class Producer:
    """The sampler with Kubernetes attribution, as `aip produce nvml --kubernetes` builds it."""

    def __init__(self, node: Node, sock: Path, api_url: str, state: Path) -> None:
        self.watcher = watcher_of(api_url)
        assert self.watcher.synced.wait(10), self.watcher.error
        self.attribution = KubernetesAttribution(
            PodResourcesClient(sock), self.watcher, procs=ProcPods(node.proc), state_path=state, producer_id="nvml-test"
        )
        self.sampler = NvmlSampler(node.nvml, host=NODE, attribution=self.attribution).open()
        self.published: list[tuple[str, Any]] = []

    def rounds(self, n: int = 1) -> tuple[list[MetricSample], list[JobEvent]]:
        start = len(self.published)
        run_sampler(
            self.sampler,
            lambda t, r: self.published.append((t, r)),
            0.001,
            threading.Event(),
            tracker=self.attribution,
            max_rounds=n,
        )
        new = self.published[start:]
        samples = [s for t, r in new if t == METRICS for s in r.samples]
        events = [e for t, r in new if t == LIFECYCLE for e in r.events]
        assert all(isinstance(r, HostMetrics | HostJobEvents) for _, r in new)  # host batches, the default
        return samples, events

    def stop(self) -> None:
        self.watcher.stop()


def started(events: list[JobEvent]) -> set[tuple[str, str, str]]:
    return {(e.job_id, e.job_type, e.gpu_uuid) for e in events if e.kind == "started"}


def finished(events: list[JobEvent]) -> set[tuple[str, str, str]]:
    return {(e.job_id, e.job_type, e.gpu_uuid) for e in events if e.kind == "finished"}


def attributed(samples: list[MetricSample]) -> dict[int, tuple[str, str, str] | None]:
    return {p.pid: (p.namespace, p.pod, p.container) if p.pod is not None else None for s in samples for p in s.processes or ()}


def test_floor_8_gpus_3_time_sliced_every_process_and_pod_attributed_and_a_restart_repeats_no_started(
    tmp_path: Path, cluster: FakeNode, kubelet: Any, kube_api: KubeApi, sock: Path
) -> None:
    node = Node(tmp_path, cluster)
    state = tmp_path / "spool" / "announced.json"
    producer = Producer(node, sock, kube_api.url, state)
    all_events: list[JobEvent] = []
    try:
        samples, events = producer.rounds()
        all_events += events
        assert len(samples) == 8
        assert attributed(samples) == node.expected  # every process to its pod and container; the host one to none
        assert node.expected[node.host_pid] is None and sum(v is not None for v in node.expected.values()) == 12
        pods_of = [len({p.pod for p in s.processes if p.pod}) for s in samples]
        assert sorted(n for n in pods_of if n > 1) == [2, 2, 3]  # the 3 time-sliced GPUs
        want = set().union(*(node.jobs(p) for p in node.pods))
        assert started(events) == want and len(want) == 11 and not finished(events)
        assert {e.job_type for e in events if e.job_id == node.pods[3].uid} == {"unknown"}  # b1: no annotation
        # the next round: nothing changed, nothing announced
        samples, events = producer.rounds(2)
        assert events == [] and attributed(samples) == node.expected

        # a pod goes, another comes on the free GPU
        gone, new = node.pods[1], FakePod("ml", "e7", NODE, {"train": [node.gpus[7].uuid]}, job_type="gan")
        forgotten: list[str] = []
        producer.attribution.on_finished = forgotten.append  # the node's step collector forgets the pod's job
        node.remove(gone)
        node.add(new)
        wait_for(lambda: producer.watcher.by_uid(new.uid) and not producer.watcher.by_uid(gone.uid), 10, what="the watch")
        samples, events = producer.rounds()
        all_events += events
        assert finished(events) == node.jobs(gone) and started(events) == node.jobs(new)
        assert forgotten == [gone.uid]  # once, when it holds no GPU any more
        assert attributed(samples) == {pid: v for pid, v in node.expected.items() if not v or v[1] != gone.name}
    finally:
        producer.stop()

    # the producer restarts: what it announced is read back, nothing is started again
    producer = Producer(node, sock, kube_api.url, state)
    try:
        samples, events = producer.rounds(2)
        assert events == [], events
        assert attributed(samples) == {pid: v for pid, v in node.expected.items() if not v or v[1] != "a1"}
        # and a pod that leaves after the restart is finished with the job type it started with
        leaving = node.pods[5]
        node.remove(leaving)
        wait_for(lambda: not producer.watcher.by_uid(leaving.uid), 10, what="the watch")
        samples, events = producer.rounds()
        all_events += events
        assert [(e.kind, e.job_id, e.job_type) for e in events] == [("finished", leaving.uid, "cyclegan")]
    finally:
        producer.stop()

    kinds = Counter((e.kind, e.job_id, e.gpu_uuid) for e in all_events)
    assert max(kinds.values()) == 1  # no job started (or finished) twice on a GPU, restart included
    came_and_went = [node.pods[1], node.pods[5]]
    for p in node.pods:
        assert node.jobs(p) <= started(all_events)
    for p in came_and_went:
        assert node.jobs(p) <= finished(all_events)
    print(
        f"floor: 8 GPUs (3 time-sliced), {len(node.pods)} pods, {sum(v is not None for v in node.expected.values())} pod "
        f"processes attributed, {len(started(all_events))} started, {len(finished(all_events))} finished, 0 repeated after restart"
    )


def test_a_gpu_held_by_one_pod_gives_it_the_processes_it_cannot_see(
    tmp_path: Path, cluster: FakeNode, kubelet: Any, kube_api: KubeApi, sock: Path
) -> None:
    """Without the host PID namespace the producer sees no /proc entry for NVML's PIDs: a GPU with one pod still
    attributes; a time-sliced GPU cannot tell its pods apart and leaves them null."""
    whole, shared = (
        FakeGpu(uuid=gpu_id(), processes=[(4001, None)]),
        FakeGpu(uuid=gpu_id(), processes=[(4002, None), (4003, None)]),
    )
    cluster.add(FakePod("ml", "solo", NODE, {"train": [whole.uuid]}, job_type="bert"))
    cluster.add(FakePod("ml", "s0", NODE, {"train": [f"{shared.uuid}::0"]}))
    cluster.add(FakePod("ml", "s1", NODE, {"train": [f"{shared.uuid}::1"]}))
    w = watcher_of(kube_api.url)
    try:
        assert w.synced.wait(10)
        a = KubernetesAttribution(PodResourcesClient(sock), w, procs=ProcPods(tmp_path / "empty-proc"))
        samples = a.attribute(NvmlSampler(FakeNvml([whole, shared]), host=NODE).open().sample())
    finally:
        w.stop()
    assert attributed(samples) == {4001: ("ml", "solo", "train"), 4002: None, 4003: None}


def test_resolve_step_maps_a_pod_uid_to_its_job_and_gpu(
    tmp_path: Path, cluster: FakeNode, kubelet: Any, kube_api: KubeApi, sock: Path
) -> None:
    node = Node(tmp_path, cluster)
    producer = Producer(node, sock, kube_api.url, tmp_path / "s.json")
    try:
        producer.rounds()
        a = producer.attribution
        d5 = node.pods[9]
        d5_pids = [pid for pid, v in node.expected.items() if v and v[1] == "d5"]
        assert a.resolve_step({"pid": 1, "pod_uid": node.pods[0].uid}) == (node.pods[0].uid, "resnet50", node.gpus[0].uuid)
        # a pod on two GPUs: the GPU its process runs on
        for pid in d5_pids:
            on = next(g.uuid for g in node.gpus if pid in dict(g.processes))
            assert on in (node.gpus[5].uuid, node.gpus[6].uuid)
            assert a.resolve_step({"pid": 1, "sender_pid": pid, "pod_uid": d5.uid}) == (d5.uid, "bert", on)
            assert a.resolve_step({"pid": pid, "sender_pid": None, "pod_uid": d5.uid}) == (d5.uid, "bert", on)
        assert a.resolve_step({"pid": 99999, "pod_uid": d5.uid}) is None  # ambiguous
        assert a.resolve_step({"pid": 1, "pod_uid": str(uuidlib.uuid4())}) is None
    finally:
        producer.stop()


# ---------------------------------------------------------------------- bad answers
def _warnings(caplog: Any, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


def test_a_missing_socket_is_one_log_line_and_sampling_goes_on(
    tmp_path: Path, cluster: FakeNode, kube_api: KubeApi, caplog: Any
) -> None:
    caplog.set_level(logging.INFO)
    node = Node(tmp_path, cluster)
    producer = Producer(node, tmp_path / "no" / "kubelet.sock", kube_api.url, tmp_path / "s.json")
    try:
        samples, events = producer.rounds(5)
    finally:
        producer.stop()
    assert len(samples) == 5 * 8 and events == []  # no PodResources answer: no lifecycle news, samples as usual
    lines = _warnings(caplog, "kubelet pod-resources socket")
    assert len(lines) == 1 and "does not exist" in lines[0] and "AIP_PODRESOURCES_SOCKET" in lines[0], lines
    assert attributed(samples[-8:]) == node.expected  # processes still go to their pods through /proc


def test_a_malformed_answer_is_one_log_line_and_sampling_goes_on(
    tmp_path: Path, cluster: FakeNode, kube_api: KubeApi, sock: Path, caplog: Any
) -> None:
    caplog.set_level(logging.INFO)
    sock.parent.mkdir(parents=True)
    server = podresources_server(cluster, NODE, sock, malformed=True)
    node = Node(tmp_path, cluster)
    producer = Producer(node, sock, kube_api.url, tmp_path / "s.json")
    try:
        samples, events = producer.rounds(4)
    finally:
        producer.stop()
        server.stop(0)
    assert len(samples) == 4 * 8 and events == []
    lines = _warnings(caplog, "List failed")
    assert len(lines) == 1 and "INTERNAL" in lines[0], lines


def test_permission_denied_on_the_socket_is_a_clear_error(cluster: FakeNode, kubelet: Any, sock: Path) -> None:
    """The socket's mode keeps the client out (as root: without the capability to override file modes)."""
    os.chmod(sock, 0)
    code = (
        "from producers.kubernetes.podresources import PodResourcesClient, PodResourcesError\n"
        f"try:\n    PodResourcesClient({str(sock)!r}).list()\nexcept PodResourcesError as e:\n    print(e)\n"
    )
    prefix: list[str] = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("root without setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
        prefix = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search"]
    out = subprocess.run(
        [*prefix, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert "permission denied" in out.stdout and str(sock) in out.stdout, out.stdout + out.stderr


def test_an_api_server_that_is_down_is_one_log_line_sampling_goes_on_and_it_recovers(
    tmp_path: Path, cluster: FakeNode, kubelet: Any, kube_api: KubeApi, sock: Path, caplog: Any
) -> None:
    caplog.set_level(logging.INFO)
    with socket.socket() as s:  # a port with nothing behind it
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    url = [dead]
    node = Node(tmp_path, cluster)
    w = PodWatcher(NODE, lambda: api_client(url[0]), watch_timeout_s=5, backoff_s=0.05, max_backoff_s=0.1).start()
    a = KubernetesAttribution(PodResourcesClient(sock), w, procs=ProcPods(node.proc), state_path=tmp_path / "s.json")
    sampler = NvmlSampler(node.nvml, host=NODE, attribution=a).open()
    published: list[tuple[str, Any]] = []
    try:
        wait_for(lambda: w.error, 30, what="the watcher to fail")
        n = run_sampler(sampler, lambda t, r: published.append((t, r)), 0.01, threading.Event(), tracker=a, max_rounds=20)
        assert n == 20 and sum(t == METRICS for t, _ in published) == 20
        assert not [r for t, r in published if t == LIFECYCLE]  # pods without UIDs: started waits for the API
        lines = _warnings(caplog, "Kubernetes API: cannot list")
        assert len(lines) == 1 and NODE in lines[0], lines
        url[0] = kube_api.url  # the API server is back
        wait_for(lambda: w.synced.is_set(), 30, what="the watcher to list again")
        run_sampler(sampler, lambda t, r: published.append((t, r)), 0.01, threading.Event(), tracker=a, max_rounds=1)
    finally:
        w.stop()
    events = [e for t, r in published if t == LIFECYCLE for e in r.events]
    assert started(events) == set().union(*(node.jobs(p) for p in node.pods))


def test_the_cli_needs_the_node_name(monkeypatch: Any, capsys: Any) -> None:
    from aip.cli import build_parser
    from aip.commands import produce
    from aip.errors import CliError

    monkeypatch.delenv("AIP_NODE_NAME", raising=False)
    args = build_parser().parse_args(["produce", "nvml", "--kubernetes"])
    with pytest.raises(CliError, match="AIP_NODE_NAME"):
        produce.run_nvml(args, nvml=FakeNvml([FakeGpu(uuid=gpu_id())]))


def test_a_state_file_that_cannot_be_written_costs_no_event_and_no_round(
    tmp_path: Path, cluster: FakeNode, kubelet: Any, kube_api: KubeApi, sock: Path, caplog: Any
) -> None:
    caplog.set_level(logging.INFO)
    (tmp_path / "file").write_text("")
    node = Node(tmp_path, cluster)
    producer = Producer(node, sock, kube_api.url, tmp_path / "file" / "announced.json")  # its directory is a file
    try:
        samples, events = producer.rounds(3)
    finally:
        producer.stop()
    assert len(samples) == 3 * 8 and len(started(events)) == 11
    assert len(_warnings(caplog, "cannot write")) == 1

"""Fakes of a node's Kubernetes for the attribution tests: a real kubelet PodResources v1 gRPC server on a unix
socket, a local HTTP server answering the API server's pod list and watch, and a fixture ``/proc``.

:class:`FakeNode` holds the pods of the node (and of other nodes); the two servers answer from it, so a test
changes the node in one place and both see it.
"""

from __future__ import annotations

import json
import threading
import uuid as uuidlib
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import grpc

from producers.kubernetes.podresources_v1 import api_pb2, api_pb2_grpc


@dataclass
class FakePod:
    namespace: str
    name: str
    node: str
    gpus: dict[str, list[str]]  # container -> device ids (GPU-<uuid> or GPU-<uuid>::<n>)
    job_type: str | None = None
    uid: str = field(default_factory=lambda: str(uuidlib.uuid4()))
    other_containers: list[str] = field(default_factory=list)  # containers without GPUs

    def container_id(self, container: str) -> str:
        return uuidlib.uuid5(uuidlib.NAMESPACE_OID, f"{self.uid}/{container}").hex * 2  # 64 hex digits

    def json(self, resource_version: int) -> dict[str, Any]:
        names = [*self.gpus, *self.other_containers]
        meta: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "uid": self.uid,
            "resourceVersion": str(resource_version),
        }
        if self.job_type is not None:
            meta["annotations"] = {"aip.io/job-type": self.job_type}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"nodeName": self.node, "containers": [{"name": n, "image": "train:1"} for n in names]},
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": n,
                        "containerID": f"containerd://{self.container_id(n)}",
                        "image": "train:1",
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                    }
                    for n in names
                ],
            },
        }


class FakeNode:
    """The pods of a cluster (by node), with a resource version and the watch events since the start."""

    def __init__(self) -> None:
        self.pods: dict[str, FakePod] = {}
        self.version = 1
        self.events: list[tuple[int, str, FakePod]] = []
        self.changed = threading.Condition()

    def add(self, pod: FakePod) -> FakePod:
        with self.changed:
            self.version += 1
            self.pods[pod.uid] = pod
            self.events.append((self.version, "ADDED", pod))
            self.changed.notify_all()
        return pod

    def delete(self, pod: FakePod) -> None:
        with self.changed:
            self.version += 1
            del self.pods[pod.uid]
            self.events.append((self.version, "DELETED", pod))
            self.changed.notify_all()

    def on(self, node: str) -> list[FakePod]:
        return [p for p in self.pods.values() if p.node == node]


# ---------------------------------------------------------------------- PodResources (gRPC, unix socket)
class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, cluster: FakeNode, node: str) -> None:
        self.cluster = cluster
        self.node = node
        self.calls = 0

    def List(self, request: Any, context: Any) -> Any:
        self.calls += 1
        with self.cluster.changed:
            pods = self.cluster.on(self.node)
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name=p.name,
                    namespace=p.namespace,
                    containers=[
                        api_pb2.ContainerResources(
                            name=c,
                            devices=[
                                api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=ids),
                                api_pb2.ContainerDevices(resource_name="example.com/nic", device_ids=["nic-0"]),
                            ],
                            cpu_ids=[2, 3],
                        )
                        for c, ids in p.gpus.items()
                    ]
                    + [api_pb2.ContainerResources(name=c) for c in p.other_containers],
                )
                for p in pods
            ]
        )


def podresources_server(cluster: FakeNode, node: str, socket_path: Path, *, malformed: bool = False) -> Any:
    """A started gRPC server implementing PodResources v1 ``List`` on ``socket_path``; ``malformed``: it answers
    bytes that are not a ListPodResourcesResponse."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    lister = _Lister(cluster, node)
    if malformed:
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    lambda request, context: b"",
                    request_deserializer=lambda b: b,
                    response_serializer=lambda _: b"\xff\xff\xff\xff not a protobuf",
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))
    else:
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    server.lister = lister
    return server


# ---------------------------------------------------------------------- Kubernetes API (HTTP)
class KubeApi:
    """``GET /api/v1/pods?fieldSelector=spec.nodeName%3D<node>`` as the API server answers it: a PodList, or with
    ``watch=1`` a stream of JSON lines (one watch event each) from ``resourceVersion`` on."""

    def __init__(self, cluster: FakeNode) -> None:
        self.cluster = cluster
        self.requests: list[str] = []
        self.stopping = threading.Event()
        self.expire = threading.Event()
        """Set: the open watch ends with a 410 Gone ERROR event, as when its resource version was compacted away."""
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # a watch is one chunked response, a chunk per event, as the API server sends

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                api.requests.append(self.path)
                url = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                if url.path != "/api/v1/pods":
                    return self._json(404, {"kind": "Status", "status": "Failure", "code": 404})
                selector = q.get("fieldSelector", "")
                node = selector.removeprefix("spec.nodeName=") if selector.startswith("spec.nodeName=") else None
                if q.get("watch") in ("1", "true", "True"):
                    return self._watch(node, int(q.get("resourceVersion") or 0), float(q.get("timeoutSeconds") or 300))
                with api.cluster.changed:
                    pods = [p for p in api.cluster.pods.values() if node is None or p.node == node]
                    version = api.cluster.version
                    items = [p.json(version) for p in pods]
                self._json(
                    200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(version)}, "items": items}
                )

            def _json(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _watch(self, node: str | None, since: int, timeout_s: float) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                sent = since
                deadline = threading.Event()
                timer = threading.Timer(timeout_s, deadline.set)
                timer.start()
                try:
                    while not deadline.is_set() and not api.stopping.is_set():
                        if api.expire.is_set():
                            api.expire.clear()
                            status = {
                                "kind": "Status",
                                "apiVersion": "v1",
                                "status": "Failure",
                                "reason": "Expired",
                                "code": 410,
                                "message": "too old resource version: 1 (2)",
                            }
                            line = json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                            break
                        with api.cluster.changed:
                            new = [(v, k, p) for v, k, p in api.cluster.events if v > sent and (node is None or p.node == node)]
                            if not new:
                                api.cluster.changed.wait(0.1)
                                continue
                        for v, kind, p in new:
                            line = json.dumps({"type": kind, "object": p.json(v)}).encode() + b"\n"
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                            sent = v
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")  # the watch's timeout: the response ends
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    timer.cancel()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> KubeApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------------- /proc
CGROUP_FORMS = ("v2-systemd", "v1-cgroupfs", "v1-systemd", "v2-cgroupfs")


def cgroup_text(pod: FakePod | None, container: str, form: str) -> str:
    """``/proc/<pid>/cgroup`` of a process of ``pod``'s ``container`` (a host process: ``pod`` None)."""
    if pod is None:
        return "0::/system.slice/sshd.service\n" if form.startswith("v2") else "12:memory:/system.slice/sshd.service\n"
    cid, uid_ = pod.container_id(container), pod.uid.replace("-", "_")
    if form == "v2-systemd":
        return f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{cid}.scope\n"
    if form == "v2-cgroupfs":
        return f"0::/kubepods/besteffort/pod{pod.uid}/{cid}\n"
    if form == "v1-systemd":
        path = f"/kubepods.slice/kubepods-pod{uid_}.slice/cri-containerd-{cid}.scope"
        return f"12:memory:{path}\n11:cpu,cpuacct:{path}\n1:name=systemd:{path}\n"
    path = f"/kubepods/burstable/pod{pod.uid}/{cid}"
    return f"12:memory:{path}\n11:devices:{path}\n0::/\n"


def write_proc(proc: Path, pid: int, text: str) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cgroup").write_text(text)

"""Pods of this node from the Kubernetes API: UID, job type (the extender's annotation), container ids.

:class:`PodWatcher` lists the pods of one node (field selector ``spec.nodeName=<node>``) and then watches
them, in a thread; when the API server cannot be reached it logs one line, keeps what it knew, and lists
again with a growing back-off.  The ``kubernetes`` client is imported only here, when the watcher starts.

>>> p = pod_of({"metadata": {"uid": "u1", "namespace": "ml", "name": "bert-0", "annotations": {"aip.io/job-type": "bert"}},
...             "status": {"containerStatuses": [{"name": "train", "containerID": "containerd://abc"}]}})
>>> p.job_type, p.containers
('bert', {'abc': 'train'})
>>> pod_of({"metadata": {"uid": "u2", "namespace": "ml", "name": "x"}}).job_type
'unknown'
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from producers.kubernetes.cgroups import container_id

log = logging.getLogger(__name__)

JOB_TYPE_ANNOTATION = "aip.io/job-type"
"""The pod annotation naming its job type (the scheduler extender reads the same one)."""
UNKNOWN_TYPE = "unknown"


@dataclass(frozen=True)
class Pod:
    uid: str
    namespace: str
    name: str
    job_type: str = UNKNOWN_TYPE
    containers: dict[str, str] = field(default_factory=dict)  # container id -> container name


def _get(obj: Any, *names: str) -> Any:
    """``obj.a.b`` of a kubernetes client model or ``obj["a"]["b"]`` of a dict (camelCase or snake_case keys)."""
    for name in names:
        if obj is None:
            return None
        if isinstance(obj, dict):
            camel = name.split("_")[0] + "".join(w.title() for w in name.split("_")[1:])
            obj = next((obj[k] for k in (name, camel, camel.removesuffix("Id") + "ID") if k in obj), None)
        else:
            obj = getattr(obj, name, None)
    return obj


def pod_of(obj: Any) -> Pod:
    """A :class:`Pod` from an API object (a ``V1Pod`` or its JSON as a dict)."""
    annotations = _get(obj, "metadata", "annotations") or {}
    statuses = [*(_get(obj, "status", "container_statuses") or []), *(_get(obj, "status", "init_container_statuses") or [])]
    return Pod(
        uid=str(_get(obj, "metadata", "uid")),
        namespace=str(_get(obj, "metadata", "namespace")),
        name=str(_get(obj, "metadata", "name")),
        job_type=str(annotations.get(JOB_TYPE_ANNOTATION) or UNKNOWN_TYPE),
        containers={container_id(cid): str(_get(s, "name")) for s in statuses if (cid := _get(s, "container_id"))},
    )


def api_client(host: str = "") -> Any:
    """A kubernetes ``ApiClient``: in-cluster configuration (the pod's service account), or ``host`` when given
    (a URL such as ``http://127.0.0.1:8001``, e.g. ``kubectl proxy``)."""
    client: Any = importlib.import_module("kubernetes.client")
    config: Any = importlib.import_module("kubernetes.config")
    if host:
        configuration = client.Configuration()
        configuration.host = host
        return client.ApiClient(configuration)
    config.load_incluster_config()
    return client.ApiClient()


class PodWatcher:
    """The pods of ``node``, kept current by list and watch in a daemon thread."""

    def __init__(
        self,
        node: str,
        client_factory: Callable[[], Any],
        *,
        watch_timeout_s: int = 300,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.node = node
        self.client_factory = client_factory
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.synced = threading.Event()
        """Set once a list succeeded."""
        self.error = ""
        """Why the last list or watch failed ("" while it works)."""
        self._pods: dict[str, Pod] = {}  # uid -> pod
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name="aip-pod-watch", daemon=True)

    # ------------------------------------------------------------------ queries
    def by_uid(self, uid: str) -> Pod | None:
        with self._lock:
            return self._pods.get(uid)

    def by_name(self, namespace: str, name: str) -> Pod | None:
        with self._lock:
            for p in self._pods.values():
                if p.namespace == namespace and p.name == name:
                    return p
        return None

    def pods(self) -> list[Pod]:
        with self._lock:
            return list(self._pods.values())

    # ------------------------------------------------------------------ thread
    def start(self) -> PodWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def _failed(self, what: str, exc: BaseException) -> None:
        reason = f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}"
        error = f"Kubernetes API: cannot {what} the pods of node {self.node} ({reason})"
        if error != self.error:  # one line per distinct failure, not one per retry
            log.warning("%s; the pods keep their last known state, retrying", error)
        self.error = error

    def _run(self) -> None:
        client: Any = importlib.import_module("kubernetes.client")
        watch: Any = importlib.import_module("kubernetes.watch")
        wait_s = self.backoff_s
        selector = f"spec.nodeName={self.node}"
        while not self._stop.is_set():
            try:
                api = client.CoreV1Api(self.client_factory())
                listed = api.list_pod_for_all_namespaces(field_selector=selector, _request_timeout=30)
            except Exception as exc:  # API server down, refused, forbidden, malformed answer
                self._failed("list", exc)
                self._stop.wait(wait_s)
                wait_s = min(self.max_backoff_s, wait_s * 2)
                continue
            with self._lock:
                self._pods = {p.uid: p for p in map(pod_of, listed.items or [])}
            if self.error:
                log.info("Kubernetes API: listing the pods of node %s again (%d pods)", self.node, len(self._pods))
            self.error = ""
            wait_s = self.backoff_s
            self.synced.set()
            try:
                self._follow(api, watch.Watch(), selector, listed.metadata.resource_version)
            except Exception as exc:  # a broken watch: list again
                if self._stop.is_set():
                    return
                if getattr(exc, "status", None) == 410 or "410" in str(exc):  # resource version too old: routine
                    log.debug("Kubernetes API: the watch of node %s expired; listing again", self.node)
                    continue
                self._failed("watch", exc)
                self._stop.wait(wait_s)

    def _follow(self, api: Any, w: Any, selector: str, resource_version: str) -> None:
        self._watch = w
        for event in w.stream(
            api.list_pod_for_all_namespaces,
            field_selector=selector,
            resource_version=resource_version,
            timeout_seconds=self.watch_timeout_s,
            _request_timeout=self.watch_timeout_s + 30,
        ):
            if self._stop.is_set():
                return
            kind, obj = event.get("type"), event.get("object")
            if kind == "ERROR" or obj is None or isinstance(obj, dict):
                raise RuntimeError(f"watch error: {event.get('raw_object') or obj}")
            if kind not in ("ADDED", "MODIFIED", "DELETED"):
                continue  # BOOKMARK
            pod = pod_of(obj)
            with self._lock:
                if kind == "DELETED":
                    self._pods.pop(pod.uid, None)
                else:
                    self._pods[pod.uid] = pod

"""HTTP scoring for schedulers that do not read Kafka: kube-scheduler and Volcano extenders.

:class:`Scorer` turns what a :class:`~clients.scheduler.SchedulerClient` knows (the
what-if predictions per GPU, each GPU's host from ``jobs.lifecycle``) into node
scores and filter decisions; :class:`ExtenderServer` serves them over HTTP:

* kube-scheduler extender v1 (``k8s.io/kube-scheduler/extender/v1``, ``types.go``):
  ``POST /filter`` takes ``ExtenderArgs`` and answers ``ExtenderFilterResult``;
  ``POST /prioritize`` answers a ``HostPriorityList``. The Go types carry no json
  tags, so the keys are the Go field names (``Pod``, ``Nodes``, ``NodeNames``,
  ``FailedNodes``, ``FailedAndUnresolvableNodes``, ``Error``, ``Host``, ``Score``);
  ``Pod`` and ``Nodes`` are the core v1 ``Pod`` and ``NodeList`` with their own json
  tags (``metadata.annotations``, ``items[].metadata.name``).
* Volcano's ``extender`` plugin (volcano-sh/volcano
  ``pkg/scheduler/plugins/extender/argument.go``): ``POST /volcano/predicate`` takes
  ``{"task": TaskInfo, "node": NodeInfo}`` and answers ``{"status": message, "code": n}``;
  ``POST /volcano/prioritize`` takes ``{"task": TaskInfo, "nodes": [NodeInfo]}`` and
  answers ``{"nodeScore": {node: score}, "errorMessage": ""}``. ``TaskInfo`` and
  ``NodeInfo`` (``pkg/scheduler/api``) have no json tags either: ``Pod``, ``Name``.
* ``GET /score?job_type=T&nodes=a,b`` (JSON for custom schedulers), ``GET /healthz``,
  ``GET /metrics`` (Prometheus).

The pod's job type is its annotation ``aip.io/job-type``; ``aip.io/max-slowdown-pct``
makes ``/filter`` (and the Volcano predicate) fail nodes whose best GPU is predicted
above it. ``/filter`` fails a node whose every GPU is full (it runs ``max_jobs_per_gpu`` jobs: its prediction
says ``full``), whatever the pod; a full GPU is never a node's best. A pod without the annotation, an unknown job type and a node without
predictions get a neutral answer, counted in the metrics, never an error that blocks
scheduling. Only ``events``, the client and prometheus_client: no faust, no models.

>>> from events import JobEvent, Prediction, WhatIf
>>> client = SchedulerClient(clock=lambda: 1e9)
>>> client.on_job_event(JobEvent(ts=1e9, kind="progress", job_id="j1", job_type="LM", gpu_uuid="GPU-a", host="node-a",
...     steps=5, step_time_s=0.1))
>>> _ = client.update(Prediction(ts=1e9, gpu_uuid="GPU-a", environment="v100", job_id="j1", job_type="LM",
...     job_set=["A3C", "LM"], mode="placement", interference_pct=30.0, model="knn", category="all",
...     what_if=[WhatIf(job_type="GAN", newcomer_pct=40.0, existing_pct=20.0)]))
>>> [(s.node, s.score, s.basis) for s in Scorer(client).score_nodes("GAN", ["node-a", "node-b"])]
[('node-a', 8, 'predicted'), ('node-b', 5, 'no-predictions')]
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from clients.scheduler import SchedulerClient, placement_cost_pct

log = logging.getLogger(__name__)

# k8s.io/kube-scheduler extender/v1/types.go: MinExtenderPriority = 0, MaxExtenderPriority = 10
MAX_EXTENDER_PRIORITY = 10
# volcano pkg/scheduler/api/numa_info.go DefaultMaxNodeScore (k8s framework MaxNodeScore): Volcano's node-order scale
VOLCANO_MAX_NODE_SCORE = 100.0
# volcano pkg/scheduler/api/types.go: Success = 0, Error = 1, Unschedulable = 2
VOLCANO_SUCCESS, VOLCANO_UNSCHEDULABLE = 0, 2

JOB_TYPE_ANNOTATION = "aip.io/job-type"
MAX_SLOWDOWN_ANNOTATION = "aip.io/max-slowdown-pct"
MAX_BODY_BYTES = 64 << 20
"""A NodeList of a few thousand full Node objects (nodeCacheCapable: false) fits; beyond it: 413."""


class BadRequest(ValueError):
    """The request body is not what the scheduler sends; the message says what is wrong, in one line."""


# ---------------------------------------------------------------------------- request shapes
def _field(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]``, matched as Go's encoding/json matches field names (exact, else case-insensitive)."""
    if name in obj:
        return obj[name]
    lowered = name.lower()
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be a JSON object, not {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    names: dict[type, str] = {dict: "an object", list: "an array", str: "a string"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def load_json(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or :class:`BadRequest`.

    >>> load_json(b'{"Pod": {}}')
    {'Pod': {}}
    >>> load_json(b'[1]')
    Traceback (most recent call last):
    ...
    clients.extender.BadRequest: the body must be a JSON object, not an array
    """
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    return _object(value, "the body")


def node_name(node: Any, what: str = "a node") -> str:
    """A core v1 Node's ``metadata.name``."""
    name = _field(_object(_field(_object(node, what), "metadata"), f"{what}'s metadata"), "name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{what} has no metadata.name")
    return name


def pod_annotations(pod: Any) -> dict[str, str]:
    """A core v1 Pod's ``metadata.annotations`` (empty when absent)."""
    if pod is None:
        return {}
    meta = _field(_object(pod, "Pod"), "metadata")
    if meta is None:
        return {}
    annotations = _field(_object(meta, "Pod.metadata"), "annotations")
    if annotations is None:
        return {}
    annotations = _object(annotations, "Pod.metadata.annotations")
    return {k: v for k, v in annotations.items() if isinstance(v, str)}


@dataclass(frozen=True)
class PodAsk:
    """What a pod asks of the extender, from its annotations."""

    job_type: str | None
    max_slowdown_pct: float | None = None
    bad_annotation: str | None = None
    """Why ``aip.io/max-slowdown-pct`` was ignored (not a non-negative number), else None."""

    @classmethod
    def of(cls, pod: Any) -> PodAsk:
        """The pod's ask; a bad ``aip.io/max-slowdown-pct`` is ignored (and said why), never an error.

        >>> PodAsk.of({"metadata": {"annotations": {"aip.io/job-type": "LM", "aip.io/max-slowdown-pct": "40"}}})
        PodAsk(job_type='LM', max_slowdown_pct=40.0, bad_annotation=None)
        """
        annotations = pod_annotations(pod)
        job_type = annotations.get(JOB_TYPE_ANNOTATION, "").strip() or None
        raw = annotations.get(MAX_SLOWDOWN_ANNOTATION)
        if raw is None:
            return cls(job_type)
        try:
            limit = float(raw.strip().rstrip("%"))
        except ValueError:
            limit = float("nan")
        if not limit >= 0.0 or limit == float("inf"):
            return cls(job_type, None, f"{MAX_SLOWDOWN_ANNOTATION}={raw!r} is not a non-negative number")
        return cls(job_type, limit)


@dataclass(frozen=True)
class ExtenderArgs:
    """kube-scheduler's ``ExtenderArgs``: the pod and its candidate nodes (``NodeNames`` or ``Nodes``)."""

    pod: Any
    names: list[str]
    node_list: dict[str, Any] | None
    """The ``Nodes`` NodeList as sent (nodeCacheCapable: false), None when ``NodeNames`` came."""

    @classmethod
    def parse(cls, body: bytes) -> ExtenderArgs:
        args = load_json(body)
        pod = _field(args, "Pod")
        _object(pod, "Pod")
        names = _field(args, "NodeNames")
        nodes = _field(args, "Nodes")
        if names is not None:
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise BadRequest("NodeNames must be an array of strings")
            return cls(pod, list(names), None)
        if nodes is None:
            raise BadRequest("neither NodeNames nor Nodes is given")
        node_list = _object(nodes, "Nodes")
        items = _field(node_list, "items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise BadRequest("Nodes.items must be an array")
        return cls(pod, [node_name(n, f"Nodes.items[{i}]") for i, n in enumerate(items)], node_list)

    def filter_result(self, passed: Sequence[str], failed: Mapping[str, str]) -> dict[str, Any]:
        """``ExtenderFilterResult`` in the request's form: ``NodeNames`` for ``NodeNames``, ``Nodes`` for ``Nodes``.

        kube-scheduler (pkg/scheduler/extender.go, ``HTTPExtender.Filter``) reads ``NodeNames``
        only when nodeCacheCapable, else ``Nodes.items``: the other form would filter out every node.
        """
        keep = set(passed)
        result: dict[str, Any] = {"Nodes": None, "NodeNames": None, "FailedNodes": dict(failed),
                                  "FailedAndUnresolvableNodes": {}, "Error": ""}  # fmt: skip
        if self.node_list is None:
            result["NodeNames"] = [n for n in self.names if n in keep]
        else:
            items = _field(self.node_list, "items") or []
            result["Nodes"] = {**self.node_list, "items": [it for it, n in zip(items, self.names, strict=True) if n in keep]}
        return result


def volcano_task_pod(args: Mapping[str, Any]) -> Any:
    """The pod of Volcano's ``{"task": TaskInfo}`` (``TaskInfo.Pod``)."""
    task = _field(args, "task")
    if task is None:
        raise BadRequest("task is missing")
    return _field(_object(task, "task"), "Pod")


def volcano_node_name(node: Any, what: str = "node") -> str:
    """``NodeInfo.Name`` (else its ``Node.metadata.name``)."""
    info = _object(node, what)
    name = _field(info, "Name")
    if isinstance(name, str) and name:
        return name
    if _field(info, "Node") is not None:
        return node_name(_field(info, "Node"), f"{what}.Node")
    raise BadRequest(f"{what} has no Name")


# ---------------------------------------------------------------------------- scoring
@dataclass(frozen=True)
class NodeScore:
    """One node's answer: ``score`` 0..10 (MaxExtenderPriority), from its best GPU."""

    node: str
    score: int
    exact: float
    """The score before rounding (Volcano gets it, scaled to 0..100)."""
    basis: str
    """predicted, idle, no-predictions (node or GPUs unknown), unknown-job-type, no-job-type."""
    gpu: str | None = None
    newcomer_pct: float | None = None
    existing_pct: float | None = None

    @property
    def cost_pct(self) -> float | None:
        if self.newcomer_pct is None or self.existing_pct is None:
            return None
        return placement_cost_pct(self.newcomer_pct, self.existing_pct)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "score": self.score, "score_exact": round(self.exact, 3), "basis": self.basis,
                "best_gpu": self.gpu, "cost_pct": self.cost_pct, "newcomer_pct": self.newcomer_pct,
                "existing_pct": self.existing_pct}  # fmt: skip


def score_of_cost(cost_pct: float, full_scale_pct: float) -> float:
    """10 for no predicted slowdown, falling linearly to 0 at ``full_scale_pct`` and beyond.

    One point of score per ``full_scale_pct / 10`` points of cost: with the default 250,
    25 points, about the predictions' error (the simulated fleet's best-GPU costs ran 121-223 %).

    >>> [score_of_cost(c, 250.0) for c in (0.0, 25.0, 125.0, 250.0, 400.0)]
    [10.0, 9.0, 5.0, 0.0, 0.0]
    """
    return MAX_EXTENDER_PRIORITY * (1.0 - min(max(cost_pct, 0.0), full_scale_pct) / full_scale_pct)


class ExtenderMetrics:
    """Prometheus metrics of the extender, in their own registry (served at ``/metrics``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("aip_extender_requests", "HTTP requests by verb and status code", ["verb", "code"], registry=r)
        self.latency = Histogram(
            "aip_extender_request_duration_seconds", "time to answer a request, by verb", ["verb"], registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )  # fmt: skip
        self.no_job_type = Counter(
            "aip_extender_pods_without_job_type", f"pods without the {JOB_TYPE_ANNOTATION} annotation (neutral answer)",
            ["verb"], registry=r,
        )  # fmt: skip
        self.unknown_job_type = Counter(
            "aip_extender_unknown_job_types", "pods whose job type no GPU has a what-if prediction for (neutral answer)",
            ["verb"], registry=r,
        )  # fmt: skip
        self.nodes_without_predictions = Counter(
            "aip_extender_nodes_without_predictions", "nodes scored neutral: no GPU of theirs has a usable prediction",
            ["verb"], registry=r,
        )  # fmt: skip
        self.nodes_failed = Counter(
            "aip_extender_nodes_failed", f"nodes failed by {MAX_SLOWDOWN_ANNOTATION}", ["verb"], registry=r
        )
        self.nodes_full = Counter(
            "aip_extender_nodes_full", "nodes failed because every GPU of theirs is full (max_jobs_per_gpu)", ["verb"],
            registry=r,
        )  # fmt: skip
        self.bad_annotations = Counter(
            "aip_extender_bad_annotations", f"pods whose {MAX_SLOWDOWN_ANNOTATION} was not a number (ignored)", registry=r
        )

    def value(self, name: str, **labels: str) -> float:
        v = self.registry.get_sample_value(name, labels)
        return 0.0 if v is None else v


class Scorer:
    """Node scores and filter decisions from a :class:`SchedulerClient`'s view of the GPUs.

    A GPU's cost is the client's: the newcomer's predicted slowdown plus the summed
    slowdown it causes to the jobs there (:func:`~clients.scheduler.placement_cost_pct`),
    0 on a GPU known to be idle. Every GPU that runs jobs answers every window, one job
    or more (a lone job's prediction has ``occupancy`` ``solo``), and an idle GPU says so
    (``occupancy`` ``idle``). A node's score is that of its best GPU among those with a
    usable prediction; a node with none (its GPUs unknown, or changed since their last
    prediction) scores ``neutral_score`` and passes every filter.
    """

    def __init__(
        self,
        client: SchedulerClient,
        *,
        full_scale_pct: float = 250.0,
        neutral_score: int = MAX_EXTENDER_PRIORITY // 2,
        metrics: ExtenderMetrics | None = None,
    ) -> None:
        if not full_scale_pct > 0:
            raise ValueError("full_scale_pct must be positive")
        if not 0 <= neutral_score <= MAX_EXTENDER_PRIORITY:
            raise ValueError(f"neutral_score must be within 0..{MAX_EXTENDER_PRIORITY}")
        self.client = client
        self.full_scale_pct = full_scale_pct
        self.neutral_score = neutral_score
        self.metrics = metrics or ExtenderMetrics()

    def _usable_job_type(self, ask: PodAsk, verb: str) -> str | None:
        if ask.bad_annotation is not None:
            self.metrics.bad_annotations.inc()
        if ask.job_type is None:
            self.metrics.no_job_type.labels(verb).inc()
            return None
        if ask.job_type not in self.client.job_types():
            self.metrics.unknown_job_type.labels(verb).inc()
        return ask.job_type

    def _gpu_entries(self, job_type: str, gpus: Iterable[str]) -> list[tuple[str, tuple[float, float]]]:
        out = []
        for gpu in gpus:
            if self.client.is_full(gpu):
                continue
            entry = self.client.explored_entry(gpu, job_type)  # the client's ranking rules (novel_risk, exploration)
            if entry is not None:
                out.append((gpu, entry))
        return out

    def score_nodes(self, job_type: str | None, nodes: Sequence[str], verb: str = "score") -> list[NodeScore]:
        """One :class:`NodeScore` per node, in the nodes' order."""
        if job_type is None:
            return [NodeScore(n, self.neutral_score, float(self.neutral_score), "no-job-type") for n in nodes]
        by_host = self.client.gpus_by_host()
        out = []
        for node in nodes:
            gpus = by_host.get(node, [])
            entries = self._gpu_entries(job_type, gpus)
            if not entries:
                self.metrics.nodes_without_predictions.labels(verb).inc()
                out.append(NodeScore(node, self.neutral_score, float(self.neutral_score), "no-predictions"))
                continue
            gpu, (newcomer, existing) = min(entries, key=lambda e: placement_cost_pct(*e[1]))
            exact = score_of_cost(placement_cost_pct(newcomer, existing), self.full_scale_pct)
            basis = "idle" if self.client.is_idle(gpu) else "predicted"
            out.append(NodeScore(node, math.floor(exact + 0.5), exact, basis, gpu, newcomer, existing))
        return out

    def prioritize(self, pod: Any, nodes: Sequence[str], verb: str = "prioritize") -> list[NodeScore]:
        return self.score_nodes(self._usable_job_type(PodAsk.of(pod), verb), nodes, verb)

    def filter_nodes(self, pod: Any, nodes: Sequence[str], verb: str = "filter") -> tuple[list[str], dict[str, str]]:
        """(nodes that pass, {failed node: reason}).

        A node whose every GPU is full (:meth:`SchedulerClient.is_full`: none free) fails, whatever the pod. Else
        only ``aip.io/max-slowdown-pct`` fails a node: when on its best GPU (the same GPUs as the score: those with a usable
        prediction) the newcomer's predicted slowdown or the slowdown it causes
        (``existing_pct``, summed over the jobs there: an upper bound of the worst) exceeds
        the limit. A node without predictions passes.
        """
        ask = PodAsk.of(pod)
        job_type = self._usable_job_type(ask, verb)
        by_host = self.client.gpus_by_host()
        passed: list[str] = []
        failed: dict[str, str] = {}
        for node in nodes:
            gpus = by_host.get(node, [])
            if gpus and all(self.client.is_full(g) for g in gpus):
                failed[node] = f"aip: every GPU of the node is full ({len(gpus)} running max_jobs_per_gpu jobs)"
                self.metrics.nodes_full.labels(verb).inc()
                continue
            if job_type is None or ask.max_slowdown_pct is None:
                passed.append(node)
                continue
            limit = ask.max_slowdown_pct
            entries = self._gpu_entries(job_type, gpus)
            if not entries:
                self.metrics.nodes_without_predictions.labels(verb).inc()
            if not entries or any(max(n, e) <= limit for _, (n, e) in entries):
                passed.append(node)
                continue
            gpu, (newcomer, existing) = min(entries, key=lambda e: max(e[1]))
            failed[node] = (
                f"aip: {job_type} would exceed {MAX_SLOWDOWN_ANNOTATION}={limit:g} on every GPU with a prediction "
                f"(best {gpu}: newcomer {newcomer:.1f} %, jobs there {existing:.1f} %)"
            )
            self.metrics.nodes_failed.labels(verb).inc()
        return passed, failed


# ---------------------------------------------------------------------------- HTTP
VERBS = {
    ("POST", "/filter"): "filter",
    ("POST", "/prioritize"): "prioritize",
    ("POST", "/volcano/predicate"): "volcano_predicate",
    ("POST", "/volcano/prioritize"): "volcano_prioritize",
    ("GET", "/score"): "score",
    ("GET", "/healthz"): "healthz",
    ("GET", "/metrics"): "metrics",
}


class HttpError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Api:
    """The extender's endpoints as plain functions of (query, body) -> JSON-able answer."""

    def __init__(self, scorer: Scorer, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.scorer = scorer
        self.client = scorer.client
        self.started = clock()
        self.clock = clock

    def filter(self, body: bytes) -> Any:
        args = ExtenderArgs.parse(body)
        passed, failed = self.scorer.filter_nodes(args.pod, args.names, "filter")
        return args.filter_result(passed, failed)

    def prioritize(self, body: bytes) -> Any:
        args = ExtenderArgs.parse(body)
        return [{"Host": s.node, "Score": s.score} for s in self.scorer.prioritize(args.pod, args.names, "prioritize")]

    def volcano_predicate(self, body: bytes) -> Any:
        args = load_json(body)
        pod = volcano_task_pod(args)
        if _field(args, "node") is None:
            raise BadRequest("node is missing")
        name = volcano_node_name(_field(args, "node"))
        _, failed = self.scorer.filter_nodes(pod, [name], "volcano_predicate")
        if name in failed:
            return {"status": failed[name], "code": VOLCANO_UNSCHEDULABLE}
        return {"status": "", "code": VOLCANO_SUCCESS}

    def volcano_prioritize(self, body: bytes) -> Any:
        args = load_json(body)
        pod = volcano_task_pod(args)
        nodes = _field(args, "nodes")
        if nodes is None:
            nodes = []
        if not isinstance(nodes, list):
            raise BadRequest("nodes must be an array")
        names = [volcano_node_name(n, f"nodes[{i}]") for i, n in enumerate(nodes)]
        scores = self.scorer.prioritize(pod, names, "volcano_prioritize")
        scale = VOLCANO_MAX_NODE_SCORE / MAX_EXTENDER_PRIORITY
        return {"nodeScore": {s.node: round(s.exact * scale, 3) for s in scores}, "errorMessage": ""}

    def score(self, query: Mapping[str, list[str]]) -> Any:
        job_type = (query.get("job_type") or [""])[0].strip()
        if not job_type:
            raise BadRequest("job_type is required: /score?job_type=T[&nodes=a,b]")
        raw = ",".join(query.get("nodes", []))
        nodes = [n.strip() for n in raw.split(",") if n.strip()] or sorted(self.client.gpus_by_host())
        scores = self.scorer.score_nodes(job_type, nodes, "score")
        return {
            "job_type": job_type,
            "known_job_type": job_type in self.client.job_types(),
            "max_score": MAX_EXTENDER_PRIORITY,
            "nodes": [s.to_dict() for s in scores],
            "ranked": [s.node for s in sorted(scores, key=lambda s: -s.exact)],
        }

    def healthz(self) -> Any:
        return {
            "status": "ok",
            "uptime_s": round(self.clock() - self.started, 1),
            "records_received": self.client.received,
            "gpus": len(self.client.snapshot()),
            "nodes": len(self.client.gpus_by_host()),
            "job_types": len(self.client.job_types()),
        }


TEXT = "text/plain; charset=utf-8"


def _handler(api: Api) -> type[BaseHTTPRequestHandler]:
    metrics = api.scorer.metrics

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as kube-scheduler's Go client uses it
        server_version = "aip-extender"
        _consumed = False

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def _serve(self, method: str) -> None:
            t0 = time.perf_counter()
            self._consumed = False
            url = urlsplit(self.path)
            path = url.path.rstrip("/") or "/"
            verb = VERBS.get((method, path))
            try:
                if verb is None:
                    known = {p for (_, p) in VERBS}
                    if path in known:
                        raise HttpError(405, f"{method} is not allowed on {path}")
                    raise HttpError(404, f"no such endpoint {path}; see /healthz, /score, /filter, /prioritize, /volcano/*")
                if verb == "metrics":
                    code, data, kind = 200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST
                else:
                    body = self._body() if method == "POST" else b""
                    if verb == "score":
                        answer = api.score(parse_qs(url.query))
                    elif verb == "healthz":
                        answer = api.healthz()
                    else:
                        answer = getattr(api, verb)(body)
                    code, data, kind = 200, json.dumps(answer, allow_nan=False).encode(), "application/json"
            except BadRequest as exc:
                code, data, kind = 400, f"bad request: {exc}\n".encode(), TEXT
            except HttpError as exc:
                code, data, kind = exc.code, f"{exc}\n".encode(), TEXT
            except Exception as exc:  # never a traceback to the scheduler: one line, and the log
                log.exception("extender: %s %s failed", method, path)
                code, data, kind = 500, f"internal error: {type(exc).__name__}: {exc}\n".encode(), TEXT
            if code != 200 and method == "POST" and not self._consumed:
                self.close_connection = True  # an unread body would be taken for the next request
            label = verb or "other"  # counted before the answer leaves: a client that reads /metrics next sees it
            metrics.requests.labels(label, str(code)).inc()
            metrics.latency.labels(label).observe(time.perf_counter() - t0)
            self._send(code, data, kind)

        def _body(self) -> bytes:
            raw = self.headers.get("Content-Length")
            if raw is None or not raw.strip().isdigit():
                raise HttpError(411, "a Content-Length header is required")
            length = int(raw)
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                raise HttpError(413, f"the body is {length} bytes; at most {MAX_BODY_BYTES} are read")
            self._consumed = True
            return self.rfile.read(length)

        def _send(self, code: int, data: bytes, content_type: str) -> None:
            self.send_response(code)
            if code != 200 and self.command == "POST" and not self._consumed:
                self.send_header("Connection", "close")
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


class ExtenderServer:
    """The extender's HTTP server (threaded, stdlib). ``port=0`` takes a free port; see :attr:`url`."""

    def __init__(self, scorer: Scorer, host: str = "127.0.0.1", port: int = 0) -> None:
        self.api = Api(scorer)
        self.httpd = ThreadingHTTPServer((host, port), _handler(self.api))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> ExtenderServer:
        """Serve from a daemon thread until :meth:`close`."""
        self._thread = threading.Thread(target=self.serve_forever, name="aip-extender-http", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:  # shutdown() waits for a serve_forever loop: only when one runs
            self.httpd.shutdown()
            self._thread.join(5.0)
            self._thread = None
        self.httpd.server_close()

    def __enter__(self) -> ExtenderServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

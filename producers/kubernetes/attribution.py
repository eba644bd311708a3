"""Kubernetes attribution for the NVML sampler: processes to pods, and pods' GPUs as job lifecycle events.

Three sources, each of this node only:

- the kubelet's PodResources API (:mod:`producers.kubernetes.podresources`): which pod holds which GPU;
- the Kubernetes API (:mod:`producers.kubernetes.pods`): each pod's UID (the job id), its job type (the
  ``aip.io/job-type`` annotation, ``unknown`` without one) and its containers' ids;
- ``/proc/<pid>/cgroup`` (:mod:`producers.kubernetes.cgroups`): the pod of each process NVML lists, which is
  how processes of pods sharing one time-sliced GPU are told apart.

Each :class:`GpuProcess` gets its pod's ``namespace``, ``pod`` and ``container``.  A process that is not
visible in ``/proc`` (the producer without the host PID namespace) is given the GPU's pod when exactly one
pod holds that GPU; a process outside any pod keeps them null.

Lifecycle: a pod that gains a GPU is ``started`` on it, one that loses it ``finished``.  What was announced is
written to ``state_path`` (JSON) before the events are published, so a restarted producer repeats no
``started`` and still sends ``finished`` for the pods that left while it was away.  A PodResources answer
that cannot be read changes nothing: the last one stands, and sampling goes on.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec

from events import GpuProcess, JobEvent, MetricSample
from events.records import JobKind
from producers.discovery import event_at
from producers.kubernetes.cgroups import ProcPods
from producers.kubernetes.podresources import Assignment, PodResourcesError
from producers.kubernetes.pods import Pod

log = logging.getLogger(__name__)


class PodSource(Protocol):
    def by_uid(self, uid: str) -> Pod | None: ...
    def by_name(self, namespace: str, name: str) -> Pod | None: ...


class AssignmentSource(Protocol):
    def list(self) -> list[Assignment]: ...


class KubernetesAttribution:
    """Annotate samples with pods (:meth:`attribute`) and turn pods' GPUs into job events (:meth:`update`, the
    sampler's tracker)."""

    def __init__(
        self,
        podresources: AssignmentSource,
        pods: PodSource,
        *,
        procs: ProcPods | None = None,
        state_path: str | Path | None = None,
        producer_id: str | None = None,
    ) -> None:
        self.podresources = podresources
        self.pods = pods
        self.procs = procs or ProcPods()
        self.state_path = Path(state_path) if state_path else None
        self.producer_id = producer_id
        self.on_finished: Callable[[str], None] | None = None
        """Called with a pod's UID once it holds no GPU any more (the node's step collector forgets its job)."""
        self.assigned: list[Assignment] | None = None
        """The last PodResources answer that could be read (None: none yet)."""
        self.error = ""
        """Why the last PodResources read failed ("" while it works)."""
        self.announced: dict[tuple[str, str], dict[str, str]] = self._load()
        """(pod UID, GPU UUID) -> {job_type, namespace, pod}: started and not yet finished."""
        self._pid_gpu: dict[int, str] = {}  # pid -> GPU it was last seen on
        self._waiting: set[tuple[str, str]] = set()  # (namespace, pod) holding a GPU, not yet known to the API
        self._bug = ""  # the last failure of our own (annotating, writing the state), logged once

    # ------------------------------------------------------------------ state
    def _load(self) -> dict[tuple[str, str], dict[str, str]]:
        if self.state_path is None or not self.state_path.exists():
            return {}
        try:
            rows = json.loads(self.state_path.read_text())["announced"]
            return {(r["uid"], r["gpu_uuid"]): {k: str(r[k]) for k in ("job_type", "namespace", "pod")} for r in rows}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("Kubernetes attribution: cannot read %s (%s); starting with no announced pods", self.state_path, exc)
            return {}

    def _save(self) -> None:
        if self.state_path is None:
            return
        rows = [{"uid": uid, "gpu_uuid": gpu, **v} for (uid, gpu), v in sorted(self.announced.items())]
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"announced": rows}))
            os.replace(tmp, self.state_path)
        except OSError as exc:  # the events still go out; a restart may repeat them
            message = f"Kubernetes attribution: cannot write {self.state_path} ({exc})"
            if message != self._bug:
                log.warning("%s; a restart will announce its pods again", message)
            self._bug = message

    # ------------------------------------------------------------------ PodResources
    def refresh(self) -> None:
        """Read PodResources again; on failure log one line (once per distinct failure) and keep the last answer."""
        try:
            self.assigned = self.podresources.list()
        except PodResourcesError as exc:
            if str(exc) != self.error:
                log.warning("%s; GPUs keep their last known pods", exc)
            self.error = str(exc)
            return
        except Exception as exc:  # never let attribution stop the sampler
            message = f"kubelet pod-resources: unexpected {type(exc).__name__}: {exc}"
            if message != self.error:
                log.warning("%s; GPUs keep their last known pods", message)
            self.error = message
            return
        if self.error:
            log.info("kubelet pod-resources answers again (%d GPU assignments)", len(self.assigned))
        self.error = ""

    def holders(self, gpu_uuid: str) -> list[Assignment]:
        """The (pod, container) assignments of one GPU in the last PodResources answer."""
        return [a for a in self.assigned or () if a.gpu_uuid == gpu_uuid]

    # ------------------------------------------------------------------ samples
    def attribute(self, samples: list[MetricSample]) -> list[MetricSample]:
        """Refresh PodResources once, then give every process of ``samples`` its pod."""
        self.refresh()
        self._pid_gpu = {}
        out = []
        for s in samples:
            try:
                out.append(self.annotate(s))
            except Exception as exc:  # a bug here must not cost the sample
                message = f"Kubernetes attribution failed on {s.gpu_uuid}: {type(exc).__name__}: {exc}"
                if message != self._bug:
                    log.exception("%s; its processes go without pods", message)
                self._bug = message
                out.append(s)
        return out

    def annotate(self, sample: MetricSample) -> MetricSample:
        if not sample.processes:
            return sample
        holders = self.holders(sample.gpu_uuid)
        return msgspec.structs.replace(sample, processes=[self._process(p, sample.gpu_uuid, holders) for p in sample.processes])

    def _process(self, p: GpuProcess, gpu_uuid: str, holders: list[Assignment]) -> GpuProcess:
        self._pid_gpu[p.pid] = gpu_uuid
        found = self.procs.pod_of(p.pid)
        if found is not None:
            uid, cid = found
            pod = self.pods.by_uid(uid)
            if pod is None:
                return p
            container = pod.containers.get(cid or "")
            if container is None:
                names = {a.container for a in holders if (a.namespace, a.pod) == (pod.namespace, pod.name)}
                container = names.pop() if len(names) == 1 else None
            return msgspec.structs.replace(p, namespace=pod.namespace, pod=pod.name, container=container)
        if not self.procs.visible(p.pid) and len({(a.namespace, a.pod) for a in holders}) == 1:
            a = holders[0]
            containers = {h.container for h in holders}
            return msgspec.structs.replace(
                p, namespace=a.namespace, pod=a.pod, container=a.container if len(containers) == 1 else None
            )
        return p

    # ------------------------------------------------------------------ lifecycle
    def update(self, sample: MetricSample) -> list[JobEvent]:
        """Job events of ``sample``'s GPU: ``started`` for each pod that now holds it, ``finished`` for each that
        no longer does (nothing until PodResources first answers)."""
        if self.assigned is None:
            return []
        gpu = sample.gpu_uuid
        now = {(a.namespace, a.pod) for a in self.holders(gpu)}
        out = []
        for (uid, g), v in sorted(self.announced.items()):
            if g != gpu:
                continue
            current = self.pods.by_name(v["namespace"], v["pod"])
            if (v["namespace"], v["pod"]) not in now or (current is not None and current.uid != uid):
                out.append(self._event(sample, "finished", uid, v["job_type"]))
                del self.announced[(uid, g)]
                if self.on_finished is not None and all(u != uid for u, _ in self.announced):
                    self.on_finished(uid)
        for namespace, name in sorted(now):
            pod = self.pods.by_name(namespace, name)
            if pod is None:  # not (or no longer) known to the API: nothing to start
                announced = any((v["namespace"], v["pod"]) == (namespace, name) for v in self.announced.values())
                if (namespace, name) not in self._waiting and not announced:
                    log.info(
                        "pod %s/%s holds %s but is not known to the Kubernetes API yet; started waits for it",
                        namespace,
                        name,
                        gpu,
                    )
                    self._waiting.add((namespace, name))
                continue
            self._waiting.discard((namespace, name))
            if (pod.uid, gpu) not in self.announced:
                self.announced[(pod.uid, gpu)] = {"job_type": pod.job_type, "namespace": namespace, "pod": name}
                out.append(self._event(sample, "started", pod.uid, pod.job_type))
        if out:
            self._save()
        return out

    def _event(self, sample: MetricSample, kind: JobKind, uid: str, job_type: str) -> JobEvent:
        return event_at(sample, kind, uid, job_type, self.producer_id, steps=0 if kind == "started" else None)

    # ------------------------------------------------------------------ step hook
    def resolve_step(self, message: Any) -> tuple[str, str, str] | None:
        """(job id, job type, GPU UUID) of a step-hook message (a mapping or an object): the pod of its
        ``pod_uid``, that pod's job type, and the GPU its process was last seen on, by ``sender_pid`` (the pid the
        kernel vouches for, in this PID namespace: NVML's) or else ``pid``; a pod on one GPU needs no pid.  None
        when the pod, or which of its GPUs, is not known here.

        This is the ``resolve`` argument of the node's step collector (``producers.stepcollector``)."""

        def field(name: str) -> Any:
            return message.get(name) if isinstance(message, dict) else getattr(message, name, None)

        uid = field("pod_uid")
        pod = self.pods.by_uid(str(uid)) if uid else None
        if pod is None:
            return None
        gpus = sorted({a.gpu_uuid for a in self.assigned or () if (a.namespace, a.pod) == (pod.namespace, pod.name)})
        pid = field("sender_pid") if field("sender_pid") is not None else field("pid")
        gpu = self._pid_gpu.get(pid) if isinstance(pid, int) else None
        if gpu is None or gpu not in gpus:
            gpu = gpus[0] if len(gpus) == 1 else None
        return (pod.uid, pod.job_type, gpu) if gpu is not None else None

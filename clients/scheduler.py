"""A light scheduler client: where should the next job go?

:class:`SchedulerClient` keeps, per GPU, the latest what-if entries published on
``interference.predictions`` (and, optionally, which jobs run where, from
``jobs.lifecycle``) and answers :meth:`SchedulerClient.best_gpu`: the candidate
GPU where the newcomer's predicted slowdown plus the slowdown it causes to the
jobs already there is smallest.

Feed it from Kafka (:meth:`start` runs a background thread, :meth:`poll_once`
polls in the caller's thread) or directly with :meth:`update` and
:meth:`on_job_event`.  Only ``events`` and kafka-python are needed: no faust,
no models.

>>> from events import Prediction, WhatIf
>>> client = SchedulerClient(clock=lambda: 1e9)
>>> client.update(Prediction(ts=1e9, gpu_uuid="GPU-a", environment="v100", job_id="j1", job_type="A3C",
...     job_set=["A3C", "LM"], mode="placement", interference_pct=30.0, model="knn", category="all",
...     what_if=[WhatIf(job_type="LM", newcomer_pct=40.0, existing_pct=25.0)]))
True
>>> client.cost_pct("GPU-a", "LM")
65.0
>>> client.best_gpu("LM", ["GPU-a", "GPU-b"])  # GPU-b is unknown: a known cost is preferred
'GPU-a'
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from events import JobEvent, Prediction

log = logging.getLogger(__name__)


@dataclass
class GpuView:
    """What the client knows about one GPU."""

    what_if: dict[str, tuple[float, float]] = field(default_factory=dict)
    """job type -> (newcomer_pct, existing_pct) from the latest prediction that carried what-if entries."""
    job_set: tuple[str, ...] = ()
    """The (sorted) job types running when those entries were computed."""
    ts: float = 0.0
    """Timestamp of that prediction (epoch s)."""
    running: dict[str, str] | None = None
    """job_id -> job_type from ``jobs.lifecycle``; None when the lifecycle is not tracked for this GPU."""


def placement_cost_pct(newcomer_pct: float, existing_pct: float) -> float:
    """The cost of a placement: the newcomer's slowdown plus the summed slowdown it causes.

    Negative predictions (speed-ups are noise here) count as 0.

    >>> placement_cost_pct(40.0, 25.0), placement_cost_pct(-3.0, 10.0)
    (65.0, 10.0)
    """
    return max(0.0, newcomer_pct) + max(0.0, existing_pct)


def rank_key(cost_pct: float | None, running_jobs: int | None) -> tuple[int, float]:
    """Sort key of a candidate: known costs first (smallest first), then unknown GPUs with the fewest known jobs.

    >>> sorted([(None, 1), (12.0, 2), (0.0, 0), (None, None)], key=lambda c: rank_key(*c))
    [(0.0, 0), (12.0, 2), (None, None), (None, 1)]
    """
    if cost_pct is not None:
        return (0, cost_pct)
    return (1, float(running_jobs or 0))


class SchedulerClient:
    """The latest what-if predictions per GPU, and the best GPU for a newcomer.

    ``max_age_s``: entries older than this (by the prediction's ``ts``) are
    ignored, since the job set may have changed without a new prediction.
    ``unknown_cost_pct``: the cost assumed for a busy GPU without usable entries;
    None (default) ranks such GPUs after every GPU whose cost is known.
    ``clock`` (epoch seconds) is injectable for tests.
    """

    def __init__(
        self,
        settings: Any = None,
        *,
        track_lifecycle: bool = True,
        from_beginning: bool = False,
        max_age_s: float = 300.0,
        unknown_cost_pct: float | None = None,
        clock: Callable[[], float] = time.time,
        consumer: Any = None,
    ) -> None:
        self.settings = settings
        self.track_lifecycle = track_lifecycle
        self.from_beginning = from_beginning
        self.max_age_s = max_age_s
        self.unknown_cost_pct = unknown_cost_pct
        self.clock = clock
        self._consumer = consumer
        self._gpus: dict[str, GpuView] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.received = 0
        self.undecodable = 0

    # ------------------------------------------------------------------ feeding
    def update(self, prediction: Prediction) -> bool:
        """Take one prediction; return True when it replaced the GPU's what-if entries.

        Predictions without what-if entries (observed mode) and predictions older
        than the GPU's current entries change nothing.
        """
        if not prediction.what_if:
            return False
        with self._lock:
            view = self._gpus.setdefault(prediction.gpu_uuid, GpuView())
            if prediction.ts < view.ts:
                return False
            view.what_if = {w.job_type: (w.newcomer_pct, w.existing_pct) for w in prediction.what_if}
            view.job_set = tuple(sorted(prediction.job_set))
            view.ts = prediction.ts
            return True

    def on_job_event(self, event: JobEvent) -> None:
        """Track which jobs run on each GPU; a change of job set invalidates the GPU's what-if entries."""
        if event.kind == "progress":
            return
        with self._lock:
            view = self._gpus.setdefault(event.gpu_uuid, GpuView())
            running = view.running if view.running is not None else {}
            if event.kind == "started":
                running[event.job_id] = event.job_type
            else:
                running.pop(event.job_id, None)
            view.running = running
            if view.what_if and tuple(sorted(running.values())) != view.job_set:
                view.what_if, view.job_set, view.ts = {}, (), 0.0

    def mark_idle(self, *gpu_uuids: str) -> None:
        """Tell the client these GPUs run nothing (the scheduler knows): they cost 0 until a job starts."""
        with self._lock:
            for gpu in gpu_uuids:
                self._gpus[gpu] = GpuView(running={})

    def forget(self, gpu_uuid: str) -> None:
        """Drop everything known about a GPU (for example when it leaves the fleet)."""
        with self._lock:
            self._gpus.pop(gpu_uuid, None)

    # ------------------------------------------------------------------ answers
    def cost_pct(self, gpu_uuid: str, job_type: str) -> float | None:
        """Predicted cost of putting ``job_type`` on the GPU: 0 when it is known to be idle, None when unknown."""
        with self._lock:
            view = self._gpus.get(gpu_uuid)
            if view is None:
                return self.unknown_cost_pct
            if view.running is not None and not view.running:
                return 0.0
            entry = view.what_if.get(job_type)
            if entry is None or self.clock() - view.ts > self.max_age_s:
                return self.unknown_cost_pct
            return placement_cost_pct(*entry)

    def running_jobs(self, gpu_uuid: str) -> int | None:
        with self._lock:
            view = self._gpus.get(gpu_uuid)
            if view is None:
                return None
            if view.running is not None:
                return len(view.running)
            return len(view.job_set) if view.what_if else None

    def ranked(self, job_type: str, candidates: Iterable[str]) -> list[tuple[str, float | None]]:
        """Every candidate with its cost (None: unknown), best first; ties keep the candidates' order."""
        scored = [(gpu, self.cost_pct(gpu, job_type), self.running_jobs(gpu)) for gpu in dict.fromkeys(candidates)]
        scored.sort(key=lambda c: rank_key(c[1], c[2]))
        return [(gpu, cost) for gpu, cost, _ in scored]

    def best_gpu(self, job_type: str, candidates: Sequence[str], *, max_cost_pct: float | None = None) -> str | None:
        """The candidate with the smallest predicted cost; None when there is no candidate,
        or when ``max_cost_pct`` is given and every candidate's known cost exceeds it
        (unknown GPUs are never excluded by ``max_cost_pct``)."""
        for gpu, cost in self.ranked(job_type, candidates):
            if max_cost_pct is None or cost is None or cost <= max_cost_pct:
                return gpu
        return None

    def snapshot(self) -> dict[str, GpuView]:
        with self._lock:
            return {
                g: GpuView(dict(v.what_if), v.job_set, v.ts, None if v.running is None else dict(v.running))
                for g, v in self._gpus.items()
            }

    # ------------------------------------------------------------------ Kafka
    def _topics(self) -> list[str]:
        from events.topics import LIFECYCLE, PREDICTIONS

        return [PREDICTIONS, LIFECYCLE] if self.track_lifecycle else [PREDICTIONS]

    def connect(self) -> SchedulerClient:
        """Subscribe (direct assignment of every partition, nothing committed)."""
        if self._consumer is None:
            from events import Topics
            from transport import RecordConsumer, ensure_topics

            if self.settings is None:
                from config import Settings

                self.settings = Settings.from_env()
            names = Topics(self.settings.topic_prefix)
            ensure_topics(self.settings, [names.name(t) for t in self._topics()])
            self._consumer = RecordConsumer(self.settings, self._topics(), from_beginning=self.from_beginning)
        return self

    def poll_once(self, timeout_s: float = 0.5) -> int:
        """Poll the topics once and apply what arrived; return the number of records applied."""
        self.connect()
        applied = 0
        for item in self._consumer.poll(timeout_s=timeout_s):
            if item.error is not None:
                self.undecodable += 1
                continue
            self.received += 1
            if isinstance(item.record, Prediction):
                self.update(item.record)
            elif isinstance(item.record, JobEvent):
                self.on_job_event(item.record)
            applied += 1
        return applied

    def catch_up(self, timeout_s: float = 10.0, idle_s: float = 1.0) -> int:
        """Poll until nothing new arrives for ``idle_s`` (or ``timeout_s`` passes); return the records applied."""
        deadline = time.monotonic() + timeout_s
        applied = quiet = 0.0
        while time.monotonic() < deadline and quiet < idle_s:
            n = self.poll_once(timeout_s=0.25)
            applied += n
            quiet = 0.0 if n else quiet + 0.25
        return int(applied)

    def start(self) -> SchedulerClient:
        """Keep the state current from a daemon thread until :meth:`close`."""
        self.connect()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="aip-scheduler-client", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once(timeout_s=0.5)
            except Exception as exc:  # keep serving the last known state; log and retry
                log.warning("scheduler client: %s", exc)
                self._stop.wait(1.0)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __enter__(self) -> SchedulerClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

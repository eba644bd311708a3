"""Job lifecycle reporting for training scripts: started, progress (bounded rate), finished.

>>> events = []
>>> now = [1_700_000_000.0]
>>> with JobReporter("resnet50", gpu_uuid="GPU-1", publish=lambda t, r: events.append(r),
...                  clock=lambda: now[0], host="h") as job:
...     for _ in range(30):
...         now[0] += 0.25
...         job.step()
>>> [(e.kind, e.steps) for e in events]
[('started', 0), ('progress', 8), ('progress', 16), ('progress', 24), ('finished', 30)]
>>> events[1].step_time_s
0.25
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid as uuidlib
from collections.abc import Callable
from typing import Any

from events import JobEvent
from events.topics import LIFECYCLE
from producers.stephook.aip_stephook import MIN_INTERVAL_S, StepRate

STEP_HOOK_MODULE = "aip_stephook"
"""The step hook's module name in a training process that ``aip run-job`` or a node's collector set up."""


class JobReporter:
    """Context manager: ``started`` on enter, ``finished`` (exit code 0, or 1 on an exception) on exit.

    :meth:`step` is the step hook: call it once per training step (or with ``n``);
    progress goes out at most every ``min_interval_s`` with the cumulative steps
    and the mean step time since the previous progress.  ``publish(topic, record)``
    defaults to a spool-backed Kafka publisher built from ``settings``.
    With ``wrapped=True`` (under ``aip run-job``) only progress is emitted.  A process with a reporter
    counts its steps here: the step hook injected into it (``producers/stephook``) stands down.
    """

    def __init__(
        self,
        job_type: str | None = None,
        *,
        job_id: str | None = None,
        gpu_uuid: str | None = None,
        batch_size: int | None = None,
        settings: Any = None,
        publish: Callable[[str, Any], None] | None = None,
        clock: Callable[[], float] = time.time,
        min_interval_s: float = MIN_INTERVAL_S,
        host: str | None = None,
        pid: int | None = None,
        wrapped: bool | None = None,
    ) -> None:
        self._publisher: Any = None
        if settings is None and publish is None:
            from config import Settings

            settings = Settings.from_env()
        s = settings
        self.job_type = job_type or (s.job_type if s else "") or "unknown"
        self.job_id = job_id or (s.job_id if s else "") or f"job-{uuidlib.uuid4().hex[:12]}"
        self.gpu_uuid = gpu_uuid or (s.job_gpu_uuid if s else "")
        if not self.gpu_uuid:
            raise ValueError("JobReporter needs the GPU UUID: pass gpu_uuid= or set AIP_JOB_GPU_UUID (aip run-job --gpu does)")
        self.batch_size = batch_size or (s.job_batch_size if s else 0) or None
        self.wrapped = wrapped if wrapped is not None else bool(s and s.job_wrapped)
        self.host = host or (s.host if s and s.host else socket.gethostname())
        self.pid = os.getpid() if pid is None else pid
        self.clock = clock
        self.min_interval_s = min_interval_s
        self._rate = StepRate(min_interval_s)
        self.producer_id = f"job-{self.job_id}"
        if publish is None:
            from producers.publisher import Publisher

            self._publisher = Publisher(s, f"job-{self.job_id}-{self.pid}")
            publish = self._publisher.publish
        self._publish = publish
        self._seq = 0
        hook = sys.modules.get(STEP_HOOK_MODULE)
        if hook is not None:
            hook.stand_down()

    @property
    def steps(self) -> int:
        """Steps counted so far."""
        return self._rate.steps

    @steps.setter
    def steps(self, value: int) -> None:
        self._rate.steps = value

    def _emit(self, kind: str, ts: float | None = None, **fields: Any) -> None:
        record = JobEvent(
            ts=self.clock() if ts is None else ts,
            kind=kind,
            job_id=self.job_id,
            job_type=self.job_type,
            gpu_uuid=self.gpu_uuid,
            host=self.host,
            pid=self.pid,
            batch_size=self.batch_size,
            seq=self._seq,
            producer_id=self.producer_id,
            **fields,
        )
        self._seq += 1
        self._publish(LIFECYCLE, record)

    def __enter__(self) -> JobReporter:
        self._rate.start(self.clock())
        if not self.wrapped:
            self._emit("started", steps=0)
        return self

    def step(self, n: int = 1) -> None:
        """Count ``n`` finished steps; emit progress when ``min_interval_s`` has passed."""
        step_time_s = self._rate.step(self.clock(), n)
        if step_time_s is not None:
            self._emit("progress", steps=self.steps, step_time_s=step_time_s)

    __call__ = step

    def progress(self, steps: int, step_time_s: float, ts: float | None = None) -> None:
        """Emit progress counted elsewhere (a step collector's): cumulative ``steps``, mean ``step_time_s``."""
        self.steps = steps
        self._emit("progress", steps=steps, step_time_s=step_time_s, ts=ts)

    def finish(self, exit_code: int | None) -> None:
        """Emit ``finished`` with the exit status (what the context manager does on exit)."""
        self._emit("finished", steps=self.steps or None, exit_code=exit_code)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self.wrapped:
            self.finish(0 if exc_type is None else 1)
        if self._publisher is not None:
            self._publisher.close(timeout_s=10.0)


def track_optimizer(reporter: JobReporter, optimizer: Any) -> Any:
    """Torch training-loop helper: report a step after every ``optimizer.step()``.

    Uses ``Optimizer.register_step_post_hook`` (torch >= 2.0); returns the hook
    handle (``.remove()`` to stop).  The optimizer brings torch: producers never import it.
    """
    return optimizer.register_step_post_hook(lambda *_args, **_kw: reporter.step())

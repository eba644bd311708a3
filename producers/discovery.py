"""Jobs that report nothing: compute processes that appear and disappear become lifecycle events.

>>> from events import GpuProcess, MetricSample
>>> t = ProcessTracker(producer_id="p")
>>> def s(ts, pids): return MetricSample(ts=ts, host="h", gpu_uuid="GPU-1", gpu_index=0, gpu_model="m", seq=0,
...                                     processes=[GpuProcess(pid=p) for p in pids])
>>> [(e.kind, e.pid) for e in t.update(s(1e9, [7]))]
[('started', 7)]
>>> t.update(s(1e9 + 1, [7]))
[]
>>> [(e.kind, e.job_type) for e in t.update(s(1e9 + 2, []))]
[('finished', 'unknown')]
"""

from __future__ import annotations

from typing import Any

from events import JobEvent, MetricSample

UNKNOWN_TYPE = "unknown"


class ProcessTracker:
    """Diff the compute processes of consecutive samples of each GPU."""

    def __init__(self, producer_id: str | None = None) -> None:
        self.producer_id = producer_id
        self._jobs: dict[str, dict[int, str]] = {}  # gpu_uuid -> pid -> job_id

    def update(self, sample: MetricSample) -> list[JobEvent]:
        if sample.processes is None:  # the call failed: no news, not an exit
            return []
        known = self._jobs.setdefault(sample.gpu_uuid, {})
        now = {p.pid for p in sample.processes}
        out = []
        for pid in sorted(now - known.keys()):
            known[pid] = f"pid{pid}@{sample.host}:{sample.gpu_uuid[-8:]}:{int(sample.ts)}"
            out.append(self._event(sample, "started", pid, known[pid]))
        for pid in sorted(known.keys() - now):
            out.append(self._event(sample, "finished", pid, known.pop(pid)))
        return out

    def _event(self, sample: MetricSample, kind: str, pid: int, job_id: str) -> JobEvent:
        return event_at(sample, kind, job_id, UNKNOWN_TYPE, self.producer_id, pid=pid)


def event_at(sample: MetricSample, kind: str, job_id: str, job_type: str, producer_id: str | None, **fields: Any) -> JobEvent:
    """A job event the producer saw at ``sample`` (its time, GPU and host): a job appearing or going away."""
    return JobEvent(
        ts=sample.ts, kind=kind, job_id=job_id, job_type=job_type, gpu_uuid=sample.gpu_uuid, host=sample.host,
        producer_id=producer_id, **fields,
    )  # fmt: skip

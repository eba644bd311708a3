"""Host batches: a host's per-GPU samples of one tick as one :class:`HostMetrics` record, and its job events of
one tick as one :class:`HostJobEvents`.

>>> from events import JobEvent, MetricSample
>>> def s(host, gpu, ts):
...     return "gpu.metrics", MetricSample(ts=ts, host=host, gpu_uuid=gpu, gpu_index=0, gpu_model="v100", seq=0)
>>> def j(host, gpu, ts):
...     return "jobs.lifecycle", JobEvent(ts=ts, kind="started", job_id=gpu, job_type="r50", gpu_uuid=gpu, host=host)
>>> stream = [s("a", "G1", 1e9), s("a", "G2", 1e9 + 0.1), s("b", "G3", 1e9 + 0.2), s("b", "G3", 1e9 + 1)]
>>> stream += [j("a", "G1", 1e9 + 1.5), j("a", "G2", 1e9 + 1.5), j("b", "G3", 1e9 + 1.5)]
>>> [(t, r.host, [x.gpu_uuid for x in getattr(r, "samples", None) or r.events]) for t, r in host_batches(stream)]
[('gpu.metrics', 'a', ['G1', 'G2']), ('gpu.metrics', 'b', ['G3']), ('gpu.metrics', 'b', ['G3']), \
('jobs.lifecycle', 'a', ['G1', 'G2']), ('jobs.lifecycle', 'b', ['G3'])]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from events import HostJobEvents, HostMetrics, JobEvent, MetricSample
from events.records import MAX_EVENTS_PER_HOST_BATCH, MAX_GPUS_PER_HOST
from events.topics import LIFECYCLE, METRICS


def host_metrics(samples: list[MetricSample]) -> HostMetrics:
    """One batch of samples of one host: its ``ts`` is the latest sample's (when the batch is complete)."""
    first = samples[0]
    return HostMetrics(ts=max(s.ts for s in samples), host=first.host, samples=samples, producer_id=first.producer_id)


def host_job_events(events: list[JobEvent]) -> HostJobEvents:
    """One batch of job events of one host, in their order: its ``ts`` is the latest event's."""
    first = events[0]
    return HostJobEvents(ts=max(e.ts for e in events), host=first.host, events=events, producer_id=first.producer_id)


def host_batches(events: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """``(topic, record)`` with each run of consecutive samples of one host, one sample per GPU, as one
    :class:`HostMetrics`, and each run of consecutive job events of one host as one :class:`HostJobEvents`.

    A run ends at another host's record, at any record of another kind (so records keep their order), at a
    second sample of a GPU already in the run (the next tick) and at the batch's maximum length.
    """
    samples: list[MetricSample] = []
    gpus: set[str] = set()
    jobs: list[JobEvent] = []
    for topic, record in events:
        if jobs and not (
            topic == LIFECYCLE
            and isinstance(record, JobEvent)
            and record.host == jobs[0].host
            and len(jobs) < MAX_EVENTS_PER_HOST_BATCH
        ):
            yield LIFECYCLE, host_job_events(jobs)
            jobs = []
        if samples and not (
            topic == METRICS
            and isinstance(record, MetricSample)
            and record.host == samples[0].host
            and record.gpu_uuid not in gpus
            and len(samples) < MAX_GPUS_PER_HOST
        ):
            yield METRICS, host_metrics(samples)
            samples, gpus = [], set()
        if topic == METRICS and isinstance(record, MetricSample):
            samples.append(record)
            gpus.add(record.gpu_uuid)
        elif topic == LIFECYCLE and isinstance(record, JobEvent):
            jobs.append(record)
        else:
            yield topic, record
    if samples:
        yield METRICS, host_metrics(samples)
    if jobs:
        yield LIFECYCLE, host_job_events(jobs)


def per_gpu(events: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """The inverse: every batch as its records, one each (for consumers older than batches)."""
    for topic, record in events:
        if isinstance(record, HostMetrics):
            for sample in record.samples:
                yield topic, sample
        elif isinstance(record, HostJobEvents):
            for event in record.events:
                yield topic, event
        else:
            yield topic, record

"""Host-batched samples: a host's per-GPU samples of one tick as one :class:`HostMetrics` record.

>>> from events import MetricSample
>>> def s(host, gpu, ts):
...     return "gpu.metrics", MetricSample(ts=ts, host=host, gpu_uuid=gpu, gpu_index=0, gpu_model="v100", seq=0)
>>> stream = [s("a", "G1", 1e9), s("a", "G2", 1e9 + 0.1), s("b", "G3", 1e9 + 0.2), s("b", "G3", 1e9 + 1)]
>>> [(t, r.host, [x.gpu_uuid for x in r.samples]) for t, r in host_batches(stream)]
[('gpu.metrics', 'a', ['G1', 'G2']), ('gpu.metrics', 'b', ['G3']), ('gpu.metrics', 'b', ['G3'])]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from events import HostMetrics, MetricSample
from events.records import MAX_GPUS_PER_HOST
from events.topics import METRICS


def host_metrics(samples: list[MetricSample]) -> HostMetrics:
    """One batch of samples of one host: its ``ts`` is the latest sample's (when the batch is complete)."""
    first = samples[0]
    return HostMetrics(ts=max(s.ts for s in samples), host=first.host, samples=samples, producer_id=first.producer_id)


def host_batches(events: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """``(topic, record)`` with each run of consecutive samples of one host, one sample per GPU, as one batch.

    A run ends at another host's sample, at any other record (so records keep their order), at a second
    sample of a GPU already in the run (the next tick) and at :data:`MAX_GPUS_PER_HOST` samples.
    """
    run: list[MetricSample] = []
    gpus: set[str] = set()
    for topic, record in events:
        if topic == METRICS and isinstance(record, MetricSample):
            if run and (record.host != run[0].host or record.gpu_uuid in gpus or len(run) >= MAX_GPUS_PER_HOST):
                yield METRICS, host_metrics(run)
                run, gpus = [], set()
            run.append(record)
            gpus.add(record.gpu_uuid)
            continue
        if run:
            yield METRICS, host_metrics(run)
            run, gpus = [], set()
        yield topic, record
    if run:
        yield METRICS, host_metrics(run)


def per_gpu(events: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """The inverse: every batch as its samples, one record each (for consumers older than batches)."""
    for topic, record in events:
        if isinstance(record, HostMetrics):
            for sample in record.samples:
                yield topic, sample
        else:
            yield topic, record

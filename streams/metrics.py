"""Prometheus metrics of a worker: its own registry, so several apps can live in one process."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest


class _StageCounters:
    """Exports the processors' plain counters (windows by kind, late events, duplicates)."""

    def __init__(self, stage1: Counter[str], stage2: Counter[str]) -> None:
        self.stage1 = stage1
        self.stage2 = stage2

    def collect(self) -> Iterator[Any]:
        family = CounterMetricFamily("aip_stream_stage_events", "stage counters by stage and kind", labels=["stage", "kind"])
        for stage, counters in (("stage1", self.stage1), ("stage2", self.stage2)):
            for kind, value in sorted(counters.items()):
                family.add_metric([stage, kind], float(value))
        yield family


class StreamMetrics:
    def __init__(self, stage1: Counter[str], stage2: Counter[str]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.consumed = PromCounter("aip_stream_consumed_records", "records consumed", ["stage"], registry=self.registry)
        self.published = PromCounter("aip_stream_published_records", "records published", ["topic"], registry=self.registry)
        self.registry.register(_StageCounters(stage1, stage2))  # type: ignore[arg-type]

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST.split(";")[0]

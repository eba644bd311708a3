"""Prometheus metrics of a worker, in its own registry (several apps can live in one process).

Names carry their units (``_records_total``, ``_points``).  Everything that is
already counted elsewhere (stage counters, leaderboards, offsets) is read at
scrape time by one collector, so the hot path only bumps a dict entry.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from events import Leaderboard
from streams import garbage


def dead_letter_reason(error: str) -> str:
    """A short, bounded label for a dead letter's reason (the full text is in the record).

    >>> dead_letter_reason("invalid gpu.metrics record: Expected `float` <= 100.0 - at `$.sm_util_pct`")
    'invalid_record'
    >>> dead_letter_reason("late event: 30.0 s behind the watermark")
    'late'
    """
    lowered = error.lower()
    if "not valid json" in lowered or "empty message" in lowered:
        return "undecodable"
    if lowered.startswith("invalid"):
        return "invalid_record"
    if "late" in lowered:
        return "late"
    if "error:" in lowered:
        return "stage_error"
    return "other"


DELAY_BUCKETS_S = (1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)
"""Upper bounds of the prediction-delay histogram's buckets (a window of 10 s with 5 s of lateness is due by 20 s)."""


class _Collector:
    def __init__(self, metrics: StreamMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Any]:
        m = self.m
        consumed = CounterMetricFamily("aip_stream_consumed_records", "records consumed, by topic", labels=["topic"])
        for topic, value in sorted(m.consumed.items()):
            consumed.add_metric([topic], float(value))
        yield consumed
        read = CounterMetricFamily(
            "aip_stream_consumed_observations",
            "observations stage 2 read: one per Observation record, each of an ObservationBatch (valid or not)",
        )
        read.add_metric([], float(m.consumed_observations))
        yield read
        published = CounterMetricFamily(
            "aip_stream_published_records",
            "records published, by topic (short name: observations, predictions, ...)",
            labels=["topic"],
        )
        for topic, value in sorted(m.published.items()):
            published.add_metric([topic], float(value))
        yield published
        dead = CounterMetricFamily(
            "aip_stream_deadletters", "records sent to the dead-letter topic, by reason", labels=["reason"]
        )
        for reason, value in sorted(m.dead_letters.items()):
            dead.add_metric([reason], float(value))
        yield dead
        stages = CounterMetricFamily("aip_stream_stage_events", "stage counters by stage and kind", labels=["stage", "kind"])
        for stage, counters in (("stage1", m.stage1), ("stage2", m.stage2)):
            for kind, value in sorted(counters.items()):
                stages.add_metric([stage, kind], float(value))
        yield stages
        obs = CounterMetricFamily("aip_observations", "observations learned, by environment", labels=["environment"])
        for env, value in sorted(m.observations.items()):
            obs.add_metric([env], float(value))
        yield obs
        lag = GaugeMetricFamily("aip_stream_consumer_lag_records", "records not yet consumed", labels=["topic", "partition"])
        for (topic, partition), behind in sorted(m.lag().items()):
            lag.add_metric([topic, str(partition)], float(behind))
        yield lag
        held = GaugeMetricFamily(
            "aip_stream_held_windows", "co-located job-windows waiting for their job type's first solo profile"
        )
        held.add_metric([], float(m.held()))
        yield held
        out, episodes = m.group()
        group_out = GaugeMetricFamily(
            "aip_stream_group_out_seconds",
            "seconds this worker has been out of a stable consumer-group generation (0 while it holds an assignment)",
        )
        group_out.add_metric([], out)
        yield group_out
        stuck = CounterMetricFamily(
            "aip_stream_group_stuck", "times this worker stayed out of the consumer group beyond the liveness limit"
        )
        stuck.add_metric([], float(episodes))
        yield stuck
        yield from _gc_families()
        error = GaugeMetricFamily(
            "aip_model_mae_points",
            "prequential rolling MAE on measured job sets, points of interference rate",
            labels=["environment", "mode", "category", "model", "kind"],
        )
        selected = GaugeMetricFamily(
            "aip_model_selected_info",
            "1 for the model selected per environment, mode and category",
            labels=["environment", "mode", "category", "model"],
        )
        served = GaugeMetricFamily(
            "aip_model_served_error_points",
            "the error the served model was chosen by, per environment, mode and regime (seen: prequential MAE on"
            " measured job sets; new: grouped-CV MAE); NaN before it has one",
            labels=["environment", "mode", "regime", "model", "category"],
        )
        for env, board in sorted(m.leaderboards().items()):
            for e in board.entries:
                if e.mae is not None:
                    error.add_metric([env, e.mode, e.category, e.model, e.kind], e.mae)
            for key, model in sorted(board.selected.items()):
                mode, _, category = key.partition(":")
                selected.add_metric([env, mode, category, model], 1.0)
            for s in board.served:
                served.add_metric([env, s.mode, s.regime, s.model, s.category], math.nan if s.error_pct is None else s.error_pct)
        yield error
        yield selected
        yield served


def _gc_families() -> Iterator[Metric]:
    """The process's garbage collections and their seconds, per generation (:data:`streams.garbage.CLOCK`; zero
    until a worker installs it)."""
    seconds = CounterMetricFamily(
        "aip_worker_gc_seconds", "seconds in the garbage collector, by generation", labels=["generation"]
    )
    collections = CounterMetricFamily("aip_worker_gc_collections", "garbage collections, by generation", labels=["generation"])
    for g, (s, n) in enumerate(zip(garbage.CLOCK.seconds, garbage.CLOCK.collections, strict=True)):
        seconds.add_metric([str(g)], s)
        collections.add_metric([str(g)], float(n))
    yield seconds
    yield collections


@dataclass(eq=False)
class StreamMetrics:
    """Counters the worker bumps, and a registry that renders them with the processors' own state."""

    stage1: Counter[str]
    stage2: Counter[str]
    _: KW_ONLY
    leaderboards: Callable[[], Mapping[str, Leaderboard]] = dict
    highwater: Callable[[str, int], int | None] = lambda topic, partition: None
    held: Callable[[], int] = lambda: 0
    group: Callable[[], tuple[float, int]] = lambda: (0.0, 0)
    """(seconds out of a stable consumer-group generation, times stuck beyond the liveness limit)"""

    def __post_init__(self) -> None:
        self.consumed: Counter[str] = Counter()
        self.published: Counter[str] = Counter()
        self.dead_letters: Counter[str] = Counter()
        self.observations: Counter[str] = Counter()
        self.consumed_observations = 0
        """Observations stage 2 read (an ObservationBatch counts its observations; ``consumed`` counts records)."""
        self.positions: dict[tuple[str, int], int] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))  # type: ignore[arg-type]
        self.prediction_delay = Histogram(
            "aip_stream_prediction_delay_seconds",
            "seconds from a window's end to its prediction, when this worker made it (what aip bench fleet's p50 and p99"
            " measure)",
            buckets=DELAY_BUCKETS_S,
            registry=self.registry,
        )
        """Seconds from a window's end to its prediction, for every prediction this worker published."""

    def consumed_message(self, topic: str, partition: int, offset: int) -> None:
        self.consumed[topic] += 1
        self.positions[(topic, partition)] = offset

    def lag(self) -> dict[tuple[str, int], int]:
        out = {}
        for (topic, partition), offset in self.positions.items():
            high = self.highwater(topic, partition)
            if high is not None:
                out[(topic, partition)] = max(0, high - offset - 1)
        return out

    def render(self, names: Collection[str] = ()) -> tuple[bytes, str]:
        """The page: every series, or with ``names`` (``/metrics?name[]=...``, as prometheus_client's own exporter
        reads it) only the worker's stream series of those sample names: a reader of lag and counts (``aip bench
        fleet`` every 5 s) then costs the worker no rendering of its per-GPU series."""
        registry: Any = self.registry if not names else _Only(_Collector(self), set(names))
        return generate_latest(registry), CONTENT_TYPE_LATEST.split(";")[0]


class _Only:
    """The families of a collector with only the samples named ``names`` (families left without one are left out)."""

    def __init__(self, collector: _Collector, names: set[str]) -> None:
        self.collector, self.names = collector, names

    def collect(self) -> Iterator[Any]:
        for family in self.collector.collect():
            samples = [s for s in family.samples if s.name in self.names]
            if samples:
                only = Metric(family.name, family.documentation, family.type, family.unit)
                only.samples = samples
                yield only

"""The e2e bench reads the worker's own /metrics page: keep its parser in step with what the worker renders."""

from __future__ import annotations

from collections import Counter

from aip.bench.e2e import STAGE1_TOPICS, STAGE2_TOPICS, metric_sum
from streams.metrics import StreamMetrics


def test_bench_parses_the_workers_metrics() -> None:
    m = StreamMetrics(Counter(), Counter())
    for offset in range(5):
        m.consumed_message("gpu.metrics", 0, offset)
    for offset in range(2):
        m.consumed_message("jobs.lifecycle", 1, offset)
    m.consumed_message("interference.observations", 0, 0)
    m.published["observations"] += 3
    body = m.render()[0].decode()
    assert metric_sum(body, "consumed_records_total", STAGE1_TOPICS) == 7
    assert metric_sum(body, "consumed_records_total", STAGE2_TOPICS) == 1
    assert metric_sum(body, "published_records_total", ("observations",)) == 3

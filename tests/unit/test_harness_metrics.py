"""The harness reads the worker's own /metrics page: keep its parser in step with what the worker renders."""

from __future__ import annotations

from collections import Counter

from aip.faults.worker import metric_values
from streams.metrics import StreamMetrics


def test_the_harness_reads_the_workers_metrics_page() -> None:
    m = StreamMetrics(Counter(), Counter(), highwater=lambda topic, partition: 10)
    for offset in range(5):
        m.consumed_message("gpu.metrics", 0, offset)
    for offset in range(2):
        m.consumed_message("jobs.lifecycle", 1, offset)
    m.consumed_message("interference.observations", 0, 0)
    m.published["observations"] += 3
    body = m.render()[0].decode()
    assert sum(metric_values(body, "aip_stream_consumed_records_total")) == 8
    assert metric_values(body, "aip_stream_consumed_records_total", topic="jobs.lifecycle") == [2.0]
    assert metric_values(body, "aip_stream_published_records_total", topic="observations") == [3.0]
    # a label set is matched as a subset: the lag of one partition, or of every partition of a topic
    assert metric_values(body, "aip_stream_consumer_lag_records", topic="gpu.metrics", partition="0") == [5.0]
    assert sorted(metric_values(body, "aip_stream_consumer_lag_records")) == [5.0, 8.0, 9.0]
    assert metric_values(body, "aip_stream_consumed_records_total", topic="nothing") == []


def test_prediction_delays_render_as_a_prometheus_histogram() -> None:
    m = StreamMetrics(Counter(), Counter())
    for seconds in (0.4, 6.5, 7.0, 19.0, 45.0):
        m.prediction_delay.observe(seconds)
    body = m.render()[0].decode()
    assert metric_values(body, "aip_stream_prediction_delay_seconds_bucket", le="1.0") == [1.0]
    assert metric_values(body, "aip_stream_prediction_delay_seconds_bucket", le="10.0") == [3.0]
    assert metric_values(body, "aip_stream_prediction_delay_seconds_bucket", le="20.0") == [4.0]
    assert metric_values(body, "aip_stream_prediction_delay_seconds_bucket", le="+Inf") == [5.0]
    assert metric_values(body, "aip_stream_prediction_delay_seconds_count") == [5.0]
    assert metric_values(body, "aip_stream_prediction_delay_seconds_sum") == [77.9]

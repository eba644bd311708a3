"""``aip bench fleet``'s cost curve drawn, and a worker's page of named series (no workers here)."""

from __future__ import annotations

from pathlib import Path

from aip.bench.fleet import READ_METRICS, plot_curve
from aip.faults.worker import metric_values


def test_the_cost_curve_is_drawn_from_the_sizes_with_figures(tmp_path: Path) -> None:
    points = [
        {"gpus": 500, "cpu_ms_per_gpu_sample": 0.2, "kept_up": True},
        {"gpus": 2000, "cpu_ms_per_gpu_sample": 0.15, "kept_up": True},
        {"gpus": 10_000, "error": "RuntimeError: the fleet's sender failed"},
    ]
    path = tmp_path / "curve.png"
    plot_curve(points, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_worker_asked_for_named_series_renders_only_those_with_the_whole_pages_values() -> None:
    from collections import Counter

    from prometheus_client.core import GaugeMetricFamily

    from streams.metrics import StreamMetrics

    m = StreamMetrics(Counter(), Counter(refits_applied=2, refit_ms=900), highwater=lambda topic, partition: 10)
    m.consumed_message("gpu.metrics", 0, 3)
    m.published["observations"] += 5

    class PerGpu:  # stands for the per-GPU series (InterferenceMetrics)
        def collect(self):  # type: ignore[no-untyped-def]
            yield GaugeMetricFamily("aip_gpu_colocated_jobs", "jobs", value=2.0)

    m.registry.register(PerGpu())  # type: ignore[arg-type]
    full, named = m.render()[0].decode(), m.render(READ_METRICS)[0].decode()
    assert "aip_gpu_colocated_jobs" in full and "aip_gpu_colocated_jobs" not in named
    assert "aip_stream_prediction_delay" in full and "aip_stream_prediction_delay" not in named
    for name in READ_METRICS:
        assert metric_values(named, name) == metric_values(full, name) != []


def test_a_lag_that_grows_is_seen_through_a_worker_too_busy_to_answer() -> None:
    """A worker far behind may not answer its /metrics within the timeout: that snapshot holds no lag of it. Counted
    as 0, it made the lowest lag of the last quarter 0, and a lag growing from 20,000 to 380,000 records "did not
    grow" (a 600 s run of 10,000 GPUs)."""
    from aip.bench.fleet import grows, read_points

    series = [(5.0 * i, {"lag": {"stage1": 1000.0 * i}, "unread": 0}) for i in range(16)]
    series[14] = (70.0, {"lag": {"stage1": 0.0}, "unread": 1})
    assert not grows([(t, s["lag"]["stage1"]) for t, s in series], tolerance=10.0)  # how it was read before
    assert grows(read_points(series, "stage1"), tolerance=10.0)
    assert read_points([(0.0, {"lag": {"stage1": 7.0}, "unread": 0})], "stage1") == [(0.0, 7.0)]

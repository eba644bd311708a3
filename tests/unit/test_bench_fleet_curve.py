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

"""``aip bench fleet``'s harness on 400 GPUs for 30 s (``--quick`` runs 2,000 for 120 s; the figures at that size are
the bench's own): counts only (no timing assertions: the suite runs beside other tests)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_fleet_runs_through_two_workers_and_every_sample_is_consumed(tmp_path) -> None:
    from aip.bench.fleet import run_fleet

    lines: list[str] = []
    out = run_fleet(400, 2, 30.0, tmp_path, lines.append)
    assert out["gpus"] == 400 and out["workers"] == 2 and out["hosts"] == 50 and out["serving"] == "sharded"
    assert out["gpu_samples_sent"] >= 400 * 25  # 1 Hz for 30 s (no samples at the first tick)
    assert out["gpu_samples_consumed"] == out["gpu_samples_sent"]
    assert set(out["lag"]) == {"stage1", "stage2"} and all(
        set(v) == {"max_records", "max_s", "grows", "max_records_by_worker"} for v in out["lag"].values()
    )
    for v in out["lag"].values():  # each worker's own lag: the stage's is their sum, so none above the stage's highest
        assert len(v["max_records_by_worker"]) == 2 and all(0 <= w <= v["max_records"] for w in v["max_records_by_worker"])
    assert len(out["worker_cpu_pct"]) == len(out["worker_rss_mb"]) == 2 and all(r > 0 for r in out["worker_rss_mb"])
    assert len(out["worker_gc_pct"]) == 2 and all(0.0 <= g < 100.0 for g in out["worker_gc_pct"])  # from their /metrics
    assert 0 <= out["p50_s"] <= out["read_p50_s"] and out["p99_s"] <= out["read_p99_s"]  # published, then read
    by = out["latency_s_by_occupancy"]
    assert set(by) <= {"colocated", "solo", "idle"} and sum(v["predictions"] for v in by.values()) == out["predictions"] > 0
    assert isinstance(out["kept_up"], bool) and out["cpu_ms_per_gpu_sample"] > 0
    assert isinstance(out["metrics_unread"], int) and out["metrics_unread"] >= 0
    assert out["observations"] > 0
    late = out["sender_late_s"]  # each batch acknowledged after it was handed over, so every quantile is too
    assert late["handed_p50"] <= late["acked_p50"] and late["handed_p99"] <= late["acked_p99"]
    assert any("lag stage 1" in line for line in lines)  # progress while it runs
    harness = out["harness_cpu_pct"]  # the sender, the reader, the broker and the bench itself, apart from the workers
    assert set(harness) == {"broker", "sender", "reader", "bench"} and harness["sender"] > 0 and harness["broker"] > 0
    # the sender's CPU while sending: a part of its process's, which also imported and built the simulation
    sending_s = out["sender_cpu_ms_per_gpu_sample"] * out["gpu_samples_sent"] / 1000.0
    assert 0 < sending_s <= (harness["sender"] + 0.05) / 100.0 * out["duration_s"]
    # the learner's refits, read from its /metrics: those on drift among them, wall seconds only where one was applied
    assert 0 <= out["refits_on_drift"] <= out["refits"] and (out["refit_wall_s"] > 0) == (out["refits"] > 0)
    assert out["cpu_ms_per_gpu_sample_last_half"] is not None and out["cpu_ms_per_gpu_sample_last_half"] > 0

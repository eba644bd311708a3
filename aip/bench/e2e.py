"""``aip bench e2e``: sample timestamp to prediction published, through one ``aip worker``.

First a burst of simulated events measures the worker's maximum rate: input
records over the time from its first consumed record (not its group join) until
stage 2 has consumed every observation of the burst (from its /metrics; stage 1
alone is reported too); then a second simulated fleet is published paced at
half that rate, and every prediction of its GPUs is
timed from the wall-clock moment the last sample of its window was published
to the moment the prediction is consumed.  That span includes waiting for the
window to close (window end + lateness in event time, divided by the speedup).
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from aip.faults.worker import metric_values, worker_on_embedded_broker
from producers.pacing import due_after_s

STAGE1_TOPICS = ("gpu.metrics", "jobs.lifecycle")


def _metric(port: int, name: str, topics: tuple[str, ...]) -> float:
    """Sum of ``aip_stream_<name>{topic=...}`` over ``topics`` (``""``: a metric without a topic) on the worker's
    /metrics; -1 while it is not up."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return -1.0
    return sum(sum(metric_values(body, f"aip_stream_{name}", **({"topic": topic} if topic else {}))) for topic in topics)


def _consumed(port: int, topics: tuple[str, ...] = STAGE1_TOPICS) -> float:
    return _metric(port, "consumed_records_total", topics)


def _stage2_idle(port: int) -> bool:
    published = _metric(port, "published_records_total", ("observations",))  # observations, not records
    return _metric(port, "consumed_observations_total", ("",)) >= published


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def run(quick: bool, progress: Any) -> dict[str, Any]:
    from producers.sim import Simulator
    from transport import RecordConsumer, RecordProducer

    paced_wall_s = 25.0 if quick else 120.0
    with worker_on_embedded_broker("e", ready_timeout_s=60) as worker:
        settings = worker.settings
        burst = list(Simulator(32, seed=1, start_ts=1_700_000_000.0, duration_s=150 if quick else 600).events())
        progress(f"burst of {len(burst)} events")
        with RecordProducer(settings, linger_ms=20) as p:
            for topic, record in burst:
                p.send(topic, record)
            p.flush(60)
        # timed from the worker's first consumed record: joining the group is not processing
        # (Tansu holds a static member's SyncGroup 3 s longer than a dynamic one's)
        t0 = time.monotonic()
        while (c0 := _consumed(worker.web_port)) == 0 and time.monotonic() - t0 < 120:
            time.sleep(0.05)
        t0 = time.monotonic()
        while _consumed(worker.web_port) < len(burst) and time.monotonic() - t0 < 300:
            time.sleep(0.1)
        stage1_rate = (len(burst) - c0) / (time.monotonic() - t0)
        while not _stage2_idle(worker.web_port) and time.monotonic() - t0 < 600:  # let stage 2 drain the burst
            time.sleep(0.2)
        max_rate = (len(burst) - c0) / (time.monotonic() - t0)  # what the worker sustains, stage 2 included
        rate = max_rate / 2
        gpus = 16
        probe = Simulator(gpus, seed=2, start_ts=1_700_000_000.0, duration_s=100)
        per_sim_s = sum(1 for _ in probe.events()) / 100.0
        speedup = max(1.0, rate / per_sim_s)
        progress(f"max {max_rate:.0f} events/s; pacing {gpus} GPUs at {rate:.0f} events/s (speedup {speedup:.1f})")
        start_ts = time.time()
        sim = Simulator(gpus, seed=2, start_ts=start_ts, duration_s=paced_wall_s * speedup)
        uuids = {g.uuid for g in sim.gpus}
        consumer = RecordConsumer(settings, ["interference.predictions"])
        latencies: list[float] = []
        wall0 = time.time()
        with RecordProducer(settings, linger_ms=1) as p:
            for topic, record in sim.events():
                due = wall0 + due_after_s(record.ts, start_ts, speedup)
                while time.time() < due:
                    for item in consumer.poll(timeout_s=max(0.0, min(0.05, due - time.time()))):
                        _latency(item, uuids, wall0, start_ts, speedup, latencies)
                p.send(topic, record)
        end = time.monotonic() + (5 if quick else 10)  # the last windows' predictions (at the speed-up: minutes)
        while time.monotonic() < end:
            for item in consumer.poll(timeout_s=0.5):
                _latency(item, uuids, wall0, start_ts, speedup, latencies)
        consumer.close()
    if not latencies:
        raise RuntimeError("no predictions for the paced GPUs")
    return {
        "e2e_p50_s": round(_pct(latencies, 0.5), 3),
        "e2e_p99_s": round(_pct(latencies, 0.99), 3),
        "e2e_predictions": len(latencies),
        "e2e_rate_events_per_s": round(rate),
        "e2e_max_events_per_s": round(max_rate),
        "e2e_stage1_burst_events_per_s": round(stage1_rate),
        "e2e_speedup": round(speedup, 2),
        "e2e_config": json.dumps({"window_s": settings.window_s, "lateness_s": settings.lateness_s}),
    }


def _latency(item: Any, uuids: set[str], wall0: float, start_ts: float, speedup: float, out: list[float]) -> None:
    r = item.record
    if r is None or r.gpu_uuid not in uuids or r.window_end is None:
        return
    published = wall0 + due_after_s(r.window_end, start_ts, speedup)  # the window's last sample was published by then
    out.append(time.time() - published)

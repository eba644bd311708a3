"""The per-GPU interference series: labels bounded, series gone with their job or GPU, the alert state as published."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from events import Alert, Observation, Prediction, WhatIf
from streams.interference_metrics import InterferenceMetrics

TS = 1_700_000_000.0


def obs(gpu: str, job: str, jt: str, start: float, co: dict[str, str], pct: float | None, env: str = "v100") -> Observation:
    return Observation(
        window_start=start, window_end=start + 10, gpu_uuid=gpu, environment=env, job_id=job, job_type=jt,
        co_job_types=list(co.values()), co_job_ids=list(co), interference_pct=pct,
    )  # fmt: skip


def pred(o: Observation, mode: Any, pct: float, what_if: list[WhatIf] | None = None) -> Prediction:
    return Prediction(
        ts=TS, gpu_uuid=o.gpu_uuid, environment=o.environment, job_id=o.job_id, job_type=o.job_type,
        job_set=sorted([o.job_type, *o.co_job_types]), mode=mode, interference_pct=pct, model="knn", category="all",
        measured_pct=o.interference_pct, what_if=what_if or [], regime="seen",
    )  # fmt: skip


def alert(o: Observation, state: Any) -> Alert:
    return Alert(
        ts=TS, state=state, gpu_uuid=o.gpu_uuid, job_id=o.job_id, interference_pct=1.0, threshold=50.0, source="measured"
    )


def samples(m: InterferenceMetrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(m)
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_series_per_gpu_and_job_type_never_job_ids_and_the_alert_state_as_published() -> None:
    m = InterferenceMetrics(50.0, 35.0)
    a = obs("G1", "j1", "bert", TS, {"j2": "resnet", "j3": "bert"}, 60.0)
    b = obs("G1", "j3", "bert", TS, {"j1": "bert", "j2": "resnet"}, 40.0)
    c = obs("G1", "j2", "resnet", TS, {"j1": "bert", "j3": "bert"}, None)
    m.observe(
        a,
        [pred(a, "observed", 55.0), pred(a, "placement", 58.0, [WhatIf(job_type="vgg", newcomer_pct=10, existing_pct=25)])],
        [alert(a, "raised")],
    )
    m.observe(b, [pred(b, "observed", 45.0)], [])
    m.observe(c, [pred(c, "observed", 20.0)], [])
    s = samples(m)
    labels = {k for rows in s.values() for row in rows for k in row[0]}
    assert "job_id" not in labels and not any("j1" in v for rows in s.values() for row in rows for v in row[0].values())
    value = {(r["job_type"], r["source"]): v for r, v in s["aip_gpu_interference_percent"]}
    assert value == {("bert", "measured"): 60.0, ("resnet", "predicted"): 20.0}  # two bert jobs: the larger
    assert s["aip_gpu_interference_alerts_raised"] == [({"environment": "v100", "gpu_uuid": "G1"}, 1.0)]
    assert s["aip_gpu_colocated_jobs"][0][1] == 3.0
    assert s["aip_gpu_whatif_cost_percent"] == [({"environment": "v100", "gpu_uuid": "G1", "job_type": "vgg"}, 35.0)]
    assert {r["co_job_types"] for r, _ in s["aip_job_set_interference_percent"]} == {"bert+resnet", "bert+bert"}
    assert dict(((r["mode"], r["regime"]), v) for r, v in s["aip_predictions_total"]) == {
        ("observed", "seen"): 3.0,
        ("placement", "seen"): 1.0,
    }
    err = {r["mode"]: v for r, v in s["aip_served_error_points_sum"]}
    assert err == {"observed": 5.0 + 5.0, "placement": 2.0}  # |55-60| + |45-40|; c had no measured rate
    m.observe(a, [], [alert(a, "cleared")])
    assert samples(m)["aip_gpu_interference_alerts_raised"][0][1] == 0.0


def test_a_job_gone_from_its_gpus_window_loses_its_series() -> None:
    m = InterferenceMetrics(50.0, 35.0)
    a = obs("G1", "j1", "bert", TS, {"j2": "resnet"}, 60.0)
    m.observe(a, [], [alert(a, "raised")])
    m.observe(obs("G1", "j2", "resnet", TS, {"j1": "bert"}, 30.0), [], [])
    m.observe(obs("G1", "j2", "resnet", TS + 10, {"j4": "vgg"}, 30.0), [], [])  # j1 finished, j4 arrived
    s = samples(m)
    assert {r["job_type"] for r, _ in s["aip_gpu_interference_percent"]} == {"resnet"}
    assert s["aip_gpu_interference_alerts_raised"][0][1] == 0.0
    # an older window arriving late does not bring the finished job back
    m.observe(obs("G1", "j2", "resnet", TS, {"j1": "bert"}, 31.0), [], [])
    assert {r["job_type"] for r, _ in samples(m)["aip_gpu_interference_percent"]} == {"resnet"}


def test_a_gpu_gone_quiet_loses_its_series_by_event_time_and_by_wall_time() -> None:
    clock = Clock()
    m = InterferenceMetrics(50.0, 35.0, horizon_s=60.0, stale_after_s=300.0, clock=clock)
    m.observe(obs("G1", "j1", "bert", TS, {"j2": "resnet"}, 60.0), [], [])
    m.observe(obs("G2", "j3", "bert", TS + 50, {"j4": "resnet"}, 60.0), [], [])
    assert {r["gpu_uuid"] for r, _ in samples(m)["aip_gpu_interference_percent"]} == {"G1", "G2"}
    m.observe(obs("G2", "j3", "bert", TS + 80, {"j4": "resnet"}, 60.0), [], [])  # G1's last window is 80 s behind
    assert {r["gpu_uuid"] for r, _ in samples(m)["aip_gpu_interference_percent"]} == {"G2"}
    assert {r["gpu_uuid"] for r, _ in samples(m)["aip_gpu_colocated_jobs"]} == {"G2"}
    clock.now = 301.0  # nothing received for longer than stale_after_s
    s: dict[str, Any] = samples(m)
    assert "aip_gpu_interference_percent" not in s and "aip_gpu_interference_alerts_raised" not in s
    assert s["aip_alert_threshold_percent"] == [({}, 50.0)]


def test_a_job_left_alone_shows_no_interference() -> None:
    m = InterferenceMetrics(50.0, 35.0)
    a = obs("G1", "j1", "bert", TS, {"j2": "resnet"}, 80.0)
    m.observe(a, [], [alert(a, "raised")])
    lone = Observation(
        window_start=TS + 10, window_end=TS + 20, gpu_uuid="G1", environment="v100", job_id="j1", job_type="bert",
        co_job_types=[], co_job_ids=[], interference_pct=None, occupancy="solo",
    )  # fmt: skip
    m.observe(lone, [], [alert(lone, "cleared")])  # stage 2 clears a lone job's alert
    s = samples(m)
    assert [(r["job_type"], v) for r, v in s["aip_gpu_interference_percent"]] == [("bert", 0.0)]
    assert s["aip_gpu_interference_alerts_raised"][0][1] == 0.0


def test_each_gpu_keeps_the_jobs_of_its_latest_window_over_a_changing_fleet() -> None:
    """Many GPUs whose job sets change window by window, some going quiet: the jobs kept are exactly those of each
    remaining GPU's latest window (the per-GPU index and the series agree with a recount from the windows)."""
    import random

    rng = random.Random(5)
    clock = Clock()
    m = InterferenceMetrics(50.0, 35.0, horizon_s=30.0, clock=clock)
    latest: dict[str, tuple[float, set[str]]] = {}
    for k in range(12):
        start = TS + 10 * k
        for g in range(40):
            gpu = f"G{g}"
            if g % 7 == 0 and k > 4:
                continue  # these GPUs go quiet: pruned once their last window is behind the horizon
            jobs = {f"j{g}-{j}" for j in rng.sample(range(6), rng.randint(1, 3))}
            for job in sorted(jobs):
                co = {o: "resnet" for o in sorted(jobs - {job})}
                o = obs(gpu, job, "bert", start, co, 10.0)
                m.observe(o, [pred(o, "observed", 12.0)], [])
            latest[gpu] = (start, jobs)
    m.prune()
    newest = max(start for start, _ in latest.values()) + 10
    expected = {(gpu, j) for gpu, (start, jobs) in latest.items() if start + 10 >= newest - 30.0 for j in jobs}
    assert set(m.jobs) == expected and len(expected) > 0
    assert {(gpu, j) for gpu, ids in m.job_ids.items() for j in ids} == expected
    assert {s[0]["gpu_uuid"] for s in samples(m)["aip_gpu_colocated_jobs"]} == {g for g, _ in expected}

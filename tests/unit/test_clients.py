"""Scheduler client and load balancer, fed by hand-made records (no broker)."""

from __future__ import annotations

import pytest

from clients import LoadBalancer, SchedulerClient
from events import Alert, JobEvent, Prediction, WhatIf

T0 = 1_700_000_000.0


def prediction(gpu: str, job_set: list[str], what_if: dict[str, tuple[float, float]], ts: float = T0) -> Prediction:
    return Prediction(
        ts=ts, gpu_uuid=gpu, environment="v100", job_id=f"{gpu}-j0", job_type=job_set[0], job_set=job_set, mode="placement",
        interference_pct=10.0, model="knn", category="all",
        what_if=[WhatIf(job_type=t, newcomer_pct=n, existing_pct=e) for t, (n, e) in what_if.items()],
    )  # fmt: skip


def job(gpu: str, job_id: str, job_type: str, kind: str = "started", ts: float = T0) -> JobEvent:
    progress = {"steps": 1, "step_time_s": 0.1} if kind == "progress" else {}
    return JobEvent(ts=ts, kind=kind, job_id=job_id, job_type=job_type, gpu_uuid=gpu, host="h", **progress)


def client(**kw: object) -> SchedulerClient:
    return SchedulerClient(clock=lambda: T0 + 10.0, **kw)  # type: ignore[arg-type]


def test_best_gpu_minimises_newcomer_plus_existing_slowdown() -> None:
    c = client()
    c.update(prediction("a", ["LM"], {"X": (10.0, 60.0)}))  # newcomer barely slowed, but hurts LM a lot: 70
    c.update(prediction("b", ["A3C"], {"X": (30.0, 20.0)}))  # 50
    c.update(prediction("c", ["GAN"], {"X": (55.0, 0.0)}))  # 55
    assert c.best_gpu("X", ["a", "b", "c"]) == "b"
    assert [g for g, _ in c.ranked("X", ["a", "b", "c"])] == ["b", "c", "a"]
    assert c.best_gpu("X", ["a", "c"]) == "c"


def test_idle_gpu_is_best_and_unknown_gpus_come_last() -> None:
    c = client()
    c.update(prediction("busy", ["LM"], {"X": (5.0, 5.0)}))
    assert c.best_gpu("X", ["never-seen", "busy"]) == "busy"  # a known cost beats an unknown GPU
    c.mark_idle("idle")
    assert c.best_gpu("X", ["never-seen", "busy", "idle"]) == "idle"
    assert c.cost_pct("idle", "X") == 0.0
    assert c.best_gpu("X", ["never-seen"]) == "never-seen"  # nothing known: still an answer
    assert c.best_gpu("X", []) is None
    assert c.best_gpu("Y", ["busy"]) == "busy"  # no entry for this type: unknown, but the only candidate


def test_unknown_cost_setting_and_max_cost() -> None:
    c = client(unknown_cost_pct=40.0)
    c.update(prediction("busy", ["LM"], {"X": (30.0, 30.0)}))
    assert c.best_gpu("X", ["busy", "other"]) == "other"  # 40 < 60
    assert c.best_gpu("X", ["busy"], max_cost_pct=50.0) is None
    assert c.best_gpu("X", ["busy"], max_cost_pct=70.0) == "busy"


def test_lifecycle_invalidates_stale_what_if_and_marks_idle() -> None:
    c = client()
    c.on_job_event(job("a", "j1", "LM"))
    c.update(prediction("a", ["LM"], {"X": (10.0, 10.0)}))
    assert c.cost_pct("a", "X") == 20.0
    c.on_job_event(job("a", "j2", "GAN"))  # the job set changed: the entries no longer hold
    assert c.cost_pct("a", "X") is None
    c.on_job_event(job("a", "j1", "LM", "finished"))
    c.on_job_event(job("a", "j2", "GAN", "finished"))
    assert c.cost_pct("a", "X") == 0.0
    assert c.running_jobs("a") == 0


def test_old_and_observed_predictions_do_not_replace_entries() -> None:
    c = client(max_age_s=60.0)
    assert c.update(prediction("a", ["LM"], {"X": (10.0, 10.0)}, ts=T0))
    assert not c.update(prediction("a", ["LM"], {"X": (90.0, 90.0)}, ts=T0 - 5))
    observed = Prediction(ts=T0 + 1, gpu_uuid="a", environment="v100", job_id="j", job_type="LM", job_set=["LM"],
                          mode="observed", interference_pct=5.0, model="m", category="1")  # fmt: skip
    assert not c.update(observed)
    assert c.cost_pct("a", "X") == 20.0
    late = SchedulerClient(clock=lambda: T0 + 61.0, max_age_s=60.0)
    late.update(prediction("a", ["LM"], {"X": (10.0, 10.0)}))
    assert late.cost_pct("a", "X") is None  # too old to trust


def test_negative_predictions_count_as_zero() -> None:
    c = client()
    c.update(prediction("a", ["LM"], {"X": (-5.0, -3.0)}))
    c.update(prediction("b", ["LM"], {"X": (1.0, 0.0)}))
    assert c.cost_pct("a", "X") == 0.0
    assert c.best_gpu("X", ["b", "a"]) == "a"


def alert(state: str, gpu: str = "g1", job_id: str = "j1", ts: float = T0) -> Alert:
    return Alert(ts=ts, state=state, gpu_uuid=gpu, job_id=job_id, interference_pct=70.0, threshold=50.0, source="measured",
                 job_type="LM")  # fmt: skip


def test_load_balancer_acts_once_per_raised_alert_with_cooldown() -> None:
    now = [T0]
    moves: list[object] = []
    lb = LoadBalancer(moves.append, cooldown_s=60.0, clock=lambda: now[0])
    assert lb.handle(alert("raised")) is not None
    assert lb.handle(alert("raised")) is None  # repeat
    assert lb.handle(alert("raised", job_id="j2")) is None  # same GPU, within the cool-down
    now[0] += 61.0
    assert lb.handle(alert("raised", job_id="j3")).job_id == "j3"  # type: ignore[union-attr]
    assert lb.handle(alert("raised", gpu="g2")) is not None  # another GPU is not cooled down
    lb.handle(alert("cleared"))
    now[0] += 61.0
    again = lb.handle(alert("raised"))  # raised anew after clearing
    assert again is not None and again.gpu_uuid == "g1"
    assert [(m.gpu_uuid, m.job_id) for m in moves] == [("g1", "j1"), ("g1", "j3"), ("g2", "j1"), ("g1", "j1")]  # type: ignore[attr-defined]
    assert lb.counters["moves"] == 4 and lb.counters["repeats"] == 1 and lb.counters["cooled_down"] == 1


def test_load_balancer_survives_a_failing_callback() -> None:
    def boom(_: object) -> None:
        raise RuntimeError("cluster API down")

    lb = LoadBalancer(boom, cooldown_s=0.0, clock=lambda: T0)
    assert lb.handle(alert("raised")) is not None
    assert lb.counters["callback_errors"] == 1


@pytest.mark.parametrize("quick_jobs", [40])
def test_placement_guided_uses_the_client_and_beats_random(quick_jobs: int) -> None:
    """A tiny run of the experiment: all policies place every job; guided beats random on this seed."""
    from placement.experiment import Setup, Truth, WhatIfService, run_seed, train_models

    setup = Setup(jobs=quick_jobs, gpus=4, train_gpus=6, train_duration_s=1200.0)
    truth = Truth(setup.gpu_model)
    service = WhatIfService(train_models(setup, truth), truth)
    result = run_seed(3, setup, truth, service)
    assert {p: r["jobs"] for p, r in result.items()} == {"random": 40.0, "least_loaded": 40.0, "guided": 40.0, "guided_upper": 40.0, "oracle": 40.0}
    assert service.predictions_made > 0
    assert result["guided"]["mean_slowdown_pct"] < result["random"]["mean_slowdown_pct"]


# ---------------------------------------------------------------- a client that joins mid-stream
def at(p: Prediction, window_end: float) -> Prediction:
    import msgspec

    return msgspec.structs.replace(p, window_end=window_end)


def test_mid_stream_client_does_not_call_a_busy_gpu_idle_after_an_older_job_finishes() -> None:
    c = client()  # joined mid-run: it never saw j1 and j2 start
    c.on_job_event(job("a", "j1", "LM", "progress", ts=T0 - 2))
    c.update(at(prediction("a", ["GAN", "LM"], {"X": (10.0, 10.0)}), T0))
    assert c.cost_pct("a", "X") == 20.0
    c.on_job_event(job("a", "j1", "LM", "finished", ts=T0 + 5))
    assert c.cost_pct("a", "X") is None  # GAN still runs: the entries are stale, and the GPU is not idle
    assert c.running_jobs("a") == 1
    c.on_job_event(job("a", "j2", "GAN", "finished", ts=T0 + 8))
    assert c.cost_pct("a", "X") == 0.0 and c.running_jobs("a") == 0  # the predicted set has emptied: now it is idle


def test_mid_stream_client_without_history_before_the_prediction_never_guesses_idle() -> None:
    c = client()
    c.update(at(prediction("a", ["GAN", "LM"], {"X": (10.0, 10.0)}), T0))
    c.on_job_event(job("a", "j1", "LM", "finished", ts=T0 + 5))  # the first event it sees is after the prediction
    c.on_job_event(job("a", "j2", "GAN", "finished", ts=T0 + 8))
    assert c.cost_pct("a", "X") is None  # a job may have started in between, unseen: unknown, not 0


def test_mid_stream_lifecycle_events_the_prediction_already_holds_keep_its_entries() -> None:
    c = client()
    c.update(at(prediction("a", ["GAN", "LM"], {"X": (10.0, 10.0)}), T0))
    c.on_job_event(job("a", "j2", "GAN", ts=T0 - 30))  # a lagging lifecycle partition: j2's start, older than the window
    c.on_job_event(job("a", "j2", "GAN", "progress", ts=T0 + 1))
    c.on_job_event(job("b", "j9", "LM", ts=T0 + 2))  # another GPU
    assert c.cost_pct("a", "X") == 20.0
    c.on_job_event(job("a", "j3", "A3C", ts=T0 + 3))  # a real change of the job set
    assert c.cost_pct("a", "X") is None
    assert c.running_jobs("a") == 3


def test_mid_stream_client_tracks_a_simulated_fleet_against_the_full_history() -> None:
    """Replay a simulated fleet: a client that saw everything is the truth; one that joined at 400 s
    gets its job sets from (synthesised) predictions and must never report a busy GPU idle."""
    from producers.sim import Simulator

    sim = Simulator(gpus=6, seed=4, start_ts=T0, duration_s=1500)
    truth = SchedulerClient(clock=lambda: T0, history_complete=True, max_age_s=float("inf"))
    late = SchedulerClient(clock=lambda: T0, max_age_s=float("inf"))
    join, lag_s, window_s = T0 + 400.0, 15.0, 10.0
    pending: list[tuple[float, Prediction]] = []
    next_window = T0 + window_s
    idle_answers = known_sets = 0
    for topic, record in sim.events():
        if topic != "jobs.lifecycle":
            continue
        while record.ts > next_window:  # a window closed: predictions of its co-located GPUs, published lag_s later
            for gpu, view in truth.snapshot().items():
                types = sorted(view.job_types().elements())
                if len(types) >= 2:
                    p = at(prediction(gpu, types, {"X": (10.0, 5.0)}, ts=T0), next_window)
                    pending.append((next_window + lag_s, p))
            next_window += window_s
        truth.on_job_event(record)
        if record.ts < join:
            continue
        while pending and pending[0][0] <= record.ts:
            late.update(pending.pop(0)[1])
        late.on_job_event(record)
        for gpu, view in late.snapshot().items():
            true_count = truth.running_jobs(gpu)
            if late.cost_pct(gpu, "X") == 0.0:
                idle_answers += 1
                assert true_count == 0, f"{gpu} reported idle while {true_count} jobs run"
            if view.complete:
                known_sets += 1
                assert late.running_jobs(gpu) == true_count
    assert idle_answers > 0 and known_sets > 0  # the late client did learn the sets, and did find idle GPUs

"""Every GPU answers the scheduler's question, without Kafka: stage 1 tells stage 2 about solo
and idle windows, stage 2 answers a lone job's window with what-if entries and never learns from it, and the
scheduler client takes an idle GPU's answer."""

from __future__ import annotations

import msgspec
from records import sample
from test_streams import BASE, alone, feed, observations, scenario

from clients import SchedulerClient
from events import JobEvent, Prediction, decode, encode
from streams.serving import LearnAndServe, idle_prediction
from streams.stage1 import IdleWindow, Stage1


def test_stage1_tells_of_solo_windows_only_when_asked_and_they_are_never_labelled() -> None:
    plain = feed(Stage1(window_s=10.0, lateness_s=2.0), scenario())
    stage = Stage1(window_s=10.0, lateness_s=2.0, every_window=True)
    every = feed(stage, scenario())
    solo = [o for o in every if not o.colocated]
    assert [o for o in every if o.colocated] == plain  # the co-located observations do not change
    assert [o.window_start for o in solo] == [BASE, BASE + 10, BASE + 20] and stage.counters["observations_solo"] == 3
    for o in solo:
        assert o.occupancy == "solo" and o.job_id == "GPU-A-a" and o.co_job_types == [] and o.co_solo == []
        assert o.interference_pct is None  # never a training row, for old readers too
        assert decode(type(o), encode(o)) == o
    assert solo[-1].solo == stage.profiles.get("v100", "resnet")  # the profile, this window included
    assert all(o.occupancy is None for o in plain)


def test_stage1_tells_of_idle_windows() -> None:
    stage = Stage1(window_s=10.0, lateness_s=2.0, hold_s=10.0, every_window=True)
    for i in range(60):  # samples only: no job ever starts on this GPU
        stage.on_metric(sample(ts=BASE + i * 0.5, gpu_uuid="GPU-I", gpu_model="v100", seq=i, power_w=40.0))
    idle = stage.take_idle()
    assert idle and idle[0] == IdleWindow("GPU-I", "v100", BASE, BASE + 10)
    assert [w.window_start for w in idle] == [BASE + 10 * k for k in range(len(idle))]
    assert stage.take_idle() == [] and stage.counters["windows_idle"] == len(idle)
    quiet = Stage1(window_s=10.0, lateness_s=2.0, hold_s=10.0)  # not asked: nothing kept
    for i in range(60):
        quiet.on_metric(sample(ts=BASE + i * 0.5, gpu_uuid="GPU-I", gpu_model="v100", seq=i, power_w=40.0))
    assert quiet.take_idle() == [] and quiet.counters["windows_idle"] == len(idle)


def test_stage2_answers_a_lone_job_and_learns_nothing_from_it() -> None:
    stage = LearnAndServe.build(clock=lambda: BASE)
    for o in observations():
        stage.on_observation(o)
    models = stage.learner.models_for("v100")
    before = (stage.counters["observations"], models.leaderboard().observations, len(stage.learner.seen))
    last = observations()[-1]
    lone = alone(last, 100, job_id="j9")
    out = stage.on_observation(lone)
    assert out.alerts == [] and out.leaderboard is None
    [pred] = out.predictions
    assert pred.occupancy == "solo" and pred.job_set == [last.job_type] and pred.job_id == "j9"
    assert pred.interference_pct == 0.0 and pred.model == "solo" and pred.window_end == lone.window_end
    # every known type as a newcomer (their values: test_serving_what_if.py, worked out by hand)
    assert [w.job_type for w in pred.what_if] == sorted(stage.learner.job_types["v100"]) == ["lm", "resnet"]
    assert (stage.counters["observations"], models.leaderboard().observations, len(stage.learner.seen)) == before
    assert stage.counters["solo_windows"] == 1
    assert stage.learner.replay(lone) is False and models.leaderboard().observations == before[1]  # a rebuild skips it too
    assert stage.on_observation(lone).predictions  # not deduped: the answer is republished, still nothing learned


def test_an_idle_prediction_makes_the_gpu_cost_nothing_for_a_client_that_joined_mid_stream() -> None:
    client = SchedulerClient(clock=lambda: BASE)  # history not complete: it knows only what it is told
    idle = idle_prediction("GPU-I", "v100", BASE, ["lm", "resnet"], now=BASE)
    assert client.update(decode(Prediction, encode(idle)))
    assert client.is_idle("GPU-I") and client.cost_pct("GPU-I", "lm") == 0.0 and client.cost_pct("GPU-I", "gan") == 0.0
    ev = JobEvent(ts=BASE + 5, kind="started", job_id="j1", job_type="lm", gpu_uuid="GPU-I", host="n1")
    client.on_job_event(ev)  # a job starts there: the idle answer is stale
    assert not client.is_idle("GPU-I") and client.cost_pct("GPU-I", "lm") is None


def test_a_raised_alert_clears_when_its_job_is_left_alone() -> None:
    stage = LearnAndServe.build(threshold_pct=50.0, clear_pct=35.0, clock=lambda: BASE)
    last = observations()[-1]
    hot = msgspec.structs.replace(last, job_id="j1", interference_pct=80.0)
    [raised] = stage.on_observation(hot).alerts
    assert raised.state == "raised" and raised.job_id == "j1"
    lone = alone(hot, 10)
    [cleared] = stage.on_observation(lone).alerts
    assert (cleared.state, cleared.job_id, cleared.interference_pct, cleared.source) == ("cleared", "j1", 0.0, "measured")
    assert stage.on_observation(lone).alerts == []  # cleared once; a lone job never alerts

"""Stage 2's refit scheduling (:mod:`streams.refits`): a refit that a stopping worker gives up leaves the models
as they were and ready to refit again, and publishes nothing; a stream that outruns its refits in event time waits
for them (``refit_max_lag_s``), one in real time never does."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from models import parallel
from models.synthetic import gavel_observations
from streams.refits import Refits
from streams.stage2 import Stage2


def test_a_refit_given_up_at_a_stop_keeps_the_models_and_publishes_nothing() -> None:
    stage2 = Stage2()
    for o in gavel_observations(60, seed=2):
        stage2.on_observation(o)
    models = stage2.models["v100"]
    published: list[Any] = []

    async def publish(env: str, board: Any) -> None:
        published.append((env, board))

    refits = Refits(stage2, publish)
    task = models.refit_task()  # the refit in flight when the signal comes
    assert not models.refit_due()

    def stopped() -> Any:
        parallel.stop()
        try:
            return task()
        finally:
            parallel.resume()

    refits.running.add("v100")
    asyncio.run(refits._run("v100", stopped))
    assert published == [] and refits.running == set() and models.refits == 0
    assert models.refit_due()  # not left "in flight": a later start refits


def _paced(stage2: Stage2, n: int, *, event_s: float, wall_s: float, clock: list[float], seed: int = 2) -> list[bool]:
    """Learn ``n`` observations, each ``event_s`` of event time and ``wall_s`` of wall clock after the last; whether
    stage 2 was behind its refits before each."""
    behind = []
    for i, o in enumerate(gavel_observations(n, seed=seed)):
        shift = i * (event_s - 1.0)  # gavel_observations' windows are 1 s apart
        o = msgspec.structs.replace(o, window_start=o.window_start + shift, window_end=o.window_end + shift)
        clock[0] += wall_s
        behind.append(stage2.behind(o.environment, o.window_end))
        stage2.on_observation(o)
    return behind


def test_a_stream_faster_than_real_time_is_behind_its_refits_and_one_in_real_time_never_is() -> None:
    # 10 s of event time per observation: the first refit is due at 30 rows (Config.refit_min_rows)
    clock = [0.0]
    fast = Stage2(refit_max_lag_s=60.0, refit_clock=lambda: clock[0])
    behind = _paced(fast, 40, event_s=10.0, wall_s=0.01, clock=clock)
    assert not any(behind[:30]) and all(behind[31:])  # due from the 30th row on, by then 300 s ahead of the clock
    models = fast.models["v100"]
    task = fast.refit_task("v100")  # taken now: its rows are the 40 learned, up to the latest window end
    assert fast.behind("v100", fast.learned_ts["v100"] + 61.0)  # in flight, not yet applied: still behind
    fast.apply_refit("v100", task())
    assert models.refits == 1 and fast.counters["refits_applied"] == 1
    assert not fast.behind("v100", fast.learned_ts["v100"] + 61.0)  # fit on what was learned, none due
    # the same stream in real time: the clock moves with event time, whatever the refits take
    clock = [0.0]
    real = Stage2(refit_max_lag_s=60.0, refit_clock=lambda: clock[0])
    assert not any(_paced(real, 600, event_s=10.0, wall_s=10.0, clock=clock))
    assert real.models["v100"].refit_due()  # due all along: nothing refitted it, nothing was behind
    off = Stage2(refit_max_lag_s=0.0, refit_clock=lambda: 0.0)
    assert not any(_paced(off, 40, event_s=10.0, wall_s=0.0, clock=[0.0]))


def test_keep_up_refits_at_once_past_the_share_wait_and_waits_for_a_refit_in_flight() -> None:
    clock = [0.0]
    stage2 = Stage2(refit_max_lag_s=60.0, refit_share=0.01, refit_clock=lambda: clock[0])
    published: list[str] = []

    async def publish(env: str, board: Any) -> None:
        published.append(env)

    refits = Refits(stage2, publish)
    models = stage2.models_for("v100")
    _paced(stage2, 40, event_s=10.0, wall_s=0.01, clock=clock)
    assert stage2.behind("v100", stage2.learned_ts["v100"])
    asyncio.run(refits.keep_up("v100"))  # none in flight: refits now and waits for it
    assert models.refits == 1 and stage2.counters["refits_awaited"] == 1 and published == ["v100"]
    assert not stage2.behind("v100", stage2.learned_ts["v100"])
    models.drift.detected = True  # due again at once, but a refit at a share of 0.01 holds the next back for 99x its time
    assert stage2.refits_due() == [] and stage2.behind("v100", stage2.learned_ts["v100"] + 61.0)

    async def in_flight() -> None:
        refits._start("v100", stage2.refit_task("v100"))  # as start_due would, had the share let it
        await refits.keep_up("v100")  # waits for that one: no second refit

    asyncio.run(in_flight())
    assert models.refits == 2 and stage2.counters["refits_awaited"] == 2 and stage2.counters["refits_applied"] == 2
    assert refits.running == set() and published == ["v100", "v100"]


def test_after_a_rebuild_and_its_refit_the_next_live_window_is_not_behind() -> None:
    clock = [0.0]
    stage2 = Stage2(refit_max_lag_s=60.0, refit_clock=lambda: clock[0])
    history = gavel_observations(40, seed=3)
    assert all(stage2.replay(o) for o in history)  # a rebuild from the topic, all at once
    last = history[-1].window_end
    assert stage2.learned_ts["v100"] == last
    stage2.apply_refit("v100", stage2.refit_task("v100")())  # the rebuild's refit, before serving
    clock[0] += 5.0
    models = stage2.models["v100"]
    models.drift.detected = True  # a refit due: only the clocks decide
    assert not stage2.behind("v100", last + 10.0) and stage2.behind("v100", last + 70.0)


def _at(stage2: Stage2, observations: list[Any], start_s: float, step_s: float) -> float:
    """Learn ``observations`` with window ends ``start_s``, ``start_s + step_s``, ...; the last window end."""
    end = start_s
    for i, o in enumerate(observations):
        end = start_s + i * step_s
        stage2.on_observation(msgspec.structs.replace(o, window_start=end - 10.0, window_end=end))
    return end


def test_refits_wait_the_interval_of_event_time_but_the_first() -> None:
    history = gavel_observations(1200, seed=4)
    stage2 = Stage2(refit_interval_s=300.0, refit_share=1.0)
    end = _at(stage2, history[:40], 0.0, 1.0)
    models = stage2.models["v100"]
    assert models.refit_due() and stage2.due("v100")  # the first refit does not wait
    [(env, task)] = stage2.refits_due()
    stage2.apply_refit(env, task())  # its rows were taken at window end 39
    end = _at(stage2, history[40:560], end + 0.5, 0.5)  # 520 observations over 260 s
    assert models.refit_due() and end - 39.0 < 300.0
    assert not stage2.due("v100") and stage2.refits_due() == []
    models.drift.detected = True  # drift waits too
    assert not stage2.due("v100")
    end = _at(stage2, history[560:600], end + 1.0, 1.0)  # 300 s of event time since the rows were taken
    assert end - 39.0 >= 300.0 and stage2.due("v100")
    [(env, task)] = stage2.refits_due()
    stage2.apply_refit(env, task())
    assert stage2.counters["refits_applied"] == 2 and stage2.counters["refits_on_drift"] == 1
    # without an interval, every refit_every observations
    every = Stage2(refit_share=1.0)
    _at(every, history[:40], 0.0, 1.0)
    [(env, task)] = every.refits_due()
    every.apply_refit(env, task())
    _at(every, history[40:560], 40.0, 0.5)
    assert every.due("v100") and len(every.refits_due()) == 1

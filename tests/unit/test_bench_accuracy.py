"""``aip bench accuracy``'s arithmetic: the truth of a window, and the figures from predictions."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from aip.bench.accuracy import floors, summarize
from aip.bench.truth import Truth

T0 = 1_700_000_000.0


def _truth() -> Truth:
    # job j runs T0..T0+100; shares the GPU at 50 % speed (slowdown 100 %) over T0+20..T0+40
    rows = [{"job_id": "j", "start_ts": T0 + 20, "end_ts": T0 + 40, "interference_pct": 100.0}]
    return Truth(rows, [{"job_id": "j", "start_ts": T0, "end_ts": T0 + 100}])


def test_truth_of_a_window() -> None:
    truth = _truth()
    assert truth.interference_pct("j", T0 + 20, T0 + 30) == pytest.approx(100.0)  # all co-located
    assert truth.interference_pct("j", T0 + 0, T0 + 10) == pytest.approx(0.0)  # alone
    # half the window at half speed: 10 s of time for 7.5 s of solo work
    assert truth.interference_pct("j", T0 + 35, T0 + 45) == pytest.approx((10 / 7.5 - 1) * 100)
    # only the running part of a window counts; a job that did not run has no truth
    assert truth.interference_pct("j", T0 + 95, T0 + 105) == pytest.approx(0.0)
    assert truth.interference_pct("j", T0 + 200, T0 + 210) is None
    assert truth.interference_pct("other", T0, T0 + 10) == pytest.approx(0.0)


def test_truth_matches_the_simulator_inside_its_co_locations() -> None:
    from producers.sim import Simulator

    sim = Simulator(4, seed=2, start_ts=T0, duration_s=600)
    truth = Truth(sim.ground_truth, sim.jobs())
    rows = [r for r in sim.ground_truth if r["end_ts"] - r["start_ts"] >= 10]
    assert rows
    for r in rows:
        assert truth.interference_pct(r["job_id"], r["start_ts"], r["start_ts"] + 10) == pytest.approx(r["interference_pct"])


def _pred(mode: str, value: float, regime: str, window_end: float, model: str = "m") -> SimpleNamespace:
    return SimpleNamespace(
        mode=mode, interference_pct=value, regime=regime, window_end=window_end, job_id="j",
        model=model, category="all", expected_error_pct=1.0, interval_pct=[value - 5.0, value + 5.0],
    )  # fmt: skip


def test_summarize_scores_the_second_half_per_mode_and_regime() -> None:
    truth = _truth()
    preds = [
        _pred("observed", 999.0, "seen", T0 + 10),  # first half: left out
        _pred("observed", 104.0, "seen", T0 + 30),  # truth 100: error 4
        _pred("observed", 90.0, "new", T0 + 40),  # truth 100: error 10
        _pred("placement", 2.0, "seen", T0 + 60, model="b"),  # truth 0: error 2
    ]
    obs = [SimpleNamespace(interference_pct=100.5, window_start=T0 + 20, window_end=T0 + 30, job_id="j")]
    out = summarize(preds, obs, truth, window_s=10.0, since_ts=T0 + 25, max_pct=1000.0)
    o = out["observed"]
    assert o["predictions"] == 2 and o["live_mae_vs_truth"] == pytest.approx(7.0)
    assert o["seen_mae"] == pytest.approx(4.0) and o["new_mae"] == pytest.approx(10.0) and o["seen_share"] == 0.5
    assert o["live_max_abs_error_vs_truth"] == pytest.approx(10.0) and o["out_of_range"] == 0
    assert o["interval_coverage"] == pytest.approx(0.5) and o["interval_width_mean"] == pytest.approx(10.0)  # error 4 in, 10 out
    assert {(s["regime"], s["predictions"]) for s in o["served"]} == {("seen", 1), ("new", 1)}
    assert out["placement"]["served"][0]["model"] == "b"
    assert out["label_mae_vs_truth"] == pytest.approx(0.5) and out["labels"] == 1
    assert floors(out) == {"observed": False, "placement": True}  # observed MAE 7 > 5


# ------------------------------------------------------------------ the scheduler's question
TABLE = {  # steps/s alone and [this, other] next to one other job, in the simulator's Gavel format
    "a": {"solo": 10.0, "pairs": {"b": [5.0, 8.0], "c": [8.0, 4.0]}},
    "b": {"solo": 10.0, "pairs": {"a": [8.0, 5.0], "c": [10.0, 5.0]}},
    "c": {"solo": 10.0, "pairs": {"a": [4.0, 8.0], "b": [5.0, 10.0]}},
}


def test_what_if_truth_of_a_hypothetical_job_set() -> None:
    from aip.bench.truth import what_if_truth

    assert what_if_truth(TABLE, ["a"], "b") == pytest.approx((25.0, 100.0))  # b keeps 8/10, a keeps 5/10
    # three jobs: each keeps the product of its pairwise fractions (c: 0.4 x 0.5, a: 0.5 x 0.8, b: 0.8 x 1.0)
    assert what_if_truth(TABLE, ["a", "b"], "c") == pytest.approx((400.0, 150.0 + 25.0))
    assert what_if_truth(TABLE, ["a"], "z") is None and what_if_truth(TABLE, ["a", "a"], "b") is None  # never co-run


def _wi(job_type: str, newcomer: float, existing: float, interval: list[float] | None = None) -> SimpleNamespace:
    return SimpleNamespace(job_type=job_type, newcomer_pct=newcomer, existing_pct=existing, interval_pct=interval, regime=None)


def _answer(gpu: str, job_set: list[str], window_end: float, what_if: list, mode: str = "placement", **kw) -> SimpleNamespace:
    return SimpleNamespace(gpu_uuid=gpu, job_set=job_set, window_end=window_end, what_if=what_if, mode=mode, **kw)


def test_what_if_scoring_equals_a_hand_computation_on_a_small_fleet() -> None:
    from aip.bench.what_if import MeasuredHistory, entries_of, score, truth_from_table

    t1, t2 = T0 + 100, T0 + 110
    history = MeasuredHistory([
        SimpleNamespace(job_type="a", co_job_types=["b"], interference_pct=90.0, window_end=T0 + 50),  # (a, b) measured
        SimpleNamespace(job_type="c", co_job_types=["a"], interference_pct=140.0, window_end=t1),  # (a, c): at t1, not before
        SimpleNamespace(job_type="b", co_job_types=["c"], interference_pct=None, window_end=T0 + 50),  # no label
        SimpleNamespace(job_type="c", co_job_types=[], interference_pct=None, window_end=T0 + 50, occupancy="solo"),
    ])  # fmt: skip
    gpu3 = [_wi("c", 200.0, 100.0, [100.0, 300.0])]
    predictions = [
        _answer("GPU-1", ["a"], T0 + 10, [_wi("b", 0.0, 0.0)]),  # first half: left out
        _answer("GPU-1", ["a"], t1, [_wi("b", 20.0, 90.0, [10.0, 30.0]), _wi("c", 100.0, 40.0, [110.0, 140.0]),
                                     _wi("z", 1.0, 1.0)], occupancy="solo"),  # z: no truth
        _answer("GPU-2", ["b"], t1, [_wi("a", 90.0, 30.0), _wi("c", 100.0, 0.0, [50.0, 150.0])], occupancy="solo"),
        _answer("GPU-3", ["a", "b"], t1, gpu3),  # job a's prediction ...
        _answer("GPU-3", ["a", "b"], t1, gpu3),  # ... and job b's: the window's entries, counted once
        _answer("GPU-3", ["a", "b"], t1, [], mode="observed"),
        _answer("GPU-1", ["a"], t2, [_wi("c", 10.0, 10.0)], occupancy="solo"),
        _answer("GPU-2", ["b"], t2, [_wi("c", 100.0, 0.0)], occupancy="solo"),
    ]  # fmt: skip
    entries, no_truth = entries_of(predictions, history, truth_from_table(TABLE), since_ts=T0 + 50)
    assert no_truth == 1 and len(entries) == 7
    out = score(entries, no_truth)
    # truths: b+[a] (25, 100); c+[a] (150, 25); a+[b] (100, 25); c+[b] (100, 0); c+[a, b] (400, 175)
    # newcomer errors 5, 50, 10, 0, 200 at t1 and 140, 0 at t2; existing errors 10, 15, 5, 0, 75 and 15, 0
    assert out["entries"] == 7 and out["newcomer_mae"] == pytest.approx(405 / 7, abs=1e-3)
    assert out["existing_mae"] == pytest.approx(120 / 7, abs=1e-3) and out["newcomer_median_abs_error"] == 10.0
    # intervals: [10, 30] holds 25, [110, 140] misses 150, [50, 150] holds 100, [100, 300] misses 400
    assert out["interval_coverage"] == 0.5 and out["intervals"] == 4
    one, two = out["by_running"]["1"], out["by_running"]["2"]
    assert one["all"]["newcomer_mae"] == pytest.approx(205 / 6, abs=1e-3) and one["all"]["existing_mae"] == 7.5
    assert one["all"]["interval_coverage"] == pytest.approx(2 / 3, abs=1e-3)
    # seen: b+[a] and a+[b] at t1 ((a, b) measured before), c+[a] at t2 ((a, c) measured at t1)
    assert one["seen"]["entries"] == 3 and one["seen"]["newcomer_mae"] == pytest.approx(155 / 3, abs=1e-3)
    assert one["new"]["entries"] == 3 and one["new"]["newcomer_mae"] == pytest.approx(50 / 3, abs=1e-3)
    assert two["all"] == two["new"] and two["new"]["newcomer_mae"] == 200.0 and two["new"]["interval_coverage"] == 0.0
    # job sets holding the newcomer's type measured before: b, a at t1 and c at t2 one each; c at t1 none
    m = out["by_measured_job_sets"]
    assert m["0"]["entries"] == 3 and m["0"]["newcomer_mae"] == pytest.approx(250 / 3, abs=1e-3)
    assert m["0"]["interval_coverage"] == pytest.approx(1 / 3, abs=1e-3)
    assert m["1-2"]["entries"] == 4 and m["1-2"]["newcomer_mae"] == 38.75 and m["1-2"]["interval_coverage"] == 1.0
    assert m["3-5"]["entries"] == m["6-10"]["entries"] == m["more"]["entries"] == 0
    # regret: (t1, c) over GPU-1, 2, 3: predicted costs 140, 100, 300 -> GPU-2, truly cheapest (100): regret 0,
    # random (175 + 100 + 575) / 3 - 100; (t2, c): predicted 20 and 100 -> GPU-1 (true 175): regret 75, random 37.5.
    # b and a at t1 were asked of one GPU each: no choice, no question
    assert out["questions"] == 2 and out["regret_pts"] == 37.5
    assert out["random_regret_pts"] == pytest.approx((850 / 3 - 100 + 37.5) / 2, abs=1e-3)
    assert out["regret_ratio"] == pytest.approx(37.5 / ((850 / 3 - 100 + 37.5) / 2), abs=1e-4)
    assert out["regret_without_lone_gpus"]["questions"] == 0  # GPU-3 alone runs two jobs: no choice among such GPUs


def test_an_idle_gpu_takes_part_in_the_regret_only() -> None:
    from aip.bench.what_if import MeasuredHistory, entries_of, score, truth_from_table

    predictions = [
        _answer("GPU-1", ["a"], T0 + 100, [_wi("c", 10.0, 10.0)], occupancy="solo"),  # true cost 175
        _answer("GPU-9", [], T0 + 100, [_wi("c", 0.0, 0.0, [0.0, 0.0])], occupancy="idle"),
    ]
    out = score(entries_of(predictions, MeasuredHistory([]), truth_from_table(TABLE), since_ts=T0)[0])
    assert out["entries"] == 1 and out["idle_entries"] == 1 and out["newcomer_mae"] == 140.0
    assert out["questions"] == 1 and out["regret_pts"] == 0.0 and out["random_regret_pts"] == 87.5  # idle chosen


def test_the_what_if_floor() -> None:
    from aip.bench.accuracy import what_if_floor

    good = {"entries": 10, "interval_coverage": 0.9, "regret_ratio": 0.04,
            "by_running": {"2": {"new": {"newcomer_mae": 24.0}}, "3": {"new": {"newcomer_mae": 59.0}}}}  # fmt: skip
    assert what_if_floor(good)
    assert not what_if_floor({**good, "interval_coverage": 0.97})  # near 0.9, not merely above it
    assert not what_if_floor({**good, "regret_ratio": 0.06})
    assert not what_if_floor({**good, "by_running": {"2": {"new": {"newcomer_mae": 26.0}}}})
    assert not what_if_floor({**good, "entries": 0})


def test_what_if_entries_of_measured_types_and_of_job_sets_a_fleet_would_place_are_reported_apart() -> None:
    from aip.bench.what_if import MeasuredHistory, entries_of, score, truth_from_table

    novel = SimpleNamespace(job_type="c", newcomer_pct=100.0, existing_pct=40.0, interval_pct=[110.0, 140.0], regime="novel")
    predictions = [
        _answer("GPU-1", ["a"], T0 + 100, [_wi("b", 20.0, 90.0, [10.0, 30.0]), novel], occupancy="solo"),
        _answer("GPU-3", ["a", "b"], T0 + 100, [_wi("c", 200.0, 100.0, [100.0, 300.0])]),
    ]
    entries, _ = entries_of(predictions, MeasuredHistory([]), truth_from_table(TABLE), since_ts=T0)
    out = score(entries, placeable=lambda job_set: len(job_set) <= 2)
    # truths: b+[a] 25 (error 5, inside), c+[a] 150 (novel: error 50, outside), c+[a, b] 400 (error 200, outside)
    assert out["entries"] == 3 and out["interval_coverage"] == pytest.approx(1 / 3, abs=1e-3)
    known = out["known_types"]
    assert known["entries"] == 2 and known["newcomer_mae"] == 102.5 and known["interval_coverage"] == 0.5
    split = out["new_by_placeable"]  # the new entries only: the novel one is in neither
    assert split["1"]["placeable"]["entries"] == 1 and split["1"]["placeable"]["newcomer_mae"] == 5.0
    assert split["1"]["never_placed"]["entries"] == 0
    assert split["2"]["placeable"]["entries"] == 0 and split["2"]["never_placed"]["newcomer_mae"] == 200.0
    assert "new_by_placeable" not in score(entries)  # reported only where the bench can say what a fleet places


def _novel(job_type: str, newcomer: float, existing: float, interval: list[float]) -> SimpleNamespace:
    return SimpleNamespace(job_type=job_type, newcomer_pct=newcomer, existing_pct=existing, interval_pct=interval, regime="novel")


def test_the_regret_is_of_the_gpu_the_scheduler_client_would_choose() -> None:
    from aip.bench.what_if import MeasuredHistory, entries_of, score, truth_from_table

    t = T0 + 100
    predictions = [
        # question c: GPU-1 (true c+[a] 150 + 25) novel, expected 10 + 10, upper end 120; GPU-2 (true c+[b] 100 + 0) 100 + 0
        _answer("GPU-1", ["a"], t, [_novel("c", 10.0, 10.0, [0.0, 120.0])], occupancy="solo"),
        _answer("GPU-2", ["b"], t, [_wi("c", 100.0, 0.0, [50.0, 150.0]), _novel("a", 50.0, 50.0, [0.0, 100.0])],
                occupancy="solo"),
        # question a, every answer novel: GPU-2 (true a+[b] 100 + 25) expected 50 + 50, upper end 100;
        # GPU-3 (true a+[b, c] 150 + 425) expected 0 + 0, upper end 80
        _answer("GPU-3", ["b", "c"], t, [_novel("a", 0.0, 0.0, [0.0, 80.0])]),
    ]  # fmt: skip
    entries, _ = entries_of(predictions, MeasuredHistory([]), truth_from_table(TABLE), since_ts=T0)
    out = score(entries)
    rules = out["regret_by_novel_risk"]
    random_pts = ((175 + 100) / 2 - 100 + (125 + 575) / 2 - 125) / 2
    # expected costs: c -> GPU-1 (20 < 100, regret 75); a -> GPU-3 (0 < 100, regret 450)
    assert rules["expected"]["regret_pts"] == (75 + 450) / 2 and rules["expected"]["random_regret_pts"] == random_pts
    # the client's default (novel at the upper end, each job running at the same margin): c -> GPU-2 (120 + 10 + 110
    # > 100, regret 0); a -> GPU-2 (100 + 50 + 50 < 80 + 0 + 2 x 80; the newcomer's upper end alone, 150 > 80, chose
    # GPU-3, regret 450)
    assert out["novel_risk"] == "upper" and out["regret_pts"] == rules["upper"]["regret_pts"] == 0.0
    # withheld: c -> GPU-2, the only known cost; a -> every answer withheld, by load: GPU-2 (one job running)
    assert rules["withhold"]["regret_pts"] == 0.0
    assert score(entries, novel_risk="withhold")["regret_pts"] == 0.0

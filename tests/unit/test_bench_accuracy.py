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

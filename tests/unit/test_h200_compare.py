"""scripts/h200_compare.py: pairs of two runs side by side, triples against what their pairs compose to."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200_compare.py"
spec = importlib.util.spec_from_file_location("h200_compare", SCRIPT)
assert spec is not None and spec.loader is not None
h200_compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(h200_compare)


def rows(windows: dict[tuple[str, str], list[float]], solo: dict[str, float]) -> pd.DataFrame:
    """Observation rows: (job, co-runners joined by ';') -> the window rates; throughput from the solo and rate."""
    out = []
    for (job, co), rates in windows.items():
        for rate in rates:
            out.append(
                {
                    "job_type": job,
                    "co_job_types": co,
                    "interference_pct": rate,
                    "throughput_steps_per_s": solo[job] / (1 + rate / 100),
                    "solo_throughput": solo[job],
                    "solo_S": solo[job] / 2,
                }
            )
    return pd.DataFrame(out)


SOLO = {"a": 100.0, "b": 50.0, "c": 10.0}


def test_triples_are_set_against_the_composition_of_their_pairs() -> None:
    second = rows(
        {("a", "b"): [90.0, 110.0], ("b", "a"): [20.0, 20.0], ("a", "c"): [50.0, 50.0], ("a", "b;c"): [150.0, 150.0]},
        SOLO,
    )
    j2 = h200_compare.per_job(second)
    c = h200_compare.composed(j2, h200_compare.pair_rates(j2))
    assert len(c) == 1 and c.iloc[0]["job_type"] == "a"
    # next to b alone 100 %, next to c alone 50 %: composed (2 * 1.5 - 1) 200 %, summed 150 %
    assert c.iloc[0]["measured_pct"] == pytest.approx(150.0)
    assert c.iloc[0]["composed_pct"] == pytest.approx(200.0) and c.iloc[0]["additive_pct"] == pytest.approx(150.0)
    md, stats = h200_compare.triple_table(j2, j2)
    assert "| a + b + c | a | 150.0 | 200.0 | +50.0 | 150.0 | 200.0 |" in md
    assert stats["mae"] == pytest.approx(50.0) and stats["mae_additive"] == pytest.approx(0.0)
    b_only = h200_compare.per_job(second[second["job_type"] == "b"])
    assert h200_compare.composed(j2, h200_compare.pair_rates(b_only))["composed_pct"].isna().all()  # a pair missing


def test_pairs_of_both_runs_side_by_side_with_the_window_spread() -> None:
    first = rows({("a", "b"): [100.0, 100.0], ("b", "a"): [40.0, 60.0], ("a", "c"): [10.0, 10.0]}, SOLO)
    second = rows({("a", "b"): [80.0, 80.0], ("b", "a"): [50.0, 50.0]}, {**SOLO, "a": 90.0})
    md, stats = h200_compare.pair_table(h200_compare.per_job(first), h200_compare.per_job(second))
    assert md.count("\n") == 3  # header, rule, a and b of the one shared pair
    assert "| a + b | b | 50.0 (40.0-60.0) | 50.0 (50.0-50.0) | +0.0 |" in md
    assert stats["pairs"] == 1 and stats["between_runs_mae"] == pytest.approx(10.0)
    assert stats["within_run_window_spread_mean"] == pytest.approx(5.0)  # 0 and 20 in the first run, 0 and 0
    assert "| a | 100.0 | 90.0 | -10.0 | 50.0 | 45.0 |" in h200_compare.solo_table(first, second)


def test_the_shipped_runs_compare_on_their_six_shared_pairs_and_three_triples(capsys) -> None:  # type: ignore[no-untyped-def]
    assert h200_compare.main([]) == 0
    out = capsys.readouterr().out
    assert "6 pairs, 12 jobs" in out and "9 jobs: MAE" in out and "nan" not in out

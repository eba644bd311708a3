"""The two H200 runs side by side, and the second run's triples against what their pairs compose to.

Reads two observations CSVs (docs/ARCHITECTURE.md, "Dataset formats"; default: the shipped ``h200`` and
``h200-triples``) and prints markdown:

- each job's solo throughput and SM utilisation in both runs (the stage-1 solo profile, ``solo_throughput``, ``solo_S``);
- each pair measured in both runs, per job: the mean interference rate and co-located throughput in each run,
  and how far the two windows of one run lie apart next to how far the two runs do;
- each job of each job set of 3+ in the second run: its measured mean rate against ``models.compose.compose_pct``
  of its mean rates next to each co-runner alone, from the second run's pairs (and, for comparison, the first's).

    python scripts/h200_compare.py [--first CSV] [--second CSV]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.compose import compose_pct
from models.datasets import BUILTIN


def job_set(df: pd.DataFrame) -> pd.Series:
    """Each row's unordered job set: its job and its co-runners (``co_job_types`` joined by ``;``)."""
    return df.apply(lambda r: frozenset((r["job_type"], *str(r["co_job_types"]).split(";"))), axis=1)


def per_job(df: pd.DataFrame) -> pd.DataFrame:
    """Per (job set, job): windows, mean rate, mean co-located steps/s, and the spread of the window rates."""
    d = df.assign(job_set=job_set(df))
    g = d.groupby(["job_set", "job_type"])
    out = g.agg(
        windows=("interference_pct", "size"),
        rate_pct=("interference_pct", "mean"),
        steps_per_s=("throughput_steps_per_s", "mean"),
        rate_min_pct=("interference_pct", "min"),
        rate_max_pct=("interference_pct", "max"),
    )
    return out.reset_index()


def solo_profiles(df: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """Each job type's solo throughput (steps/s) and SM utilisation (%, ``solo_S``) as the run's stage 1 profiled
    them (one value per job type)."""
    m = df.groupby("job_type")[["solo_throughput", "solo_S"]].mean()
    return {str(job): (float(r["solo_throughput"]), float(r["solo_S"])) for job, r in m.iterrows()}


def pair_rates(jobs: pd.DataFrame) -> dict[tuple[str, str], float]:
    """(job, co-runner) -> the job's mean rate next to that co-runner alone."""
    pairs = jobs[jobs["job_set"].map(len) == 2]
    return {(r.job_type, next(iter(r.job_set - {r.job_type}))): r.rate_pct for r in pairs.itertuples()}


def composed(jobs: pd.DataFrame, rates: dict[tuple[str, str], float]) -> pd.DataFrame:
    """Each job of each job set of 3+: measured mean rate, the composition of its pairs' rates and, for
    comparison, their sum (time slices added: ``1 + sum(s)``, not multiplied); NaN where a pair was not measured."""
    rows = []
    for r in jobs[jobs["job_set"].map(len) >= 3].itertuples():
        pcts = [rates.get((r.job_type, co)) for co in sorted(r.job_set - {r.job_type})]
        known = [p for p in pcts if p is not None]
        whole = len(known) == len(pcts)
        rows.append(
            {
                "job_set": r.job_set,
                "job_type": r.job_type,
                "measured_pct": r.rate_pct,
                "composed_pct": compose_pct(known) if whole else float("nan"),
                "additive_pct": sum(known) if whole else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def name(s: frozenset[str]) -> str:
    return " + ".join(sorted(s))


def markdown(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)])


def solo_table(first: pd.DataFrame, second: pd.DataFrame) -> str:
    a, b = solo_profiles(first), solo_profiles(second)
    rows = []
    for job in sorted(a.keys() & b.keys()):
        (t1, s1), (t2, s2) = a[job], b[job]
        rows.append([job, f"{t1:.1f}", f"{t2:.1f}", f"{(t2 / t1 - 1) * 100:+.1f}", f"{s1:.1f}", f"{s2:.1f}"])
    head = ["job", "first run steps/s", "second run steps/s", "change %", "first run SM %", "second run SM %"]
    return markdown(head, rows)


def pair_table(j1: pd.DataFrame, j2: pd.DataFrame) -> tuple[str, dict[str, float]]:
    """The pairs measured in both runs, per job, and the mean absolute differences summarising them."""
    m = j1.merge(j2, on=["job_set", "job_type"], suffixes=("_1", "_2"))
    m = m[m["job_set"].map(len) == 2]
    m = m.assign(set_name=m["job_set"].map(name)).sort_values(["set_name", "job_type"])
    head = ["pair", "job", "first run rate % (windows)", "second run rate % (windows)", "second - first (points)",
            "first run co-located steps/s", "second run co-located steps/s"]  # fmt: skip
    rows = [
        [r.set_name, r.job_type, f"{r.rate_pct_1:.1f} ({r.rate_min_pct_1:.1f}-{r.rate_max_pct_1:.1f})",
         f"{r.rate_pct_2:.1f} ({r.rate_min_pct_2:.1f}-{r.rate_max_pct_2:.1f})", f"{r.rate_pct_2 - r.rate_pct_1:+.1f}",
         f"{r.steps_per_s_1:.1f}", f"{r.steps_per_s_2:.1f}"]
        for r in m.itertuples()
    ]  # fmt: skip
    diff = (m["rate_pct_2"] - m["rate_pct_1"]).abs()
    within = pd.concat([m["rate_max_pct_1"] - m["rate_min_pct_1"], m["rate_max_pct_2"] - m["rate_min_pct_2"]])
    stats = {
        "pairs": float(m["job_set"].nunique()),
        "jobs": float(len(m)),
        "between_runs_mae": float(diff.mean()),
        "between_runs_max": float(diff.max()),
        "within_run_window_spread_mean": float(within.mean()),
        "co_located_steps_change_pct_mean": float(((m["steps_per_s_2"] / m["steps_per_s_1"] - 1) * 100).mean()),
    }
    return markdown(head, rows), stats


def triple_table(j2: pd.DataFrame, j1: pd.DataFrame) -> tuple[str, dict[str, float]]:
    c = composed(j2, pair_rates(j2))
    c["composed_first_pct"] = composed(j2, pair_rates(j1))["composed_pct"]
    c = c.assign(set_name=c["job_set"].map(name)).sort_values(["set_name", "job_type"])
    head = ["job set", "job", "measured %", "composed %", "error (points)", "sum of the pair rates %",
            "composed from the first run's pairs %"]  # fmt: skip
    rows = [
        [r.set_name, r.job_type, f"{r.measured_pct:.1f}", f"{r.composed_pct:.1f}", f"{r.composed_pct - r.measured_pct:+.1f}",
         f"{r.additive_pct:.1f}", f"{r.composed_first_pct:.1f}"]
        for r in c.itertuples()
    ]  # fmt: skip
    err = c["composed_pct"] - c["measured_pct"]
    err1 = c["composed_first_pct"] - c["measured_pct"]
    stats = {
        "jobs": float(len(c)),
        "mae": float(err.abs().mean()),
        "mean_error": float(err.mean()),
        "relative_mae": float((err.abs() / (100.0 + c["measured_pct"])).mean()),
        "mae_first_run_pairs": float(err1.abs().mean()),
        "mae_additive": float((c["additive_pct"] - c["measured_pct"]).abs().mean()),
    }
    return markdown(head, rows), stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--first", type=Path, default=BUILTIN["h200"], help="the first run's observations CSV")
    ap.add_argument("--second", type=Path, default=BUILTIN["h200-triples"], help="the second run's (with triples)")
    args = ap.parse_args(argv)
    first, second = pd.read_csv(args.first), pd.read_csv(args.second)
    j1, j2 = per_job(first), per_job(second)
    print("Solo throughput and SM utilisation (stage-1 solo profile):\n\n" + solo_table(first, second) + "\n")
    md, s = pair_table(j1, j2)
    print("Pairs measured in both runs (interference rate: mean of the windows, their range in brackets):\n\n" + md)
    print(
        f"\n{s['pairs']:.0f} pairs, {s['jobs']:.0f} jobs: runs differ by {s['between_runs_mae']:.1f} points on average "
        f"(at most {s['between_runs_max']:.1f}); the two windows of one run by {s['within_run_window_spread_mean']:.1f}; "
        f"co-located throughput changed by {s['co_located_steps_change_pct_mean']:+.1f} % on average.\n"
    )
    md, t = triple_table(j2, j1)
    print("Triples of the second run against the composition of its pairs (`models.compose.compose_pct`):\n\n" + md)
    print(
        f"\n{t['jobs']:.0f} jobs: MAE {t['mae']:.1f} points (mean error {t['mean_error']:+.1f}; relative to the "
        f"measured slowdown factor {t['relative_mae']:.3f}); composed from the first run's pairs instead: "
        f"MAE {t['mae_first_run_pairs']:.1f}; the sum of the second run's pair rates: MAE {t['mae_additive']:.1f}."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

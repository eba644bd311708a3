"""Offline profile of predictions for job sets never measured (no broker, no worker): the accuracy bench's fleet
(16 v100 GPUs, seed 3) chopped into 10 s windows, learned in time order by one EnvironmentModels (refits run
synchronously when due), and in the second half every window's placement predictions of co-located jobs and the
what-if entries of each GPU's running set scored against the simulator's truth.

    python scripts/whatif_offline.py [--quick] [--every N] [--json] [--fixed-refits] [--model-seed S]

``live_mae`` / ``seen_mae`` / ``new_mae`` (and ``*_share``, ``predictions``): the running jobs' placement predictions
of every co-located window of the second half, by the prediction's regime, as ``aip bench accuracy`` reports
them; the ``pred_*`` keys are of every Nth window.  ``--fixed-refits``: no drift-triggered refits, so runs that
differ in the models refit at the same observations; ``--model-seed``: the models' seed.  ``new_by_truth`` /
``new_by_model``: the new regime's running predictions by true slowdown and by the model served (count, MAE, mean
predicted - true, share of the regime's summed error); ``--dump-predictions FILE``: those predictions, one a row.
``what_if_all`` / ``what_if_by_regime`` / ``what_if_by_running_regime``: (entries, newcomer MAE, median error,
coverage of the bounded intervals, share of the unbounded ones, ``[lo, null]``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aip.bench.truth import what_if_truth
from events import Observation
from models.environment import EnvironmentModels
from placement.experiment import Truth
from producers import calibration as cal
from producers.sim import Simulator

WINDOW_S = 10.0


def covers(interval: list, truth: float) -> bool:
    """Whether ``interval`` (an upper end None: unbounded) holds ``truth``."""
    return interval[0] <= truth and (interval[1] is None or truth <= interval[1])


def windows(sim: Simulator) -> list[tuple[float, str, list[tuple[str, str]]]]:
    """(window end, gpu, [(job id, type)] active the whole window) for every 10 s window of every GPU."""
    out = []
    n = int(sim.ticks // WINDOW_S)
    for gpu in sim.gpus:
        for w in range(n):
            lo, hi = w * WINDOW_S, (w + 1) * WINDOW_S
            active = [(j.job_id, j.job_type) for j in gpu.jobs if j.start_k <= lo and j.end_k >= hi]
            out.append((sim.start_ts + hi, gpu.uuid, active))
    out.sort(key=lambda r: (r[0], r[1]))
    return out


def labelled(sim: Simulator, truth: Truth, rng: random.Random, gpu: str, end: float, active: list[tuple[str, str]]) -> list[Observation]:
    """The observations of one co-located window: each job's slowdown from the simulator's calibration, with the
    bench fleet's 0.2 % label noise."""
    obs = []
    for i, (jid, t) in enumerate(active):
        co = [o for k2, o in enumerate(active) if k2 != i]
        frac = cal.speed_fraction(sim.table, t, [c for _, c in co]) or 1.0
        y = cal.interference_pct(1.0, frac * (1.0 + rng.gauss(0.0, 0.002)))
        obs.append(Observation(window_start=end - WINDOW_S, window_end=end, gpu_uuid=gpu, environment="v100",
                               job_id=jid, job_type=t, co_job_types=[c for _, c in co], co_job_ids=[c for c, _ in co],
                               solo=truth.solo(t), co_solo=[truth.solo(c) for _, c in co], interference_pct=y))
    return obs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--every", type=int, default=1, help="score every Nth window of the second half")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dump", help="write every scored what-if row to this JSON file")
    ap.add_argument("--dump-predictions", help="write the running jobs' scored predictions (regime, type, co-runners, truth, "
                    "predicted, model, job set measured) to this JSON file")
    ap.add_argument("--model-seed", type=int, default=0, help="the models' seed (EnvironmentModels)")
    ap.add_argument("--refit-lag", type=int, default=0,
                    help="apply a refit's result only after this many more observations were learned (a live worker's refit"
                    " takes wall time: at 40x it is about 84 observations of this fleet per wall second); 0: at once")
    ap.add_argument("--fixed-refits", action="store_true", help="no drift-triggered refits (the same refit times in every run)")
    args = ap.parse_args()
    duration = 1800.0 if args.quick else 3000.0
    sim = Simulator(16, seed=3, start_ts=1.0e9, duration_s=duration)
    truth = Truth("v100")
    rng = random.Random(0)
    models = EnvironmentModels("v100", seed=args.model_seed)
    half = sim.start_ts + duration / 2
    types = sorted(sim.table)
    measured: set[tuple[str, ...]] = set()
    pred_rows: list[tuple[str, int, float, float]] = []  # regime, co-runners, truth, predicted (every Nth window)
    bench_rows: list[tuple[str, int, float, float]] = []  # the same, every co-located window of the second half
    bench_detail: list[dict] = []  # bench_rows with the job, its co-runners and the model served (--dump-predictions)
    wi_rows: list[dict] = []
    t0 = time.monotonic()
    wins = windows(sim)
    k = 0
    ran: set[str] = set()  # job types seen running so far (stage 2's known types: solo profiles of every window)
    pending = None  # (observations at which to apply, the refit task, observations when due) with --refit-lag
    refit_log: list[tuple[int, int, float]] = []  # (observations when due, when applied, seconds it took)
    for end, gpu, active in wins:
        ran.update(t for _, t in active)
        if len(active) >= 2 and end > half:
            k += 1
            score = k % args.every == 0
        else:
            score = False
        if end > half and not active and k % args.every == 0:
            for t in types:
                wi_rows.append({"running": 0, "newcomer": t, "set": [t], "truth": 0.0, "existing_truth": 0.0, "measured": True,
                                "pred": 0.0, "existing": 0.0, "model": "idle", "regime": "idle", "interval": [0.0, 0.0],
                                "end": end, "gpu": gpu})
        if end > half and active and (score or len(active) == 1) and (k % args.every == 0):
            running = [t for _, t in active]
            from streams.whatif import what_if_entries

            known = {t: truth.solo(t) for t in types if t in ran or t in models.measurements.types}
            got = {w.job_type: w for w in what_if_entries(models, known, running, [truth.solo(r) for r in running])}
            for t in types:
                w = got.get(t)
                tr = what_if_truth(sim.table, running, t)
                if tr is None:
                    continue
                key = tuple(sorted([*running, t]))
                row = {"running": len(running), "newcomer": t, "set": list(key), "truth": tr[0], "existing_truth": tr[1],
                       "measured": key in measured, "pred": None if w is None else w.newcomer_pct,
                       "existing": None if w is None else w.existing_pct, "model": None,
                       "regime": None if w is None else w.regime, "interval": None if w is None else w.interval_pct,
                       "end": end, "gpu": gpu}
                wi_rows.append(row)
        if len(active) >= 2:
            obs = labelled(sim, truth, rng, gpu, end, active)
            if end > half:  # every window's running jobs, as the bench scores them (not only every Nth)
                for o in obs:
                    r = models.predict(o, "placement")
                    if r is not None:
                        row = (r.regime or "seen", len(o.co_job_types), float(o.interference_pct), r.interference_pct)
                        bench_rows.append(row)
                        bench_detail.append({"regime": row[0], "job": o.job_type, "co": list(o.co_job_types), "truth": row[2],
                                             "pred": row[3], "model": r.model, "end": end})
                        if score:
                            pred_rows.append(row)
            for o in obs:
                models.learn(o)
            measured.add(tuple(sorted(t for _, t in active)))
            if args.fixed_refits:
                models.drift.detected = False  # refit every Config.refit_every observations only: the same refit times for any weighting
            if pending is not None and models.observations >= pending[0]:
                models.apply_refit(pending[1]())
                refit_log.append((pending[2], models.observations, models.refit_seconds))
                pending = None
            if pending is None and models.refit_due():
                pending = (models.observations + args.refit_lag, models.refit_task(), models.observations)
                if not args.refit_lag:
                    models.apply_refit(pending[1]())
                    refit_log.append((pending[2], models.observations, models.refit_seconds))
                    pending = None
    if args.dump:
        Path(args.dump).write_text(json.dumps(wi_rows))
    if args.dump_predictions:
        Path(args.dump_predictions).write_text(json.dumps(bench_detail))
    out: dict = {"seconds": round(time.monotonic() - t0, 1), "observations": models.observations, "refits": models.refits,
                 "refit_log": [[due, applied, round(s, 2)] for due, applied, s in refit_log]}
    for regime in ("seen", "new", "novel"):
        for nco in (1, 2):
            e = [abs(t - p) for g, c, t, p in pred_rows if g == regime and c == nco]
            out[f"pred_{regime}_{nco}co"] = (len(e), round(statistics.mean(e), 2) if e else None)
    e = [abs(t - p) for _, _, t, p in pred_rows]
    out["pred_all"] = (len(e), round(statistics.mean(e), 3) if e else None)
    # as aip/bench/accuracy.py reports the running jobs' placement predictions of every co-located window of the
    # second half (not only every Nth): live_mae_vs_truth, and seen_mae / new_mae by the prediction's regime
    e = [abs(t - p) for _, _, t, p in bench_rows]
    out["predictions"] = len(e)
    out["live_mae"] = round(statistics.mean(e), 3) if e else None
    for regime in ("seen", "new"):
        e = [abs(t - p) for g, _, t, p in bench_rows if g == regime]
        out[f"{regime}_share"] = round(len(e) / len(bench_rows), 3) if bench_rows else None
        out[f"{regime}_mae"] = round(statistics.mean(e), 3) if e else None
    # where new_mae comes from: the new regime's running predictions by true slowdown and by the model served
    # (count, MAE, mean signed error predicted - true, share of the new regime's summed error)
    new_rows = [r for r in bench_detail if r["regime"] == "new"]
    new_total = sum(abs(r["pred"] - r["truth"]) for r in new_rows) or 1.0

    def part(rs: list[dict]) -> tuple:
        e = [abs(r["pred"] - r["truth"]) for r in rs]
        return (len(e), round(statistics.mean(e), 1), round(statistics.mean(r["pred"] - r["truth"] for r in rs), 1),
                round(sum(e) / new_total, 3))

    bins = (50.0, 100.0, 200.0, 400.0, float("inf"))
    by_truth: dict[str, list[dict]] = defaultdict(list)
    by_model: dict[str, list[dict]] = defaultdict(list)
    for r in new_rows:
        by_truth[f"<{next(b for b in bins if r['truth'] < b):g}"].append(r)
        by_model[str(r["model"]).split("/")[0]].append(r)
    out["new_by_truth"] = {k: part(v) for k, v in sorted(by_truth.items(), key=lambda kv: float(kv[0][1:]))}
    out["new_by_model"] = {k: part(v) for k, v in sorted(by_model.items())}
    by = defaultdict(list)
    cov = defaultdict(list)
    for r in wi_rows:
        if r["pred"] is None or r["running"] == 0:
            continue
        g = "seen" if r["measured"] else "new"
        by[(r["running"], g)].append(abs(r["pred"] - r["truth"]))
        if r["interval"]:
            cov[(r["running"], g)].append(covers(r["interval"], r["truth"]))
    out["what_if"] = {f"{n}:{g}": (len(v), round(statistics.mean(v), 1), round(statistics.median(v), 1),
                                   round(statistics.mean(cov[(n, g)]), 3) if cov[(n, g)] else None)
                      for (n, g), v in sorted(by.items())}
    # as the bench reports them: by the entry's own regime (seen / new / novel), and by jobs running x regime
    def cell(rs: list[dict]) -> tuple:
        e = [abs(r["pred"] - r["truth"]) for r in rs]
        c = [covers(r["interval"], r["truth"]) for r in rs if r["interval"] and r["interval"][1] is not None]
        u = [r for r in rs if r["interval"] and r["interval"][1] is None]
        return (len(e), round(statistics.mean(e), 1) if e else None, round(statistics.median(e), 1) if e else None,
                round(statistics.mean(c), 3) if c else None, round(len(u) / len(rs), 3) if rs else None)

    scored = [r for r in wi_rows if r["pred"] is not None and r["running"]]
    out["what_if_all"] = cell(scored)
    out["what_if_by_regime"] = {g: cell([r for r in scored if r["regime"] == g]) for g in sorted({r["regime"] for r in scored})}
    out["what_if_by_running_regime"] = {f"{n}:{g}": cell([r for r in scored if r["running"] == n and r["regime"] == g])
                                        for n, g in sorted({(r["running"], r["regime"]) for r in scored})}
    # the new regime's entries (the models' own: types all measured, this job set never), apart for job sets the simulator would place (Truth.fits: at most 3 jobs, memory, every job at 0.2 of
    # solo speed or more) and those no fleet of it ever runs
    split: dict = defaultdict(list)
    for r in wi_rows:
        if r["pred"] is not None and r["running"] and r["regime"] == "new":
            split[(r["running"], truth.fits(r["set"]))].append(abs(r["pred"] - r["truth"]))
    out["what_if_new_by_placeable"] = {
        f"{n}:{'placeable' if fits else 'never_placed'}": (len(v), round(statistics.mean(v), 1), round(statistics.median(v), 1))
        for (n, fits), v in sorted(split.items())
    }
    qs: dict = defaultdict(list)
    for r in wi_rows:
        if r["pred"] is not None:
            qs[(r["end"], r["newcomer"])].append(r)
    chosen, rand = [], []
    cost = lambda n, e: max(0.0, n) + max(0.0, e)  # noqa: E731
    for ans in qs.values():
        if len(ans) < 2:
            continue
        best = min(cost(a["truth"], a["existing_truth"]) for a in ans)
        pick = min(ans, key=lambda a: (cost(a["pred"], a["existing"]), a["gpu"]))
        chosen.append(cost(pick["truth"], pick["existing_truth"]) - best)
        rand.append(statistics.mean(cost(a["truth"], a["existing_truth"]) for a in ans) - best)
    out["regret"] = (len(chosen), round(statistics.mean(chosen), 2), round(statistics.mean(rand), 2),
                     round(statistics.mean(chosen) / statistics.mean(rand), 4))
    out["served"] = [(s.mode, s.regime, s.model, s.category, None if s.error_pct is None else round(s.error_pct, 2)) for s in models.served()]
    board = sorted(((c.record.errors["new"].get() or 1e9, k.mode, k.category, k.model) for k, c in models.candidates.items()
                    if c.record.errors["new"].get() is not None and k.category == "all"))
    out["new_board"] = [(round(e, 2), m, c, n) for e, m, c, n in board[:8]] + [
        (round(e, 2), m, c, n) for e, m, c, n in board if n == "Newcomer"]
    out["compose_scores"] = {str(k): (v.n, round(v.composed_abs, 1), round(v.served_abs, 1)) for k, v in models.compose_scores.items()}
    sr = sorted(models.seen_residuals.values)
    out["seen_residuals"] = (len(sr), [round(sr[int(q * (len(sr) - 1))], 4) for q in (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)] if sr else None)
    nr = sorted(models.novel_residuals.values)
    out["novel_residuals"] = (len(nr), [round(nr[int(q * (len(nr) - 1))], 3) for q in (0.0, 0.05, 0.5, 0.95, 1.0)] if nr else None,
                              models.novel_residuals.offsets())
    print(json.dumps(out, indent=None if args.json else 1))


if __name__ == "__main__":
    main()

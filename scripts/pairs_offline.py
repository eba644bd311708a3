"""Offline study of the pairs never measured: the accuracy bench's fleet (``whatif_offline.py``'s
replay: 16 v100 GPUs, seed 3, 10 s windows, one EnvironmentModels, synchronous refits); at checkpoints of the
second half, every ordered pair (victim, aggressor) of types measured here whose job set was never measured is
predicted by what is served (``predict_placement``) and by the pair models studied here, from the labelled rows
so far, and scored against the simulator's truth.

    python scripts/pairs_offline.py [--quick] [--dump FILE]   # replay and dump
    python scripts/pairs_offline.py --load FILE [--markdown]  # score the ideas on a dump (seconds)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from whatif_offline import labelled, windows

from aip.bench.truth import what_if_truth
from models.datasets import Sample
from models.environment import EnvironmentModels
from models.views import Views
from placement.experiment import Truth
from producers.sim import Simulator


def replay(quick: bool, checkpoints: int) -> list[dict]:
    duration = 1800.0 if quick else 3000.0
    sim = Simulator(16, seed=3, start_ts=1.0e9, duration_s=duration)
    truth = Truth("v100")
    rng = random.Random(0)
    models = EnvironmentModels("v100", seed=0)
    types = sorted(sim.table)
    marks = [sim.start_ts + duration * (0.5 + 0.5 * (i + 1) / checkpoints) for i in range(checkpoints)]
    out: list[dict] = []
    rows: list[tuple[str, list[str], float]] = []
    firsts: list[tuple[str, list[str], float, float | None, float]] = []  # first observations: job, co, y, served, time
    seen_sets: set[tuple[str, ...]] = set()
    for end, gpu, active in windows(sim):
        while marks and end >= marks[0]:
            marks.pop(0)
            measured = {tuple(sorted([s.job_type, *s.co_job_types])) for s in models.history}
            known = sorted(models.measurements.types)
            asks, keys = [], []
            for v in known:
                for a in known:
                    if tuple(sorted((v, a))) in measured:
                        continue
                    tr = what_if_truth(sim.table, [a], v)
                    if tr is None:
                        continue
                    asks.append((v, truth.solo(v), [a], [truth.solo(a)]))
                    keys.append((v, a, tr[0]))
            served = models.predict_placements(asks)
            m = models.measurements
            bounds, (m.lo, m.hi) = (m.lo, m.hi), (-math.inf, math.inf)
            raw = models.predict_placements(asks)  # not bounded to the range measured
            m.lo, m.hi = bounds
            views = [Views(Sample(v, (a,), math.nan, "", "v100", {}, dict(sv), (dict(sa),))) for v, sv, (a,), (sa,) in asks]
            by_candidate = {}
            for key, c in models.candidates.items():
                if key.mode != "placement" or not c.servable or c.kind == "baseline":
                    continue
                xs = [c.features(w) for w in views]
                by_candidate[f"{key.category}:{key.model}"] = [None if not x else c.predict_one(x) for x in xs]
            out.append({
                "end": end, "rows": list(rows), "firsts": list(firsts),
                "cv": {f"{k.category}:{k.model}": c.record.cv.mae for k, c in models.candidates.items()
                       if k.mode == "placement" and c.record.cv is not None and c.servable}, "solo": {t: truth.solo(t) for t in types},
                "pairs": [{"v": v, "a": a, "truth": t, "served": None if r is None else r.interference_pct,
                           "model": None if r is None else r.model, "regime": None if r is None else r.regime,
                           "raw": None if q is None else q.interference_pct,
                           "candidates": {n: ps[i] for n, ps in by_candidate.items()}}
                          for i, ((v, a, t), r, q) in enumerate(zip(keys, served, raw, strict=True))],
            })
            print(f"checkpoint {end - sim.start_ts:.0f} s: {len(rows)} rows, {len(keys)} unmeasured pairs", file=sys.stderr)
        if len(active) >= 2:
            key = tuple(sorted(t for _, t in active))
            obs = labelled(sim, truth, rng, gpu, end, active)
            if key not in seen_sets:
                seen_sets.add(key)
                for o in obs:
                    r = models.predict(o, "placement")
                    assert o.interference_pct is not None
                    firsts.append((o.job_type, list(o.co_job_types), o.interference_pct, None if r is None else r.interference_pct, end))
            for o in obs:
                models.learn(o)
                assert o.interference_pct is not None
                rows.append((o.job_type, list(o.co_job_types), o.interference_pct))
            if models.refit_due():
                models.refit_now()
    return out



# ---------------------------------------------------------------------------------------- the ideas scored on a dump
KEYS = ("E", "S", "V", "R", "W", "M", "throughput")
BINS = ((-math.inf, 50.0), (50.0, 100.0), (100.0, 200.0), (200.0, 400.0), (400.0, math.inf))


def log_pct(y: float) -> float:
    return 100.0 * math.log(max(1e-3, 1.0 + y / 100.0))


def pct(log: float) -> float:
    return (math.exp(min(log, 1e4) / 100.0) - 1.0) * 100.0


def profiles(solo: dict, types: list[str]) -> dict[str, np.ndarray]:
    """Standardised log solo profiles (side information)."""
    x = np.array([[math.log1p(max(0.0, solo[t][k] or 0.0)) for k in KEYS] for t in types])
    x = (x - x.mean(0)) / (x.std(0) + 1e-9)
    return {t: x[i] for i, t in enumerate(types)}


def biased_mf(rows: list, types: list[str], reg: float = 1.0, rank: int = 0, reg_f: float = 5.0, sweeps: int = 20):
    """Log-speed slowdown of v next to co-runners A as ``sum over a of (mu + bv[v] + ba[a] + p_v . q_a)`` (the
    composition of pairs, additive in log speed), ridge biases then ALS factors; rows averaged per job set."""
    idx = {t: i for i, t in enumerate(types)}
    n = len(types)
    agg: dict = {}
    for v, co, y in rows:
        agg.setdefault((v, tuple(sorted(co))), []).append(log_pct(y))
    keys = list(agg)
    yv = np.array([statistics.mean(agg[k]) for k in keys])
    x = np.zeros((len(keys), 1 + 2 * n))
    for r, (v, co) in enumerate(keys):
        x[r, 0] = x[r, 1 + idx[v]] = len(co)
        for a in co:
            x[r, 1 + n + idx[a]] += 1
    ridge = reg * np.eye(1 + 2 * n)
    ridge[0, 0] = 1e-6
    w = np.linalg.solve(x.T @ x + ridge, x.T @ yv)
    res = yv - x @ w
    p, q = np.random.default_rng(0).normal(0, 0.1, (n, rank)), np.random.default_rng(1).normal(0, 0.1, (n, rank))
    for _ in range(sweeps if rank else 0):
        for solve_p in (True, False):
            gram = [reg_f * np.eye(rank) for _ in range(n)]
            rhs = [np.zeros(rank) for _ in range(n)]
            for r, (v, co) in enumerate(keys):
                if solve_p:
                    z = sum(q[idx[a]] for a in co)
                    gram[idx[v]] += np.outer(z, z)
                    rhs[idx[v]] += res[r] * z
                else:
                    for a in co:
                        other = sum(p[idx[v]] @ q[idx[c]] for c in co if c != a)
                        gram[idx[a]] += np.outer(p[idx[v]], p[idx[v]])
                        rhs[idx[a]] += (res[r] - other) * p[idx[v]]
            m = p if solve_p else q
            for i in range(n):
                m[i] = np.linalg.solve(gram[i], rhs[i])
    return lambda v, a: pct(w[0] + w[1 + idx[v]] + w[1 + n + idx[a]] + (p[idx[v]] @ q[idx[a]] if rank else 0.0))


def knn_pairs(rows: list, side: dict[str, np.ndarray], k: int = 3):
    """The measured pairs nearest by solo-profile distance (victim's plus aggressor's), inverse-distance weighted."""
    agg: dict = {}
    for v, co, y in rows:
        if len(co) == 1:
            agg.setdefault((v, co[0]), []).append(log_pct(y))
    keys = list(agg)
    ys = np.array([statistics.mean(agg[q]) for q in keys])
    vs, as_ = np.array([side[v] for v, _ in keys]), np.array([side[a] for _, a in keys])

    def pred(v: str, a: str) -> float:
        d = np.linalg.norm(vs - side[v], axis=1) + np.linalg.norm(as_ - side[a], axis=1)
        o = np.argsort(d)[:k]
        wt = 1.0 / (d[o] + 0.3)
        return pct(float((ys[o] * wt).sum() / wt.sum()))

    return pred


def neighbour_cf(rows: list, types: list[str], base, k: int = 5, shrink: float = 2.0):  # type: ignore[no-untyped-def]
    """Item-item and user-user CF (cosine on common entries, shrunk) on the residuals of ``base`` (log speed): Gavel's
    "nearest reference job", by measured fingerprint."""
    agg: dict = {}
    for v, co, y in rows:
        if len(co) == 1:
            agg.setdefault((v, co[0]), []).append(log_pct(y))
    resid = {q: statistics.mean(x) - log_pct(base(*q)) for q, x in agg.items()}

    def sim(x: str, y: str, col: bool) -> float:
        common = [t for t in types if (((t, x) in resid and (t, y) in resid) if col else ((x, t) in resid and (y, t) in resid))]
        if len(common) < 2:
            return 0.0
        a = np.array([resid[(t, x)] if col else resid[(x, t)] for t in common])
        b = np.array([resid[(t, y)] if col else resid[(y, t)] for t in common])
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-9)) * len(common) / (len(common) + shrink)

    def pred(v: str, a: str) -> float:
        num = den = 0.0
        for s, e in sorted(((sim(a, a2, True), (v, a2)) for a2 in types if (v, a2) in resid and a2 != a), reverse=True)[:k]:
            if s > 0:
                num, den = num + s * resid[e], den + s
        for s, e in sorted(((sim(v, v2, False), (v2, a)) for v2 in types if (v2, a) in resid and v2 != v), reverse=True)[:k]:
            if s > 0:
                num, den = num + s * resid[e], den + s
        return pct(log_pct(base(v, a)) + (num / den if den else 0.0))

    return pred


def first_residuals(firsts: list, prior: float = 3.0):
    """Per type, the shrunk mean log-ratio residual of what was served on first observations of job sets, as the
    job and as a co-runner (second half of the run so far), half each, added to what is served now."""
    t0 = firsts[0][4] if firsts else 0.0
    t1 = firsts[-1][4] if firsts else 0.0
    vb: dict = {}
    ab: dict = {}
    for v, co, y, s, t in firsts:
        if s is None or t < (t0 + t1) / 2:
            continue
        r = log_pct(y) - log_pct(s)
        vb.setdefault(v, []).append(r)
        for a in co:
            ab.setdefault(a, []).append(r)

    def shrunk(d: dict, t: str) -> float:
        return sum(d[t]) / (len(d[t]) + prior) if t in d else 0.0

    return lambda p: pct(log_pct(p["served"]) + 0.5 * shrunk(vb, p["v"]) + 0.5 * shrunk(ab, p["a"]))


def score(cp: dict, f) -> dict:  # type: ignore[no-untyped-def]
    """MAE / median of ``f(pair)`` (bounded to [-100, 1000]) on the checkpoint's pairs; MAE by truth bin, and on pairs
    the simulator would and would not place."""
    truth = Truth("v100")
    ps = [p for p in cp["pairs"] if p["served"] is not None]
    err = [abs(min(1000.0, max(-100.0, f(p))) - p["truth"]) for p in ps]
    out = {"mae": round(statistics.mean(err), 2), "median": round(statistics.median(err), 2)}
    for lo, hi in BINS:
        e = [x for x, p in zip(err, ps, strict=True) if lo <= p["truth"] < hi]
        out[f"truth<{hi:g}" if lo == -math.inf else f"{lo:g}-{hi:g}"] = round(statistics.mean(e), 1) if e else None
    for fits in (True, False):
        e = [x for x, p in zip(err, ps, strict=True) if truth.fits([p["v"], p["a"]]) == fits]
        out["placeable" if fits else "never placed"] = (len(e), round(statistics.mean(e), 1) if e else None)
    return out


def ideas(cp: dict) -> dict[str, dict]:
    rows = cp["rows"]
    types = sorted({r[0] for r in rows} | {a for r in rows for a in r[1]})
    side = profiles(cp["solo"], types)
    have = set(cp["pairs"][0]["candidates"]) if cp["pairs"] else set()
    by_cv = [k for _, k in sorted((e, k) for k, e in cp["cv"].items() if k in have and e is not None)]
    bias = biased_mf(rows, types)
    out = {
        "served": score(cp, lambda p: p["served"]),
        "served, not bounded to the range measured": score(cp, lambda p: p["raw"]),
        "best by CV alone": score(cp, lambda p: p["candidates"][by_cv[0]]),
        "two best by CV, log-speed mean": score(
            cp, lambda p: pct(statistics.mean(log_pct(p["candidates"][n]) for n in by_cv[:2]))
        ),
        "biased MF, biases only (log speed, ridge 1)": score(cp, lambda p: bias(p["v"], p["a"])),
        "biased MF, rank 2": score(cp, lambda p, f=biased_mf(rows, types, rank=2): f(p["v"], p["a"])),
        "served x biased MF, log-speed mean": score(cp, lambda p: pct((log_pct(p["served"]) + log_pct(bias(p["v"], p["a"]))) / 2)),
        "kNN over solo-profile distance, k=3": score(cp, lambda p, f=knn_pairs(rows, side): f(p["v"], p["a"])),
        "neighbour CF on the biases' residuals": score(cp, lambda p, f=neighbour_cf(rows, types, bias): f(p["v"], p["a"])),
        "served + first-observation residual biases": score(cp, first_residuals(cp["firsts"])),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--checkpoints", type=int, default=3)
    ap.add_argument("--dump")
    ap.add_argument("--load")
    ap.add_argument("--markdown", action="store_true", help="a table of the ideas' MAE (median) per checkpoint")
    args = ap.parse_args()
    if args.load:
        data = json.loads(Path(args.load).read_text())
    else:
        data = replay(args.quick, args.checkpoints)
        if args.dump:
            Path(args.dump).write_text(json.dumps(data))
    report = [
        {"t_s": round(cp["end"] - 1.0e9), "rows": len(cp["rows"]), "pairs": sum(p["served"] is not None for p in cp["pairs"]),
         "served_by": sorted({p["model"] for p in cp["pairs"] if p["model"]}),
         "best_by_cv": [k for _, k in sorted((e, k) for k, e in cp["cv"].items() if e is not None)][:2], "ideas": ideas(cp)}
        for cp in data
    ]  # fmt: skip
    if not args.markdown:
        print(json.dumps(report, indent=1))
        return
    print("| idea | " + " | ".join(f"t = {r['t_s']} s: MAE (median)" for r in report) + " | last: placeable / never placed |")
    print("|---|" + "---|" * (len(report) + 1))
    for name in report[0]["ideas"]:
        cells = [f"{r['ideas'][name]['mae']} ({r['ideas'][name]['median']})" for r in report]
        last = report[-1]["ideas"][name]
        print(f"| {name} | " + " | ".join(cells) + f" | {last['placeable'][1]} / {last['never placed'][1]} |")


if __name__ == "__main__":
    main()

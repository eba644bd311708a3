"""Offline study of the cold start under probes: single candidates and corrections on the outer
folds of ``aip evaluate gavel --holdout family --probes K``, over several draws of the revealed job sets.

No nested selection here (``aip evaluate ... --probe-seed S`` measures the AIP choice): each idea is fitted on a
fold's training rows (the probes included) and scored on the rest, MAE over the training median's MAE on the same
rows, for draws ``0 .. draws - 1`` of the probes (draw 0 is the evaluation's default).  The folds are the
evaluation's (seed 0, one per family); a fold's probes are :func:`models.crossval.reveal_probes`'s (``random``) or,
with ``--design spread``, chosen by identity alone: each probe a type of the family not yet probed, next to a known
family not yet used, no pair of the family with itself while another is left (Gavel's reference profiling).

The ``oracle-*`` rows subtract each test row's own group mean residual (by the held-out family's role, or by its
job type in each role): bounds of what a bias correction could do, not predictors.

    python scripts/probes_offline.py [--gpus v100,p100,k80] [--ks 2,4] [--draws 5] [--ideas "W-ET;avg(W-ET,W-SVR-poly)"] [--design spread]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.crossval import family_folds, reveal_probes
from models.datasets import Sample, load
from models.evaluate import fit_candidate, thin_family_weights, view
from models.features import parse_job_type
from models.newcomer import Newcomer, Role
from models.zoo import make_batch

Fold = tuple[np.ndarray, np.ndarray]
Fit = Callable[[Sequence[Sample]], Callable[[Sequence[Sample]], np.ndarray]]


def weighted(model: str) -> Fit:
    return lambda train: fit_candidate(f"Upweighted[{model}:all]", "all", train, "placement", 0)


def average(*fits: Fit) -> Fit:
    def fit(train: Sequence[Sample]) -> Callable[[Sequence[Sample]], np.ndarray]:
        parts = [f(train) for f in fits]
        return lambda test: np.mean([p(test) for p in parts], axis=0)

    return fit


def roles(s: Sample) -> tuple[Role, tuple[Role, ...]]:
    return Role(s.job_type, s.job_family), tuple(Role(t, f) for t, f in zip(s.co_job_types, s.co_job_families, strict=True))


def additive(prior: float = 2.0) -> Fit:
    """Per-role biases (family and type levels, shrunk) on the targets: ``models.newcomer.Newcomer`` rank 0 over the
    training mean."""

    def fit(train: Sequence[Sample]) -> Callable[[Sequence[Sample]], np.ndarray]:
        y = np.array([s.target for s in train])
        mu = float(y.mean())
        m = Newcomer(rank=0, prior=prior).fit([(*roles(s), float(v - mu)) for s, v in zip(train, y, strict=True)], sweeps=20)
        return lambda test: np.array([mu + m.predict_one(*roles(s)) for s in test])

    return fit


def relative_batch(model: str, types: dict[str, tuple[str, float]]) -> Fit:
    """The weighted model plus each type's log2 batch size less its family's mean over the dataset's types
    (identities only: the types of a family and their batch sizes, no target)."""
    fam_mean: dict[str, list[float]] = {}
    for fam, lb in types.values():
        fam_mean.setdefault(fam, []).append(lb)
    mean = {f: float(np.mean(v)) for f, v in fam_mean.items()}

    def x(s: Sample) -> dict[str, float]:
        out = dict(view(s, "placement", "all"))
        f, lb = types[s.job_type]
        out["rel_log2_batch"] = lb - mean[f]
        co = [types[t][1] - mean[types[t][0]] for t in s.co_job_types]
        out["co_rel_log2_batch"] = float(np.mean(co)) if co else 0.0
        return out

    def fit(train: Sequence[Sample]) -> Callable[[Sequence[Sample]], np.ndarray]:
        rows = [s for s, w in zip(train, thin_family_weights(train), strict=True) for _ in range(w)]
        frame = pd.DataFrame([x(s) for s in rows])
        m = make_batch(model, 0).fit(frame, np.array([s.target for s in rows]))
        return lambda test: np.asarray(m.predict(pd.DataFrame([x(s) for s in test]).reindex(columns=frame.columns)))

    return fit


def honest_bias(base: Fit, family: str, probe_rows: Sequence[int], samples: Sequence[Sample], train: Sequence[int], level: str,
                prior: float) -> Callable[[Sequence[Sample]], np.ndarray]:  # fmt: skip
    """``base`` fitted on ``train`` plus shrunk mean residuals of the probes, each probe's residual from ``base``
    fitted without its job set (cross-fitted): per role of the held-out family (``family`` level: victim, aggressor,
    both) or per job type as the victim (``type`` level)."""
    groups = sorted({samples[j].group for j in probe_rows})
    res: dict[int, float] = {}
    for g in groups:
        keep = [samples[j] for j in train if samples[j].group != g]
        out = [j for j in train if samples[j].group == g]
        for j, p in zip(out, base(keep)([samples[j] for j in out]), strict=True):
            res[j] = samples[j].target - float(p)

    def key(s: Sample) -> str:
        if level == "type":
            return s.job_type if s.job_family == family else ""
        return ("v" if s.job_family == family else "") + ("a" if family in s.co_job_families else "")

    sums: dict[str, list[float]] = {}
    for j in probe_rows:
        sums.setdefault(key(samples[j]), []).append(res[j])
    shift = {k: sum(v) / (len(v) + prior) for k, v in sums.items() if k}
    fitted = base([samples[j] for j in train])
    return lambda test: fitted(test) + np.array([shift.get(key(s), 0.0) for s in test])


def spread_design(folds: Sequence[Fold], samples: Sequence[Sample], probes: int, seed: int) -> list[Fold]:
    """Per fold and held-out family, ``probes`` job sets chosen by identity: each next probe the one (in a seeded
    order) whose family's types are least probed so far, then whose co-runner families are least used, a pair of
    the family with itself last; moved whole from test to training, like :func:`reveal_probes`."""
    fams, groups = [s.families for s in samples], [s.group for s in samples]
    out = []
    for i, (train, test) in enumerate(folds):
        seen = set().union(*(fams[j] for j in train))
        held = sorted(set().union(*(fams[j] for j in test)) - seen)
        rng = np.random.default_rng([seed, i])
        revealed: set[str] = set()
        for fam in held:
            own = sorted({groups[j] for j in test if fam in fams[j]})
            ftypes: dict[str, set[str]] = {g: set() for g in own}
            others: dict[str, set[str]] = {g: set() for g in own}
            for j in test:
                if groups[j] in ftypes:
                    if samples[j].job_family == fam:
                        ftypes[groups[j]].add(samples[j].job_type)
                    others[groups[j]] |= fams[j] - {fam}
            order = [own[k] for k in rng.permutation(len(own))]
            chosen: list[str] = []
            used_t: set[str] = set()
            used_f: set[str] = set()
            for _ in range(min(probes, len(order))):
                g = min((g for g in order if g not in chosen),
                        key=lambda g: (not others[g], len(ftypes[g] & used_t), len(others[g] & used_f), order.index(g)))  # fmt: skip
                chosen.append(g)
                used_t |= ftypes[g]
                used_f |= others[g]
            revealed.update(chosen)
        moved = np.array([groups[j] in revealed for j in test], dtype=bool)
        if not moved.all():
            out.append((np.sort(np.concatenate([train, test[moved]])), test[~moved]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default="v100,p100,k80")
    ap.add_argument("--ks", default="2,4")
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--design", choices=("random", "spread"), default="random")
    ap.add_argument("--ideas", default=None, help="semicolon-separated subset of the ideas' names (default: all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    table: dict[str, dict[str, dict[str, list[float]]]] = {}
    for gpu in args.gpus.split(","):
        samples = load("gavel", gpu).samples
        y = np.array([s.target for s in samples])
        types = {}
        for s in samples:
            for t in (s.job_type, *s.co_job_types):
                fam, b = parse_job_type(t)
                types[t] = (fam, math.log2(b) if b else 0.0)
        fams, groups = [s.families for s in samples], [s.group for s in samples]
        plain = family_folds(fams, len(set().union(*fams)), 0)
        et, svr, gb = weighted("ExtraTrees"), weighted("SVR-poly"), weighted("GradientBoosting")
        ideas: dict[str, Fit | str] = {
            "W-ET": et, "W-SVR-poly": svr, "W-GradientBoosting": gb, "avg(W-ET,W-SVR-poly)": average(et, svr),
            "avg(W-ET,W-SVR-poly,W-GB)": average(et, svr, gb), "additive": additive(), "avg(W-ET,additive)": average(et, additive()),
            "W-ET+relative-batch": relative_batch("ExtraTrees", types), "W-ET+family-bias": "family", "W-ET+type-bias": "type",
            "oracle-family-role": "oracle-family", "oracle-type-role": "oracle-type",
        }  # fmt: skip
        if args.ideas:
            ideas = {k: v for k, v in ideas.items() if k in args.ideas.split(";")}
        for k in (int(v) for v in args.ks.split(",")):
            ratios: dict[str, list[float]] = {name: [] for name in ideas}
            for draw in range(args.draws):
                folds = (
                    reveal_probes(plain, fams, groups, k, draw) if args.design == "random" else spread_design(plain, samples, k, draw)
                )
                err: dict[str, list[np.ndarray]] = {name: [] for name in ideas}
                med = []
                for train, test in folds:
                    tr0, te0 = next(f for f in plain if set(test.tolist()) <= set(f[1].tolist()))
                    family = (set().union(*(fams[j] for j in te0)) - set().union(*(fams[j] for j in tr0))).pop()
                    probe_rows = sorted(set(train.tolist()) - set(tr0.tolist()))
                    tr, te = [samples[j] for j in train], [samples[j] for j in test]
                    med.append(np.abs(y[test] - np.median(y[train])))
                    base_pred = et(tr)(te) if any(isinstance(v, str) for v in ideas.values()) else None
                    for name, idea in ideas.items():
                        if callable(idea):
                            pred = idea(tr)(te)
                        elif idea in ("family", "type"):
                            pred = honest_bias(et, family, probe_rows, samples, train, idea, 4.0 if idea == "family" else 2.0)(te)
                        else:  # an oracle: W-ET less each key's own mean residual on the test rows
                            assert base_pred is not None
                            r = y[test] - base_pred
                            keys = [
                                (s.job_type if s.job_family == family else "", s.co_job_types[0] if family in s.co_job_families else "")
                                if idea == "oracle-type" else (s.job_family == family, family in s.co_job_families)
                                for s in te
                            ]  # fmt: skip
                            pred = base_pred.copy()
                            for key in set(keys):
                                mask = np.array([kk == key for kk in keys])
                                pred[mask] += r[mask].mean()
                        err[name].append(np.abs(pred - y[test]))
                m = float(np.concatenate(med).mean())
                for name in ideas:
                    ratios[name].append(float(np.concatenate(err[name]).mean()) / m)
            table.setdefault(gpu, {})[str(k)] = ratios
            for name, v in ratios.items():
                print(f"{gpu} K={k} {args.design:6s} {name:28s} mean {np.mean(v):.3f} sd {np.std(v):.3f}  "
                      f"[{' '.join(f'{x:.3f}' for x in v)}]", flush=True)  # fmt: skip
    if args.json:
        print(json.dumps(table))


if __name__ == "__main__":
    main()

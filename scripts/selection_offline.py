"""Offline study of the selection on families never seen: rules over several draws of the inner family partition.

On the outer folds of ``aip evaluate gavel --gpu G --holdout family`` (seed 0, one per family), each outer fold's
single candidates are cross-validated on its training rows by :func:`models.evaluate.candidate_scores` (2 family
folds) once per draw ``1 .. draws`` (the draw seeds the inner partition and the inner fits; draw 1 is the
evaluation's), and fitted on the training rows to predict the test rows (:func:`models.evaluate.outer_predictions`,
seed 0, as the evaluation).  A rule maps the draws' out-of-fold predictions to weights over the candidates; its
figure is the held-out MAE of the weighted outer predictions over the training median's (docs/MODELS.md, "Tried and
not adopted").  ``hindsight`` is no rule: the greedy blend fitted on the outer predictions themselves.

``--refit-zoo``: instead, how the stream's refits rank their models carries over to families never seen, on the same
outer folds over :data:`models.zoo.REFIT_BATCH` (placement mode): the argmin of a job-set CV of 3 folds (the refit's),
the argmin of a family-grouped CV of 2 folds, and :func:`models.blend.blend` over the latter (docs/MODELS.md,
"Selection on families never seen").

    python scripts/selection_offline.py [--gpus v100,p100,k80] [--draws 6] [--cache DIR] [--refit-zoo] [--json]
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.blend import blend, blend_weights, is_single
from models.crossval import best_score, cross_validate, family_folds, holdout_folds
from models.datasets import load
from models.evaluate import _key, candidate_scores, fit_candidate, outer_predictions
from models.live import MEDIAN
from models.zoo import REFIT_BATCH

MED = f"{MEDIAN}:all"
INNER_K = 2


def collect(gpu: str, draws: int) -> dict[str, Any]:
    """Per outer fold: each draw's inner out-of-fold predictions of every single candidate, and their outer ones."""
    ds = load("gavel", gpu)
    samples = ds.samples
    n_fam = len(set().union(*(s.families for s in samples)))
    folds = holdout_folds(samples, n_fam, 0, "family")
    outer = []
    for train, test in folds:
        tr, te = [samples[j] for j in train], [samples[j] for j in test]
        inner: dict[int, dict[str, np.ndarray]] = {}
        first = None
        for d in range(1, draws + 1):
            scores = candidate_scores(tr, ds.modes[0], k=INNER_K, seed=d, holdout="family")
            first = first or scores
            inner[d] = {_key(c.model, c.category): c.oof for c in scores if is_single(c.model)}
        outer.append({"inner": inner, "pred": outer_predictions(first or [], tr, te, ds.modes[0], 0)})
    return {"y": np.array([s.target for s in samples]), "folds": folds, "fams": [s.families for s in samples], "outer": outer}


class Fold:
    """What a rule sees of one outer fold: the draws' inner out-of-fold predictions and the training targets."""

    def __init__(
        self, inner: dict[int, dict[str, np.ndarray]], y: np.ndarray, fams: Sequence[frozenset[str]], draws: Sequence[int]
    ):
        self.keys = sorted(k for k in inner[draws[0]] if k != MED)
        self.y, self.draws = y, list(draws)
        self.oof = {d: np.array([inner[d][k] for k in self.keys]) for d in draws}
        self.median = {d: inner[d][MED] for d in draws}
        self.tests = {d: [te for _, te in family_folds(fams, INNER_K, d)] for d in draws}

    def pooled(self) -> tuple[np.ndarray, np.ndarray]:
        o = np.concatenate([self.oof[d] for d in self.draws], axis=1)
        yy = np.concatenate([self.y] * len(self.draws))
        ok = np.all(np.isfinite(o), axis=0)
        return o[:, ok], yy[ok]


def _ranked_greedy(o: np.ndarray, y: np.ndarray, steps: int = 10) -> np.ndarray:
    return blend_weights(o, y, steps)


def weighted_greedy(o: np.ndarray, y: np.ndarray, w: np.ndarray, steps: int = 10) -> np.ndarray:
    """:func:`models.blend.blend_weights` with each row's absolute error weighted by ``w``."""
    counts = np.zeros(len(o))
    first = int(np.argmin((np.abs(o - y) * w).sum(axis=1)))
    counts[first], total = 1, o[first].copy()
    for _ in range(steps):
        j = int(np.argmin((np.abs((total + o) / (counts.sum() + 1) - y) * w).sum(axis=1)))
        counts[j] += 1
        total += o[j]
    return counts / counts.sum()


def greedy_per_draw(f: Fold) -> np.ndarray:
    out = np.zeros(len(f.keys))
    for d in f.draws:
        ok = np.all(np.isfinite(f.oof[d]), axis=0)
        out += _ranked_greedy(f.oof[d][:, ok], f.y[ok]) / len(f.draws)
    return out


def greedy_pooled(f: Fold) -> np.ndarray:
    return _ranked_greedy(*f.pooled())


def argmin_pooled(f: Fold) -> np.ndarray:
    o, y = f.pooled()
    return np.eye(len(f.keys))[int(np.argmin(np.mean(np.abs(o - y), axis=1)))]


def nnls_pooled(f: Fold) -> np.ndarray:
    o, y = f.pooled()
    w, _ = nnls(o.T, y)
    return w / w.sum() if w.sum() > 0 else argmin_pooled(f)


def most_often_best(f: Fold) -> np.ndarray:
    counts = np.zeros(len(f.keys))
    for d in f.draws:
        for te in f.tests[d]:
            counts[int(np.argmin(np.mean(np.abs(f.oof[d][:, te] - f.y[te]), axis=1)))] += 1
    return np.eye(len(f.keys))[int(np.argmax(counts))]


def shrunk_to_most_often_best(f: Fold, share: float = 0.25) -> np.ndarray:
    return (1 - share) * greedy_per_draw(f) + share * most_often_best(f)


def relative_to_median(f: Fold) -> np.ndarray:
    """Greedy on every inner fold's error over that fold's median-baseline error (each fold weighs alike)."""
    ws = []
    for d in f.draws:
        w = np.zeros(len(f.y))
        for te in f.tests[d]:
            w[te] = 1.0 / max(float(np.mean(np.abs(f.median[d][te] - f.y[te]))), 1e-9) / len(te)
        ws.append(w)
    o = np.concatenate([f.oof[d] for d in f.draws], axis=1)
    y, w = np.concatenate([f.y] * len(f.draws)), np.concatenate(ws)
    ok = np.all(np.isfinite(o), axis=0)
    return weighted_greedy(o[:, ok], y[ok], w[ok])


def minimax(f: Fold, steps: int = 10) -> np.ndarray:
    """Greedy on the worst inner fold's MAE."""
    terms = [(f.oof[d][:, te], f.y[te]) for d in f.draws for te in f.tests[d]]

    def worst(parts: list[np.ndarray]) -> np.ndarray:
        return np.max([np.mean(np.abs(p - y), axis=-1) for p, (_, y) in zip(parts, terms, strict=True)], axis=0)

    counts = np.zeros(len(f.keys))
    first = int(np.argmin(worst([o for o, _ in terms])))
    counts[first] = 1
    totals = [o[first].copy() for o, _ in terms]
    for _ in range(steps):
        j = int(np.argmin(worst([(t + o) / (counts.sum() + 1) for t, (o, _) in zip(totals, terms, strict=True)])))
        counts[j] += 1
        for t, (o, _) in zip(totals, terms, strict=True):
            t += o[j]
    return counts / counts.sum()


RULES: dict[str, Callable[[Fold], np.ndarray]] = {
    "greedy_per_draw": greedy_per_draw,
    "greedy_pooled": greedy_pooled,
    "argmin_pooled": argmin_pooled,
    "nnls_pooled": nnls_pooled,
    "most_often_best": most_often_best,
    "shrunk_25": shrunk_to_most_often_best,
    "relative_to_median": relative_to_median,
    "minimax": minimax,
}


def score(data: dict[str, Any], rule: Callable[[Fold], np.ndarray], draws: Sequence[int]) -> float:
    """The rule's held-out MAE over the training median's, on the outer folds."""
    y, fams = data["y"], data["fams"]
    pred, med = np.full(len(y), np.nan), np.full(len(y), np.nan)
    for (train, test), e in zip(data["folds"], data["outer"], strict=True):
        med[test] = e["pred"][MED]
        if not e["inner"].get(draws[0]):
            pred[test] = med[test]
            continue
        f = Fold(e["inner"], y[train], [fams[j] for j in train], draws)
        w = rule(f)
        pred[test] = sum(wi * e["pred"][k] for k, wi in zip(f.keys, w, strict=True) if wi > 0)
    return float(np.mean(np.abs(pred - y)) / np.mean(np.abs(med - y)))


def hindsight(data: dict[str, Any]) -> float:
    keys = sorted(k for k in data["outer"][0]["pred"] if k != MED and not k.startswith(("Average", "Blend")))
    p = np.array([np.concatenate([e["pred"][k] for e in data["outer"]]) for k in keys])
    y = np.concatenate([data["y"][te] for _, te in data["folds"]])
    med = np.concatenate([e["pred"][MED] for e in data["outer"]])
    return float(np.mean(np.abs(blend_weights(p, y, 30) @ p - y)) / np.mean(np.abs(med - y)))


def refit_zoo(gpu: str) -> dict[str, float]:
    """MAE over the training median's, on the outer family folds, of three rankings of the refit zoo."""
    ds = load("gavel", gpu)
    samples = ds.samples
    y = np.array([s.target for s in samples])
    n_fam = len(set().union(*(s.families for s in samples)))
    rules = ("job_set_cv_argmin", "family_cv_argmin", "family_cv_blend", "median")
    pred = {r: np.full(len(y), np.nan) for r in rules}
    for train, test in holdout_folds(samples, n_fam, 0, "family"):
        tr, te = [samples[j] for j in train], [samples[j] for j in test]
        pair = cross_validate(tr, ["placement"], models=REFIT_BATCH, k=3, seed=1, holdout="pair")
        fam = cross_validate(tr, ["placement"], models=REFIT_BATCH, k=2, seed=1, holdout="family")
        med = float(np.median(y[train]))
        mixed = blend(fam, y[train], "placement") if fam else None
        picks = (best_score(pair, "placement"), best_score(fam, "placement") if fam else None, mixed)
        for rule, pick in zip(rules, picks, strict=False):
            pred[rule][test] = med if pick is None else fit_candidate(pick.model, pick.category, tr, "placement", 0)(te)
        pred["median"][test] = med
    base = float(np.mean(np.abs(pred["median"] - y)))
    return {r: round(float(np.mean(np.abs(p - y))) / base, 3) for r, p in pred.items() if r != "median"}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="v100,p100,k80")
    ap.add_argument("--draws", type=int, default=6)
    ap.add_argument("--cache", type=Path, help="keep each GPU's cross-validations here (pickles) and reuse them")
    ap.add_argument("--refit-zoo", action="store_true", help="the stream's refit rankings instead (see above)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out: dict[str, Any] = {}
    for gpu in args.gpus.split(","):
        if args.refit_zoo:
            out[gpu] = refit_zoo(gpu)
            if not args.json:
                print(gpu, out[gpu], flush=True)
            continue
        path = args.cache / f"{gpu}-family-{args.draws}.pkl" if args.cache else None
        if path is not None and path.exists():
            data = pickle.loads(path.read_bytes())
        else:
            data = collect(gpu, args.draws)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(pickle.dumps(data))
        every = list(range(1, args.draws + 1))
        row = {"one_draw": [round(score(data, greedy_per_draw, [d]), 3) for d in every], "hindsight": round(hindsight(data), 3)}
        row.update({name: round(score(data, rule, every), 3) for name, rule in RULES.items()})
        out[gpu] = row
        if not args.json:
            print(gpu, row, flush=True)
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Offline evaluation in the paper's method: error of every model per category, the AIP choice,
and that choice's held-out error.

Held-out error is *nested*: for each outer fold (grouped), AIP selects a model x
category by grouped cross-validation on the outer training part only, fits it
there and predicts the outer test part.  So the reported ``mae`` includes the
cost of choosing, and no group is ever both trained on and tested.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from events import CATEGORIES
from models.datasets import Dataset, Sample
from models.features import restrict
from models.selection import Score, cross_validate, grouped_folds, mae, relative_error, select
from models.zoo import BATCH, make_batch

Progress = Callable[[str], None]


@dataclass
class Evaluation:
    dataset: str
    target: str
    mode: str
    rows: int
    groups: int
    scores: list[Score]
    selected: Score
    heldout_pred: np.ndarray
    mae: float
    relative_error: float | None
    baseline_mae: float | None
    selection_seconds: float
    seconds: float
    outer_choices: list[str] = field(default_factory=list)
    actual: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def summary(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "target": self.target,
            "mode": self.mode,
            "selected": self.selected.model,
            "category": self.selected.category,
            "cv_mae": round(self.selected.mae, 3),
            "mae": round(self.mae, 3),
            "relative_error": None if self.relative_error is None else round(self.relative_error, 4),
            "baseline_mae": None if self.baseline_mae is None else round(self.baseline_mae, 3),
            "selection_seconds": round(self.selection_seconds, 2),
            "seconds": round(self.seconds, 2),
            "rows": self.rows,
            "groups": self.groups,
            "outer_choices": self.outer_choices,
        }


def baseline_onehot(samples: Sequence[Sample], k: int = 5, seed: int = 0) -> float | None:
    """The comparison baseline: a random forest on one-hot job identities, same grouped folds."""
    from sklearn.ensemble import RandomForestRegressor

    X = pd.DataFrame([{f"job={s.job_type}": 1.0, **{f"co={c}": 1.0 for c in s.co_job_types}} for s in samples]).fillna(0.0)
    y = np.array([s.target for s in samples])
    folds = grouped_folds([s.group for s in samples], k, seed)
    if not folds:
        return None
    oof = np.zeros(len(y))
    for train, test in folds:
        rf = RandomForestRegressor(n_estimators=100, random_state=seed, n_jobs=1).fit(X.iloc[train], y[train])
        oof[test] = rf.predict(X.iloc[test])
    return mae(oof, y)


def evaluate(
    dataset: Dataset,
    mode: str,
    *,
    k: int = 5,
    inner_k: int = 3,
    seed: int = 0,
    models: Sequence[str] = BATCH,
    baseline: bool = True,
    progress: Progress | None = None,
) -> Evaluation:
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    samples = dataset.samples
    y = np.array([s.target for s in samples], dtype=float)
    say(f"{len(samples)} rows, {len(set(dataset.groups))} groups; cross-validating {len(models)} models x 4 categories")
    ts = time.perf_counter()
    scores = cross_validate(samples, [mode], models=models, k=k, seed=seed, progress=say)
    chosen = select(scores, mode)
    selection_seconds = time.perf_counter() - ts
    if chosen is None:
        raise ValueError("no model could be cross-validated (too few groups?)")
    say(f"selected {chosen.model} (category {chosen.category}), CV MAE {chosen.mae:.2f}; nested held-out check")
    heldout = np.zeros(len(y))
    outer_choices = []
    full = [s.features(mode, "all") for s in samples]
    for i, (train, test) in enumerate(grouped_folds([s.group for s in samples], k, seed)):
        inner = cross_validate([samples[j] for j in train], [mode], models=models, k=inner_k, seed=seed + 1)
        pick = select(inner, mode) or chosen
        outer_choices.append(f"{pick.model}:{pick.category}")
        X = pd.DataFrame([restrict(f, pick.category) for f in full])
        model = make_batch(pick.model, seed).fit(X.iloc[train], y[train])
        heldout[test] = model.predict(X.iloc[test])
        say(f"outer fold {i + 1}/{k}: chose {pick.model}:{pick.category}, fold MAE {mae(heldout[test], y[test]):.2f}")
    base = baseline_onehot(samples, k, seed) if baseline else None
    return Evaluation(
        dataset=dataset.name, target=dataset.target_name, mode=mode, rows=len(samples), groups=len(set(dataset.groups)),
        scores=scores, selected=chosen, heldout_pred=heldout, mae=mae(heldout, y), relative_error=relative_error(heldout, y),
        baseline_mae=base, selection_seconds=selection_seconds, seconds=time.perf_counter() - t0,
        outer_choices=outer_choices, actual=y,
    )  # fmt: skip


def table(ev: Evaluation) -> str:
    """The paper's table: model x category, MAE in points (relative error in brackets)."""
    cats = [c for c in CATEGORIES if any(s.category == c for s in ev.scores)]
    by = {(s.model, s.category): s for s in ev.scores}
    models = sorted({s.model for s in ev.scores}, key=lambda m: min(by[(m, c)].mae for c in cats if (m, c) in by))
    head = f"{'model':18}" + "".join(f"{'cat ' + c:>18}" for c in cats)
    lines = [head, "-" * len(head)]
    for m in models:
        cells = []
        for c in cats:
            s = by.get((m, c))
            if s is None:
                cells.append(f"{'-':>18}")
                continue
            rel = "" if s.relative_error is None else f" ({s.relative_error:.2f})"
            mark = "*" if s is ev.selected else " "
            cells.append(f"{s.mae:>10.2f}{rel:>7}{mark}")
        lines.append(f"{m:18}" + "".join(cells))
    return "\n".join(lines)


def learning_curve(ev: Evaluation, samples: Sequence[Sample], *, k: int = 5, seed: int = 0) -> list[tuple[int, float]]:
    """Held-out MAE of the selected model x category against the number of training rows."""
    y = np.array([s.target for s in samples])
    X = pd.DataFrame([restrict(s.features(ev.mode, "all"), ev.selected.category) for s in samples])
    folds = grouped_folds([s.group for s in samples], k, seed)
    rng = np.random.default_rng(seed)
    out = []
    for frac in (0.2, 0.4, 0.6, 0.8, 1.0):
        errs, n_train = [], 0
        for train, test in folds:
            sub = train if frac == 1.0 else rng.choice(train, max(3, int(len(train) * frac)), replace=False)
            model = make_batch(ev.selected.model, seed).fit(X.iloc[sub], y[sub])
            errs.append(mae(model.predict(X.iloc[test]), y[test]))
            n_train += len(sub)
        out.append((n_train // max(1, len(folds)), float(np.mean(errs))))
    return out


def write_report(ev: Evaluation, samples: Sequence[Sample], directory: Path) -> list[Path]:
    """Plots (predicted vs actual, error heatmap, learning curve) and ``summary.md``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    unit = "lost throughput, %" if ev.target == "lost_throughput_pct" else "interference rate, %"
    files = []

    fig, ax = plt.subplots(figsize=(6, 5.5))
    ax.scatter(ev.actual, ev.heldout_pred, s=12, alpha=0.6, label="held-out prediction")
    lo, hi = float(min(ev.actual.min(), ev.heldout_pred.min())), float(max(ev.actual.max(), ev.heldout_pred.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="perfect")
    ax.set_xlabel(f"measured ({unit})")
    ax.set_ylabel(f"predicted ({unit})")
    ax.set_title(f"{ev.dataset}: AIP held-out predictions\n(MAE {ev.mae:.2f} points, {ev.rows} rows)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    files.append(directory / "predicted_vs_actual.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    cats = [c for c in CATEGORIES if any(s.category == c for s in ev.scores)]
    models = sorted({s.model for s in ev.scores})
    grid = np.full((len(models), len(cats)), np.nan)
    for s in ev.scores:
        grid[models.index(s.model), cats.index(s.category)] = s.mae
    fig, ax = plt.subplots(figsize=(1.6 * len(cats) + 3.5, 0.45 * len(models) + 1.8))
    im = ax.imshow(grid, cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(len(cats)), [f"category {c}" for c in cats])
    ax.set_yticks(range(len(models)), models)
    finite = grid[np.isfinite(grid)]
    mid = float(np.median(finite)) if finite.size else 0.0
    for i in range(len(models)):
        for j in range(len(cats)):
            if math.isfinite(grid[i, j]):
                ax.text(
                    j,
                    i,
                    f"{grid[i, j]:.2f}",
                    ha="center",
                    va="center",
                    color="white" if grid[i, j] > mid else "black",
                    fontsize=8,
                )
    ax.set_title(f"{ev.dataset}: grouped-CV MAE per model x category (points)")
    fig.colorbar(im, ax=ax, label=f"MAE (points of {unit})")
    fig.tight_layout()
    files.append(directory / "error_heatmap.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    curve = learning_curve(ev, samples)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.plot([c[0] for c in curve], [c[1] for c in curve], "o-")
    ax.set_xlabel("training rows per fold")
    ax.set_ylabel("held-out MAE (points)")
    ax.set_title(f"Learning curve: {ev.selected.model}, category {ev.selected.category}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    files.append(directory / "learning_curve.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    s = ev.summary()
    md = [
        f"# AIP evaluation: {ev.dataset}",
        "",
        f"- mode: {ev.mode}; target: {ev.target}; rows: {ev.rows}; groups: {ev.groups} (cross-validation never splits a group)",
        f"- selected: **{s['selected']}**, category {s['category']} (grouped-CV MAE {s['cv_mae']})",
        f"- nested held-out MAE of the AIP choice: **{s['mae']}** points; relative error {s['relative_error']}",
        f"- baseline (random forest on one-hot job identities, same folds): {s['baseline_mae']}",
        f"- selection took {s['selection_seconds']} s; whole evaluation {s['seconds']} s",
        "",
        "## Error per model x category (MAE in points, relative error in brackets, * = selected)",
        "",
        "```",
        table(ev),
        "```",
        "",
        "![predicted vs actual](predicted_vs_actual.png)",
        "![error heatmap](error_heatmap.png)",
        "![learning curve](learning_curve.png)",
        "",
    ]
    files.append(directory / "summary.md")
    files[-1].write_text("\n".join(md))
    return files

"""What ``aip evaluate`` shows of an :class:`models.evaluate.Evaluation`: the paper's table, the learning curve, the
plots and ``summary.md``, and the probes' figures.  Offline; no Kafka, no faust.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from events import CATEGORIES
from models.blend import BLEND, blend_members
from models.crossval import mae
from models.datasets import Sample
from models.evaluate import Evaluation, fit_candidate
from models.intervals import COVERAGE


def table(ev: Evaluation) -> str:
    """The paper's table: model x category, MAE in points (relative error in brackets)."""
    cats = [c for c in CATEGORIES if any(s.category == c for s in ev.scores)]
    by = {(s.model, s.category): s for s in ev.scores}
    models = sorted({s.model for s in ev.scores}, key=lambda m: min(by[(m, c)].mae for c in cats if (m, c) in by))
    head = f"{'model':18}" + "".join(f"{'cat ' + c:>18}" for c in cats)
    lines = [head, "-" * len(head)]
    sel = ev.selected
    chosen = set() if sel is None else (
        {(m, c) for m, c, _ in blend_members(sel.model)} if sel.model.startswith(BLEND + "[") else {(sel.model, sel.category)}
    )  # the selection, or every member of its blend, is starred
    for m in models:
        cells = []
        for c in cats:
            s = by.get((m, c))
            if s is None:
                cells.append(f"{'-':>18}")
                continue
            rel = "" if s.relative_error is None else f" ({s.relative_error:.2f})"
            mark = "*" if (m, c) in chosen else " "
            cells.append(f"{s.mae:>10.2f}{rel:>7}{mark}")
        lines.append(f"{m:18}" + "".join(cells))
    return "\n".join(lines)


def learning_curve(ev: Evaluation, samples: Sequence[Sample], *, seed: int = 0) -> list[tuple[int, float]]:
    """Held-out MAE against the number of training rows: each outer fold refits *its own* choice (made on its
    training rows) on a share of those rows and predicts its test rows."""
    y = np.array([s.target for s in samples])
    rng = np.random.default_rng(seed)
    out = []
    for frac in (0.2, 0.4, 0.6, 0.8, 1.0):
        errs, n_train = [], 0
        for train, test, name, cat in ev.fold_picks:
            sub = train if frac == 1.0 else np.sort(rng.choice(train, max(3, int(len(train) * frac)), replace=False))
            pred = fit_candidate(name, cat, [samples[j] for j in sub], ev.mode, seed)([samples[j] for j in test])
            errs.append(mae(pred, y[test]))
            n_train += len(sub)
        out.append((n_train // max(1, len(ev.fold_picks)), float(np.mean(errs))))
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
    ax.set_title("Learning curve: each outer fold's own choice")
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
        f"- selected: **{s['selected']}**, category {s['category']} (grouped-CV MAE {s['cv_mae']}; a blend's in sample, not comparable with the table's)",
        f"- holdout: {ev.holdout} ({ev.folds} outer folds; selection inside each by the same scheme)",
        f"- nested held-out MAE of the AIP choice: **{s['mae']}** points; relative error {s['relative_error']}",
        f"- baselines on the same folds: training median {s['median_baseline_mae']}, "
        f"random forest on one-hot job identities {s['baseline_mae']}",
        f"- {round(100 * COVERAGE)} % conformal intervals: coverage {s['interval_coverage']}, "
        f"mean width {s['interval_width_mean']} points",
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


def probe_summary(ev: Evaluation) -> dict[str, Any]:
    """One entry of ``by_probes``: the held-out figures of an evaluation with ``ev.probes`` job sets revealed.

    >>> from models.crossval import Score
    >>> ev = Evaluation("d", "t", "placement", 4, 2, [], Score("m", "all", "placement", 1.0, None, 4, 0.0),
    ...                 np.array([1.0, 3.0]), 1.0, None, 4.0, 0.0, 0.0, actual=np.array([2.0, 2.0]),
    ...                 median_baseline_mae=2.0, probes=2, scored_rows=2)
    >>> probe_summary(ev)["mae_over_median"]
    0.5
    """
    s = ev.summary()
    med = ev.median_baseline_mae
    ratio = round(ev.mae / med, 3) if med and math.isfinite(ev.mae) else None
    keys = ("mae", "median_baseline_mae", "baseline_mae", "interval_coverage", "interval_width_mean", "scored_rows", "probe_seed")
    return {**{k: s[k] for k in keys}, "mae_over_median": ratio, "outer_choices": ev.outer_choices}


def write_probes_plot(evs: Sequence[Evaluation], directory: Path) -> Path:
    """``probes.png``: held-out MAE against the job sets revealed per held-out family, with the baselines on the
    same scored rows; a line in ``summary.md`` when it exists."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    ks = [e.probes for e in evs]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.plot(ks, [e.mae for e in evs], "o-", label="AIP choice (nested)")
    ax.plot(ks, [math.nan if e.median_baseline_mae is None else e.median_baseline_mae for e in evs], "s--", label="training median")
    if all(e.baseline_mae is not None for e in evs):
        ax.plot(ks, [math.nan if e.baseline_mae is None else e.baseline_mae for e in evs], "^--", label="job identity (one-hot RF)")
    ax.set_xlabel("job sets revealed per held-out family (K)")
    ax.set_ylabel("held-out MAE on the rest (points)")
    ax.set_title(f"{evs[0].dataset}: what a few measurements of a new family are worth")
    ax.set_xticks(ks)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = directory / "probes.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    md = directory / "summary.md"
    if md.exists():
        rows = [f"| {e.probes} | {e.scored_rows} | {e.mae:.2f} | {e.median_baseline_mae:.2f} |" for e in evs]
        extra = ["", "## Probes: K job sets of each held-out family revealed", "", "| K | scored rows | MAE | median |",
                 "|---|---|---|---|", *rows, "", "![probes](probes.png)", ""]  # fmt: skip
        md.write_text(md.read_text() + "\n".join(extra))
    return path

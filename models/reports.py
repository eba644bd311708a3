"""Reports with plots from the records of a run (``aip report``).

Input is records (``Observation``, ``Prediction``, ``Leaderboard``), however they
were read; output is a directory with ``report.md`` and one PNG per figure:

* ``interference_by_pair.png``: measured interference rate per job set;
* ``pct_changes.png``: the six percent changes against the interference rate
  (as in the AIP paper's figures);
* ``leaderboard_errors.png``: the best model's error per category over time;
* ``predicted_vs_measured.png``: predictions against the rates measured later.

Plots without data are left out, and the report says so.  No Kafka here.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from events import CATEGORIES, PARAMETERS, Leaderboard, Observation, Prediction

PARAMETER_NAMES = {
    "E": "power",
    "T": "temperature",
    "S": "SM utilisation",
    "V": "memory utilisation",
    "R": "read bandwidth (PCIe RX)",
    "W": "write bandwidth (PCIe TX)",
}


@dataclass
class RunRecords:
    observations: list[Observation] = field(default_factory=list)
    predictions: list[Prediction] = field(default_factory=list)
    leaderboards: list[Leaderboard] = field(default_factory=list)

    def add(self, record: Any) -> bool:
        """Keep a record of a kind the report uses; return whether it was kept."""
        if isinstance(record, Observation):
            self.observations.append(record)
        elif isinstance(record, Prediction):
            self.predictions.append(record)
        elif isinstance(record, Leaderboard):
            self.leaderboards.append(record)
        else:
            return False
        return True


def short_type(job_type: str, width: int = 22) -> str:
    """A job type short enough for an axis label.

    >>> short_type("ResNet-50 (batch size 64)"), short_type("Recommendation (batch size 8192)", 12)
    ('ResNet-50 bs64', 'Recommenda…')
    """
    text = job_type.replace(" (batch size ", " bs").replace(")", "")
    return text if len(text) <= width else text[: width - 2] + "…"


def pair_rates(observations: Sequence[Observation]) -> list[tuple[str, float, float, int]]:
    """(job set label, mean, standard deviation, count) of the measured rate per job set, most observed first.

    >>> from events import Observation
    >>> o = lambda y: Observation(window_start=1e9, window_end=1e9 + 10, gpu_uuid="g", environment="v100",
    ...     job_id="j", job_type="A", co_job_types=["B"], interference_pct=y)
    >>> pair_rates([o(10.0), o(30.0)])
    [('A | B', 20.0, 14.142135623730951, 2)]
    """
    by_set: dict[str, list[float]] = defaultdict(list)
    for obs in observations:
        if obs.interference_pct is None:
            continue
        label = f"{short_type(obs.job_type)} | {' + '.join(short_type(t) for t in obs.co_job_types)}"
        by_set[label].append(obs.interference_pct)
    rows = [(k, statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v)) for k, v in by_set.items()]
    rows.sort(key=lambda r: (-r[3], r[0]))
    return rows


def best_errors_over_time(
    leaderboards: Sequence[Leaderboard], min_samples: int = 10
) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(environment:mode, category) -> [(ts, smallest MAE of any model scored on at least ``min_samples``)], in time order."""
    out: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for board in sorted(leaderboards, key=lambda b: b.ts):
        best: dict[tuple[str, str], float] = {}
        for e in board.entries:
            if e.mae is None or not math.isfinite(e.mae) or e.samples < min_samples:
                continue
            key = (f"{board.environment}:{e.mode}", e.category)
            best[key] = min(best.get(key, math.inf), e.mae)
        for key, value in best.items():
            out[key].append((board.ts, value))
    return dict(out)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_pairs(observations: Sequence[Observation], path: Path, top: int = 25) -> int:
    rows = pair_rates(observations)[:top]
    if not rows:
        return 0
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(rows) + 1.6))
    labels = [f"{r[0]}  (n={r[3]})" for r in rows][::-1]
    means = [r[1] for r in rows][::-1]
    errs = [r[2] for r in rows][::-1]
    ax.barh(range(len(rows)), means, xerr=errs, color="tab:blue", alpha=0.8, capsize=2)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_xlabel("measured interference rate (%) — mean ± s.d. over windows")
    ax.set_title(f"Interference rate per job set (job | co-runners), {len(rows)} most observed")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(rows)


def plot_pct_changes(observations: Sequence[Observation], path: Path) -> int:
    labelled = [o for o in observations if o.interference_pct is not None]
    if not labelled:
        return 0
    plt = _plt()
    fig, axes = plt.subplots(2, 3, figsize=(12, 7.5))
    for ax, p in zip(axes.flat, PARAMETERS, strict=True):
        pts = [(o.pct(p), o.interference_pct) for o in labelled if o.pct(p) is not None]
        scale = ""
        if pts:
            ax.scatter([x for x, _ in pts], [y for _, y in pts], s=8, alpha=0.5, color="tab:purple")
            if max(abs(x) for x, _ in pts) > 500.0:  # PCIe and memory traffic change by orders of magnitude
                ax.set_xscale("symlog", linthresh=10.0)
                scale = ", symlog scale"
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"{p}: {PARAMETER_NAMES[p]}", fontsize=10)
        ax.set_xlabel(f"change of {p} vs solo (%{scale})", fontsize=9)
        ax.set_ylabel("interference rate (%)", fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Percent change of each GPU parameter vs interference rate ({len(labelled)} observations)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(labelled)


def plot_leaderboard(leaderboards: Sequence[Leaderboard], path: Path) -> int:
    series = best_errors_over_time(leaderboards)
    if not series:
        return 0
    plt = _plt()
    panels = sorted({k[0] for k in series})
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    t0 = min(ts for s in series.values() for ts, _ in s)
    for ax, panel in zip(axes[0], panels, strict=True):
        values = [v for (pn, _), pts in series.items() if pn == panel for _, v in pts]
        log_scale = min(values) > 0 and max(values) / min(values) > 20.0
        for cat in CATEGORIES:
            pts = series.get((panel, cat))
            if pts:
                ax.plot([(ts - t0) / 60.0 for ts, _ in pts], [v for _, v in pts], marker=".", label=f"category {cat}")
        ax.set_title(f"Best model's error, {panel} (models with ≥ 10 scored samples)", fontsize=10)
        ax.set_xlabel("time since the first leaderboard (min)")
        if log_scale:  # early errors of barely trained models dwarf the rest
            ax.set_yscale("log")
        ax.set_ylabel("MAE (points of interference %)" + (", log scale" if log_scale else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return sum(len(s) for s in series.values())


def plot_predicted_vs_measured(predictions: Sequence[Prediction], path: Path) -> int:
    pts = [p for p in predictions if p.measured_pct is not None]
    if not pts:
        return 0
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 6))
    for mode, colour in (("observed", "tab:orange"), ("placement", "tab:green")):
        xs = [p.measured_pct for p in pts if p.mode == mode]
        ys = [p.interference_pct for p in pts if p.mode == mode]
        if xs:
            mae = statistics.fmean(abs(x - y) for x, y in zip(xs, ys, strict=True))  # type: ignore[operator]
            ax.scatter(xs, ys, s=8, alpha=0.5, color=colour, label=f"{mode} mode (MAE {mae:.1f} points, n={len(xs)})")
    values = [v for p in pts for v in (p.measured_pct, p.interference_pct) if v is not None]
    lo, hi = min(values), max(values)
    ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1, label="perfect prediction")
    ax.set_xlabel("measured interference rate (%)")
    ax.set_ylabel("predicted interference rate (%)")
    ax.set_title("Predicted vs measured interference")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(pts)


def write_report(records: RunRecords, out_dir: Path, source: str = "") -> Path:
    """Write the PNGs and ``report.md`` into ``out_dir``; return the markdown's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = [
        ("Interference rate per job pair", "interference_by_pair.png", plot_pairs, records.observations, "labelled observations"),
        ("Percent changes vs interference rate", "pct_changes.png", plot_pct_changes, records.observations, "labelled observations"),
        ("Leaderboard errors over time", "leaderboard_errors.png", plot_leaderboard, records.leaderboards, "leaderboard records"),
        ("Predicted vs measured", "predicted_vs_measured.png", plot_predicted_vs_measured, records.predictions, "predictions with a measured rate"),
    ]  # fmt: skip
    labelled = [o.interference_pct for o in records.observations if o.interference_pct is not None]
    lines = [
        "# AIP report",
        "",
        f"Source: {source or 'records'}.  Observations: {len(records.observations)} ({len(labelled)} with a measured rate), "
        f"predictions: {len(records.predictions)}, leaderboard records: {len(records.leaderboards)}.",
        "",
    ]
    if labelled:
        lines += [
            f"Measured interference rate: mean {statistics.fmean(labelled):.1f} %, median {statistics.median(labelled):.1f} %, "
            f"max {max(labelled):.1f} %.",
            "",
        ]
    for title, name, plot, data, what in figures:
        path = out_dir / name
        path.unlink(missing_ok=True)
        n = plot(data, path)  # type: ignore[operator]
        lines.append(f"## {title}")
        lines.append("")
        lines.append(f"![{title}]({name})" if n else f"No {what} in the input: figure left out.")
        lines.append("")
    md = out_dir / "report.md"
    md.write_text("\n".join(lines))
    return md

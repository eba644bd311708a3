"""``aip evaluate DATASET``: the paper's offline method on a dataset (see models.evaluate)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from aip.errors import CliError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "evaluate",
        help="offline evaluation: error per model x category, AIP selection, time taken",
        description="Gavel throughput JSON, an observations CSV (docs/ARCHITECTURE.md, Dataset formats) or the paper's rows.",
    )
    p.add_argument("dataset", help="path to the dataset file, or a shipped one by name: gavel, paper, h200, h200-triples")
    p.add_argument("--gpu", help="GPU type / environment to evaluate (Gavel: k80, p100, v100; default v100)")
    p.add_argument("--mode", choices=("observed", "placement"), help="feature mode (default: what the dataset has)")
    p.add_argument(
        "--holdout", choices=("pair", "family"), default="pair",
        help="pair: no job set in training and test; family: every row involving a held-out job family "
        "(the job type without its batch size) left out of training (default pair)",
    )  # fmt: skip
    p.add_argument(
        "--folds", type=int, default=None,
        help="outer folds (default: 5 for pair, one per family for family, i.e. leave one family out)",
    )  # fmt: skip
    p.add_argument(
        "--inner-folds", type=int, default=None,
        help="folds of the inner selection, same scheme (default: 3 for pair, 2 for family)",
    )  # fmt: skip
    p.add_argument(
        "--probes", metavar="K[,K...]", type=_probes, default=None,
        help="family holdout only: reveal K job sets of each held-out family to training (seeded, the same for "
        "every candidate) and score the rest, once per K; the JSON gains by_probes (K=0: the plain family holdout; "
        "the other figures are the first K's)",
    )  # fmt: skip
    p.add_argument(
        "--probe-seed", type=int, default=None,
        help="--probes: the seed of the draw of the revealed job sets (default --seed); the folds stay --seed's, so "
        "several draws measure how much the figures depend on which job sets were revealed",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", help="comma-separated subset of the batch zoo (default: all)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.add_argument("--report", metavar="DIR", help="write plots and a markdown summary to DIR")
    p.set_defaults(func=run)


def _probes(text: str) -> list[int]:
    """``--probes``: distinct non-negative integers, in the order given.

    >>> _probes("0,2,4")
    [0, 2, 4]
    """
    try:
        ks = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--probes takes comma-separated integers, not {text!r}") from None
    if any(k < 0 for k in ks) or len(set(ks)) != len(ks):
        raise argparse.ArgumentTypeError(f"--probes takes distinct integers >= 0, not {text!r}")
    return ks


def _progress(t0: float) -> Any:
    def say(message: str) -> None:
        print(f"[evaluate {time.monotonic() - t0:6.1f}s] {message}", file=sys.stderr, flush=True)

    return say


def run(args: argparse.Namespace) -> int:
    from models.datasets import DatasetError, load
    from models.evaluate import evaluate
    from models.evaluate_report import probe_summary, table, write_probes_plot, write_report

    t0 = time.monotonic()
    try:
        dataset = load(args.dataset, args.gpu)
    except DatasetError as exc:
        raise CliError(str(exc), 2) from exc
    mode = args.mode or dataset.modes[0]
    if mode not in dataset.modes:
        raise CliError(f"{args.dataset}: no {mode}-mode features (has: {', '.join(dataset.modes)})", 2)
    if (args.folds is not None and args.folds < 2) or (args.inner_folds is not None and args.inner_folds < 2):
        raise CliError("--folds and --inner-folds must be at least 2", 2)
    from models.zoo import BATCH

    models = tuple(m.strip() for m in args.models.split(",")) if args.models else BATCH
    unknown = [m for m in models if m not in BATCH]
    if unknown:
        raise CliError(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(BATCH)}", 2)
    if args.probe_seed is not None and args.probes is None:
        raise CliError("--probe-seed draws the job sets --probes reveals: it needs --probes", 2)
    if args.probes is not None and args.holdout != "family":
        raise CliError("--probes reveals job sets of held-out families: it needs --holdout family", 2)
    say = _progress(t0)
    evs = []
    try:
        for i, probes in enumerate(args.probes or [0]):
            if args.probes is not None:
                say(f"probes K={probes}")
            evs.append(evaluate(
                dataset, mode, k=args.folds, inner_k=args.inner_folds, seed=args.seed, models=models,
                holdout=args.holdout, probes=probes, probe_seed=args.probe_seed, report_table=i == 0, progress=say,
            ))  # fmt: skip
    except ValueError as exc:
        raise CliError(f"{args.dataset}: {exc}", 2) from exc
    ev = evs[0]
    summary = ev.summary()
    if args.probes is not None:
        summary["by_probes"] = {str(e.probes): probe_summary(e) for e in evs}
    print(f"{ev.dataset}  mode={mode}  holdout={ev.holdout}  target={ev.target}  rows={ev.rows}  groups={ev.groups}")
    print(f"CV MAE in points ({ev.holdout} holdout, all rows; relative error), * = AIP's choice on all rows")
    print(table(ev))
    print(
        f"selected: {ev.selected.model} (category {ev.selected.category})  nested held-out MAE {ev.mae:.2f}"
        f"  relative error {summary['relative_error']}  baselines: median {summary['median_baseline_mae']},"
        f" job identity (one-hot RF) {summary['baseline_mae']}"
    )
    print(
        f"outer folds chose: {', '.join(ev.outer_choices)}\n"
        f"90 % conformal intervals: coverage {summary['interval_coverage']}, mean width {summary['interval_width_mean']}"
    )
    print(f"selection {ev.selection_seconds:.2f} s, total {ev.seconds:.2f} s")
    if args.probes is not None:
        print(f"{'probes K':>9} {'scored':>7} {'MAE':>7} {'median':>7} {'identity':>9} {'MAE/median':>11} {'coverage':>9}")
        for e in evs:
            b = probe_summary(e)
            print(
                f"{e.probes:>9} {e.scored_rows:>7} {b['mae']:>7} {b['median_baseline_mae']:>7} {b['baseline_mae']!s:>9}"
                f" {b['mae_over_median']!s:>11} {b['interval_coverage']!s:>9}"
            )
    if args.report:
        files = write_report(ev, dataset.samples, Path(args.report))
        if args.probes is not None:
            files.append(write_probes_plot(evs, Path(args.report)))
        print(f"report: {', '.join(str(f) for f in files)}")
    if args.json:
        print(json.dumps(summary, allow_nan=False))
    return 0

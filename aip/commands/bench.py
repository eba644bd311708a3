"""``aip bench``: the performance harness (docs/BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import json
import platform
import time
from typing import Any

from aip.bench import ALONE, COUNTED, PARTS, run_part, run_side_by_side


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="run the benchmarks")
    p.add_argument(
        "part",
        nargs="?",
        default="all",
        choices=(*PARTS, *ALONE, "all"),
        help="which part (default all; fleet and serving only when named)",
    )
    p.add_argument("--quick", action="store_true", help="about a minute per part")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--plot-dir", metavar="DIR", help="parts that draw (accuracy, fleet) write their PNG here")
    p.add_argument("--gpus", type=int, help="fleet: GPUs of the one environment (default 10,000; --quick 2,000)")
    p.add_argument("--workers", type=int, help="fleet: stream workers (default 2)")
    p.add_argument(
        "--serving", choices=("sharded", "stage2"), help="fleet: where the workers serve predictions (default sharded)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    parts = PARTS if args.part == "all" else (args.part,)
    result: dict[str, Any] = {"quick": args.quick, "machine": f"{platform.machine()} {platform.processor() or ''}".strip()}
    t0 = time.monotonic()
    side_by_side = COUNTED if args.part == "all" and args.quick else ()
    for part in parts:
        if part not in side_by_side:
            result.update(
                run_part(part, args.quick, plot_dir=args.plot_dir, gpus=args.gpus, workers=args.workers, serving=args.serving)
            )
    if side_by_side:
        result.update(run_side_by_side(side_by_side, args.quick, plot_dir=args.plot_dir))
    result["bench_seconds"] = round(time.monotonic() - t0, 1)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:36} {json.dumps(value)}")
    return 0

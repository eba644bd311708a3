"""Where a worker's CPU goes: py-spy's collapsed stacks (``py-spy record --format raw``) by part of the pipeline.

``python scripts/profile_breakdown.py FOLDER [--gpu-samples N]``: for each ``w*.txt`` in FOLDER (what
``AIP_BENCH_FLEET_PROFILE`` writes, see ``aip/bench/fleet_harness.py``), every sample is given to the first part whose
pattern a frame of its stack matches, the parts tried in the order of :data:`PARTS` (the innermost project work first:
a decode inside serving is decode).  Prints the share of each part over all workers, and with ``--gpu-samples`` (the
run's ``gpu_samples_sent``) and ``--rate`` (py-spy's, default 67 Hz), the CPU milliseconds per GPU sample of each.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

IDLE = re.compile(r"(^|;)[\w.<>]*(select|wait|sleep|_wait_for_tstate_lock|get) \((selectors|threading|queue)\.py:\d+\)$")
"""A stack whose innermost frame waits: left out (py-spy's ``--nonblocking`` cannot tell idle threads)."""
PARTS: tuple[tuple[str, str], ...] = (
    ("imports (first use of a library)", r"importlib\._bootstrap"),
    ("stage-2 refits (executor threads)", r"concurrent/futures/thread\.py|run_refit \(models/refit\.py"),
    ("stage-2 learning (online learners, candidates' tests, selection)", r"(Stage2\.learn|EnvironmentModels\.learn\w*) \("),
    ("stage-1 decode (msgspec, batch envelope)", r"\((events/(codec|records|batches|__init__)\.py|msgspec)"),
    ("prometheus metrics", r"\((streams/(metrics|interference_metrics)\.py|prometheus_client/)"),
    ("changelog and checkpoint", r"\(streams/(changelog|checkpoint|state|commits)\.py"),
    ("serving (predictions, what-if, alerts)", r"\((streams/(serving|whatif|hysteresis|stage2_loop)\.py|models/)"),
    ("snapshots", r"\(streams/snapshots\.py"),
    ("solo profiles", r"\(streams/profiles\.py"),
    ("stage-1 windows (on_metric, on_job, close)", r"\(streams/(stage1|windows|features)\.py"),
    ("publishing (outputs, dead letters)", r"\(streams/(outputs|deadletters)\.py"),
    ("stage-1 loop (inputs)", r"\(streams/inputs\.py"),
    ("kafka-python threads (readers, followers)", r"\(kafka/"),
    ("consumer/producer machinery (faust, aiokafka, mode, asyncio)", r"\((faust|aiokafka|mode|asyncio|venusian|yarl|aiohttp)/"),
)


def parse(path: Path) -> Counter[str]:
    """Samples per part of one collapsed-stack file (a stack matching no part: ``other``)."""
    counts: Counter[str] = Counter()
    compiled = [(name, re.compile(pat)) for name, pat in PARTS]
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit() or IDLE.search(stack):
            continue
        part = next((name for name, pat in compiled if pat.search(stack)), "other")
        counts[part] += int(n)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--gpu-samples", type=int)
    ap.add_argument("--rate", type=float, default=67.0)
    args = ap.parse_args()
    total: Counter[str] = Counter()
    for f in sorted(args.folder.glob("w*.txt")):
        total.update(parse(f))
    n = sum(total.values())
    print(f"{n} samples of {len(list(args.folder.glob('w*.txt')))} workers")
    for part, c in total.most_common():
        ms = f"  {1000.0 * c / args.rate / args.gpu_samples:.4f} ms/GPU sample" if args.gpu_samples else ""
        print(f"{100.0 * c / n:5.1f} %  {part}{ms}")


if __name__ == "__main__":
    main()

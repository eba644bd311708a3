"""The benchmark harness: ``aip bench PART``.

Each part is a module ``aip.bench.<part>`` with ``run(quick: bool, progress: Progress) -> dict``
returning the keys docs/BENCHMARKS.md describes for that part.
"""

from __future__ import annotations

import sys
import time
from typing import Any

PARTS = ("producers", "stage1", "stage2", "e2e", "models", "accuracy", "placement", "faults")
"""What ``aip bench all`` runs."""
COUNTED = ("accuracy", "placement", "faults")
"""Parts whose figures are errors and counts against a reference, not times or rates: ``aip bench all --quick``
runs them side by side, each in a process of its own, after the others have run one at a time."""
ALONE = ("fleet", "serving")
"""Parts run only when named (``fleet``: minutes of real time, N GPUs; ``serving``: stage 2 split as with
``serving`` sharded, learning vs serving)."""


class Progress:
    """Progress lines on stderr (stdout stays clean for --json)."""

    def __init__(self, part: str, enabled: bool = True) -> None:
        self.part = part
        self.enabled = enabled
        self.t0 = time.monotonic()

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"[bench {self.part} {time.monotonic() - self.t0:6.1f}s] {message}", file=sys.stderr, flush=True)


def run_part(part: str, quick: bool, progress: bool = True, plot_dir: str | None = None, **options: Any) -> dict[str, Any]:
    """Run one part; ``plot_dir`` and ``options`` (``gpus``, ``workers``) go to the parts whose ``run`` takes them
    (options left None are not passed)."""
    import importlib
    import inspect

    module = importlib.import_module(f"aip.bench.{part}")
    takes = inspect.signature(module.run).parameters
    extra = {k: v for k, v in {"plot_dir": plot_dir, **options}.items() if v is not None and k in takes}
    result: dict[str, Any] = module.run(quick=quick, progress=Progress(part, progress), **extra)
    return result


def run_side_by_side(parts: tuple[str, ...], quick: bool, plot_dir: str | None = None) -> dict[str, Any]:
    """Each part in a child ``aip bench PART --json`` at once; their progress lines go to this stderr, and
    their JSON objects are merged in ``parts``' order.  A part that fails is an error, as when run alone."""
    import json
    import subprocess

    flags = [*(["--quick"] if quick else []), "--json", *(["--plot-dir", plot_dir] if plot_dir else [])]
    children = {
        part: subprocess.Popen([sys.executable, "-m", "aip.cli", "bench", part, *flags], stdout=subprocess.PIPE, text=True)
        for part in parts
    }
    result: dict[str, Any] = {}
    failed = []
    for part, child in children.items():
        out, _ = child.communicate()
        lines = out.strip().splitlines()
        if child.returncode != 0 or not lines:
            failed.append(f"{part} (exit {child.returncode})")
            continue
        for key, value in json.loads(lines[-1]).items():
            if key not in ("quick", "machine", "bench_seconds"):
                result[key] = value
    if failed:
        raise RuntimeError(f"bench parts failed: {', '.join(failed)}; their output is above")
    return result

"""The benchmark harness: ``aip bench PART``.

Each part is a module ``aip.bench.<part>`` with ``run(quick: bool, progress: Progress) -> dict``
returning the keys of DESIGN.md's benchmark contract for that part.
"""

from __future__ import annotations

import sys
import time
from typing import Any

PARTS = ("producers", "stage1", "e2e", "models", "accuracy", "placement", "faults")


class Progress:
    """Progress lines on stderr (stdout stays clean for --json)."""

    def __init__(self, part: str, enabled: bool = True) -> None:
        self.part = part
        self.enabled = enabled
        self.t0 = time.monotonic()

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"[bench {self.part} {time.monotonic() - self.t0:6.1f}s] {message}", file=sys.stderr, flush=True)


def run_part(part: str, quick: bool, progress: bool = True, plot_dir: str | None = None) -> dict[str, Any]:
    """Run one part; ``plot_dir`` goes to the parts that draw (their ``run`` takes it)."""
    import importlib
    import inspect

    module = importlib.import_module(f"aip.bench.{part}")
    extra = {"plot_dir": plot_dir} if plot_dir and "plot_dir" in inspect.signature(module.run).parameters else {}
    result: dict[str, Any] = module.run(quick=quick, progress=Progress(part, progress), **extra)
    return result

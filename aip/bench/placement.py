"""``aip bench placement``: random vs least-loaded vs prediction-guided placement (see placement.experiment)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def run(quick: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    from placement.experiment import Setup, run_experiment

    setup = Setup(jobs=160) if quick else Setup(jobs=400)
    seeds = range(5) if quick else range(10)
    progress(f"{len(seeds)} seeds x {setup.jobs} jobs on {setup.gpus} simulated {setup.gpu_model} GPUs, three policies")
    return run_experiment(seeds, setup, progress)

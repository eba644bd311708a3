"""``aip bench placement``: random vs least-loaded vs prediction-guided placement (see placement.experiment)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

UNSEEN_FAMILIES = ("recommendation", "resnet-50")
"""Families the training fleet of the second run never runs (2 of Gavel's 7, 8 of its 26 job types)."""


def run(quick: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    """The placement experiment, then the same with a training fleet that never ran :data:`UNSEEN_FAMILIES`
    (the evaluated arrivals include them): ``placement.unseen_families`` reports guided against least-loaded
    and random separately for jobs of seen and unseen families, and guided placement with novel types
    predicted (ranked by their upper end) against withholding them, and exploring against not while the models
    learn the run's co-locations."""
    import dataclasses

    from placement.experiment import Setup, run_experiment

    setup = Setup(jobs=160) if quick else Setup(jobs=400)
    seeds = range(5) if quick else range(10)
    progress(f"{len(seeds)} seeds x {setup.jobs} jobs on {setup.gpus} simulated {setup.gpu_model} GPUs, three policies")
    out = run_experiment(seeds, setup, progress)
    hidden = dataclasses.replace(setup, unseen_families=UNSEEN_FAMILIES, learning=True)
    progress(f"again, the training fleet never running {', '.join(UNSEEN_FAMILIES)}")
    out["placement"]["unseen_families"] = run_experiment(seeds, hidden, progress)["placement"]
    return out

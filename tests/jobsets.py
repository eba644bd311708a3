"""A stream of job sets whose answer is known, for the tests of composition (models/compose.py) and derivation
(models/derive.py): five types whose solo SM utilisation (``SENS``) sets their pairwise slowdown, and each co-runner
taking its share of the job's time, ``(1 + s_a)(1 + s_b) - 1``."""

from __future__ import annotations

import math
from collections.abc import Callable

from models.datasets import Sample
from models.modelconfig import ModelConfig

SENS = {f"net{i} (batch size 8)": 10.0 + 12.0 * i for i in range(5)}
"""Each type's solo SM utilisation; the pairwise slowdown grows with both (the answer the stream is built on)."""
FAST = ModelConfig(online_models=("river.LinearRegression",), batch_models=("ExtraTrees", "LinearRegression"), final_fits=2)


def profile(s: float) -> dict[str, float]:
    return {"S": s, "V": s / 2, "E": 100 + s, "M": 1000.0, "throughput": 10.0}


def composed_pct(pair_pct: Callable[[str, str], float], job: str, co: list[str]) -> float:
    """``job``'s slowdown next to ``co``: each co-runner's pair slowdown ``pair_pct(job, c)`` in turn."""
    return (math.prod(1 + pair_pct(job, c) / 100 for c in co) - 1) * 100


def sample(job: str, co: list[str], y: float) -> Sample:
    key = " + ".join(sorted((job, *co)))
    return Sample(job, tuple(co), y, key, "v100", {}, profile(SENS[job]), tuple(profile(SENS[c]) for c in co))

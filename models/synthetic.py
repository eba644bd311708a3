"""Synthetic observation streams built on real Gavel pairs (for benchmarks and tests).

Each observation is one job of a real Gavel pair on one GPU type (its measured
slowdown plus noise), with its solo profiles, and percent changes of the six
parameters made to correlate with the slowdown (Gavel measured none).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from events import PARAMETERS, Observation
from models.datasets import BUILTIN, load_gavel

GAVEL = BUILTIN["gavel"]
_GAIN = {"E": 0.6, "T": 0.2, "S": -0.4, "V": -0.3, "R": 0.8, "W": 0.9}


def gavel_observations(
    n: int, *, gpu: str = "v100", seed: int = 0, path: Path = GAVEL, drift_at: int | None = None
) -> list[Observation]:
    """``n`` labelled observations drawn from Gavel pairs; after ``drift_at`` the slowdowns double."""
    ds = load_gavel(path, gpu)
    rng = random.Random(seed)
    out = []
    t = 1_700_000_000.0
    for i in range(n):
        s = rng.choice(ds.samples)
        y = s.target * (2.0 if drift_at is not None and i >= drift_at else 1.0) + rng.gauss(0.0, 1.0)
        pct = {p: _GAIN[p] * y + rng.gauss(0.0, 3.0) for p in PARAMETERS}
        solo = {k: v for k, v in s.solo.items() if v is not None and math.isfinite(v)}
        out.append(
            Observation(
                window_start=t + i, window_end=t + i + 1, gpu_uuid=f"GPU-{i % 8}", environment=gpu, job_id=f"j{i}",
                job_type=s.job_type, co_job_types=list(s.co_job_types),
                E_pct=pct["E"], T_pct=pct["T"], S_pct=pct["S"], V_pct=pct["V"], R_pct=pct["R"], W_pct=pct["W"],
                solo=solo, co_solo=[dict(c) for c in s.co_solos], interference_pct=y,
            )
        )  # fmt: skip
    return out

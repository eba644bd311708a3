"""Live 90 % intervals (models.environment, models.intervals): rolling prequential residuals and conformal CV offsets."""

from __future__ import annotations

import math
import shutil

import numpy as np

from models.datasets import Sample
from models.environment import EnvironmentModels
from models.modelconfig import ModelConfig

SMALL = ModelConfig(
    batch_models=("LinearRegression",), online_models=("river.LinearRegression",), refit_rows=300, refit_every=200, folds=3
)


def _sample(rng: np.random.Generator, i: int, shift: int = 5) -> Sample:
    """Slowdown = 2 x the job's SM percent change + N(0, 5): the best a model can do is a 90 % interval
    of about 2 x 1.645 x 5 = 16.4 points.  The co-runner is ``shift`` job types on (5 while learning: other
    shifts are job sets never measured, of job types measured)."""
    s = float(rng.uniform(0, 40))
    job, co = f"j{i % 12}", (f"j{(i + shift) % 12}",)
    pcts = {"E": s, "T": 0.0, "S": s, "V": 0.0, "R": 0.0, "W": 0.0}
    solo = {"S": s, "M": 1000.0, "throughput": 1.0}
    return Sample(job, co, 2 * s + float(rng.normal(0, 5)), " + ".join(sorted((job, *co))), "h", pcts, solo, (solo,))


def test_live_intervals_cover_about_90_percent_and_survive_save_load(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(4)
    em = EnvironmentModels("h", config=SMALL)
    for i in range(400):
        em.learn_sample(_sample(rng, i))
        if em.refit_due():
            em.refit_now()
    inside, widths = [], []
    for i in range(400, 800):
        smp = _sample(rng, i)
        r = em.predict_sample(smp, "observed")
        assert r is not None and r.interval_pct is not None
        lo, hi = r.interval_pct
        assert lo <= r.interference_pct <= hi
        inside.append(lo <= smp.target <= hi)
        widths.append(hi - lo)
        em.learn_sample(smp)
    assert 0.84 <= float(np.mean(inside)) <= 0.96
    assert 12.0 <= float(np.mean(widths)) <= 24.0
    # job sets never measured: 90 % too, from the conformal offsets of the last refit's out-of-fold residuals
    inside, widths = [], []
    for i in range(400):
        smp = _sample(rng, i, shift=7)
        r = em.predict_sample(smp, "observed")
        assert r is not None and r.regime == "new" and r.interval_pct is not None
        lo, hi = r.interval_pct
        assert lo <= r.interference_pct <= hi
        inside.append(lo <= smp.target <= hi)
        widths.append(hi - lo)
    assert 0.84 <= float(np.mean(inside)) <= 0.96, float(np.mean(inside))
    assert 12.0 <= float(np.mean(widths)) <= 24.0, float(np.mean(widths))
    # new job sets get the conformal offsets of the last refit's out-of-fold residuals
    offsets = [c.record.offsets for c in em.candidates.values() if c.record.offsets is not None]
    assert offsets and all(math.isfinite(lo) and lo < 0 < hi for lo, hi in offsets)
    em.save(tmp_path / "state" / "h")
    loaded = EnvironmentModels.load(tmp_path / "state" / "h")
    probe = _sample(rng, 900)
    assert loaded.predict_sample(probe, "observed") == em.predict_sample(probe, "observed")
    shutil.rmtree(tmp_path / "state")


def test_scaled_intervals_widen_where_the_rows_are_harder() -> None:
    """Residuals whose scale grows with the rows' spread: plain split-conformal covers the easy rows always and
    the hardest ones too rarely; scaled by the spread, the hard rows are covered far more often, at the same
    overall coverage."""
    from models.intervals import conformal_offsets, scaled_offsets

    rng = np.random.default_rng(7)
    spread = rng.uniform(0, 20, 4000)
    r = (1 + spread) * rng.normal(0, 1, 4000)
    cal, new = slice(0, 2000), slice(2000, 4000)
    lo, hi = conformal_offsets(r[cal])
    plain = (r[new] >= lo) & (r[new] <= hi)
    slo, shi, beta = scaled_offsets(r[cal], spread[cal])
    scaled = (r[new] >= slo * (spread[new] + beta)) & (r[new] <= shi * (spread[new] + beta))
    hard = spread[new] > 15
    assert plain[hard].mean() < 0.8 and plain[~hard].mean() > 0.95
    assert scaled[hard].mean() > plain[hard].mean() + 0.05
    assert 0.87 <= scaled.mean() <= 0.93 and 0.87 <= plain.mean() <= 0.93

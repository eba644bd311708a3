"""The 90 % intervals of what-if entries (models/environment.py), on streams built so that the answer is known.

* A measured job set's what-if is an interval for its steady slowdown, not for one more window's measurement:
  narrower than the running job's, multiplicative.
* A job type never measured (``novel``) gets an interval at least as wide, multiplicatively, as the first
  measurements of the types measured so far were off by.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from models.datasets import Sample
from models.environment import EnvironmentModels
from models.modelconfig import ModelConfig

FAST = ModelConfig(online_models=("river.LinearRegression",), batch_models=("ExtraTrees", "LinearRegression"), final_fits=2)
NOISE = 0.01
"""Each window's measurement: the steady ``1 + slowdown`` times ``1 + N(0, NOISE)``."""


def _profile(s: float) -> dict[str, float]:
    return {"S": s, "V": s / 2, "E": 100 + s, "M": 1000.0, "throughput": 10.0}


def _sample(job: str, co: list[str], y: float, sens: dict[str, float]) -> Sample:
    key = " + ".join(sorted((job, *co)))
    return Sample(job, tuple(co), y, key, "v100", {}, _profile(sens[job]), tuple(_profile(sens[c]) for c in co))


def _measured(steady_pct: float, rng: np.random.Generator) -> float:
    return ((1 + steady_pct / 100) * (1 + float(rng.normal(0, NOISE))) - 1) * 100


def test_a_measured_job_sets_what_if_interval_is_narrower_than_a_windows_and_holds_its_steady_slowdown() -> None:
    rng = np.random.default_rng(1)
    sens = {f"net{i} (batch size 8)": 5.0 + 6.0 * i for i in range(10)}
    # each pair's own slowdown, growing with both types' but not as any model of the profiles has it: the last
    # measurements serve the job sets measured
    steady = {(a, b): (0.8 * sens[b] + 0.4 * sens[a]) * float(np.exp(rng.normal(0.0, 0.5))) for a in sens for b in sens}
    em = EnvironmentModels("v100", config=FAST)
    for _ in range(12):  # every pair measured a dozen times
        for (a, b), y in steady.items():
            em.learn_sample(_sample(a, [b], _measured(y, rng), sens))
    em.refit_now()
    asks = [(a, _profile(sens[a]), [b], [_profile(sens[b])]) for a, b in steady]
    what_ifs = em.predict_placements(asks)
    running = [em.predict_sample(_sample(a, [b], math.nan, sens), "placement") for a, b in steady]
    inside, inside_running = [], []
    for (pair, y), w, r in zip(steady.items(), what_ifs, running, strict=True):
        assert w is not None and r is not None and w.regime == r.regime == "seen", pair
        assert w.model == r.model == "baseline.last_measured", w
        assert w.interval_pct is not None and r.interval_pct is not None
        assert w.interference_pct == r.interference_pct  # the same last measurements: only the interval differs
        inside.append(w.interval_pct[0] <= y <= w.interval_pct[1])
        inside_running.append(r.interval_pct[0] <= y <= r.interval_pct[1])
    # the running job's interval is for its next window's measurement; the what-if's, for the steady slowdown, is
    # narrower and, with independent window noise, still holds it
    assert np.mean(inside) >= 0.9 and np.mean(inside_running) >= 0.9, (np.mean(inside), np.mean(inside_running))
    ratio = [
        (w.interval_pct[1] - w.interval_pct[0]) / (r.interval_pct[1] - r.interval_pct[0])
        for w, r in zip(what_ifs, running, strict=True)
        if w and r and w.interval_pct and r.interval_pct
    ]
    assert np.mean(ratio) < 0.8, np.mean(ratio)
    # multiplicative: a job set slowed more gets a wider interval
    width = {
        pair: w.interval_pct[1] - w.interval_pct[0] for pair, w in zip(steady, what_ifs, strict=True) if w and w.interval_pct
    }
    ranked = sorted(width, key=lambda pair: steady[pair])
    assert np.mean([width[p] for p in ranked[-20:]]) > 1.3 * np.mean([width[p] for p in ranked[:20]])


def test_a_novel_types_interval_is_as_wide_as_what_types_first_measured_were_off_by() -> None:
    """Types alike in their profiles but not in how they suffer: what the profile says of a type never measured is
    off by a factor its first measurements show, and the novel interval holds it."""
    rng = np.random.default_rng(2)
    names = [f"net{i} (batch size 8)" for i in range(24)]
    sens = {t: 20.0 + float(rng.uniform(-1.0, 1.0)) for t in names}  # profiles nearly the same
    harm = {t: float(np.exp(rng.normal(0.0, 0.6))) for t in names}  # a hidden factor of each type as the job

    def steady(a: str, b: str) -> float:
        return 40.0 * harm[a]

    em = EnvironmentModels("v100", config=FAST)
    known = names[:2]
    for _ in range(3):
        em.learn_sample(_sample(known[0], [known[1]], _measured(steady(*known), rng), sens))
        em.learn_sample(_sample(known[1], [known[0]], _measured(steady(*known[::-1]), rng), sens))
    for t in names[2:18]:  # each type measured, first as the job, next to a type measured before
        co = known[int(rng.integers(len(known)))]
        for _ in range(3):
            em.learn_sample(_sample(t, [co], _measured(steady(t, co), rng), sens))
            em.learn_sample(_sample(co, [t], _measured(steady(co, t), rng), sens))
        known.append(t)
        if em.refit_due():
            em.refit_now()
    assert em.novel_residuals.n >= 16
    lo_r, hi_r = min(em.novel_residuals.values), max(em.novel_residuals.values)
    novel = names[18:]
    asks = [(t, _profile(sens[t]), [k], [_profile(sens[k])]) for t in novel for k in known[:4]]
    got = em.predict_placements(asks)
    inside = []
    for (t, _, (k,), _), r in zip(asks, got, strict=True):
        assert r is not None and r.regime == "novel" and r.interval_pct is not None
        v, (lo, hi) = r.interference_pct, r.interval_pct
        # at least the multiplicative range of the first measurements' log-ratio residuals
        assert lo <= (1 + v / 100) * math.exp(lo_r) * 100 - 100 + 1e-6 and hi >= (1 + v / 100) * math.exp(hi_r) * 100 - 100 - 1e-6
        inside.append(lo <= steady(t, k) <= hi)
    assert np.mean(inside) >= 0.8, np.mean(inside)


def _population(
    n_types: int, n_measured: int, seed: int, max_pct: float = 1000.0
) -> tuple[EnvironmentModels, list[tuple], list[float]]:
    """An environment that measured ``n_measured`` types of a population (each type's slowdown as the job a hidden
    factor drawn from one distribution, log-normal), and the novel types' placement asks with their truths."""
    rng = np.random.default_rng(seed)
    names = [f"net{i} (batch size 8)" for i in range(n_types)]
    sens = {t: 20.0 + float(rng.uniform(-1.0, 1.0)) for t in names}
    harm = {t: float(np.exp(rng.normal(0.0, 0.6))) for t in names}
    em = EnvironmentModels("v100", config=dataclasses.replace(FAST, max_pct=max_pct))
    known = names[:2]
    for _ in range(3):
        em.learn_sample(_sample(known[0], [known[1]], _measured(40.0 * harm[known[0]], rng), sens))
        em.learn_sample(_sample(known[1], [known[0]], _measured(40.0 * harm[known[1]], rng), sens))
    for t in names[2:n_measured]:
        co = known[int(rng.integers(len(known)))]
        for _ in range(3):
            em.learn_sample(_sample(t, [co], _measured(40.0 * harm[t], rng), sens))
            em.learn_sample(_sample(co, [t], _measured(40.0 * harm[co], rng), sens))
        known.append(t)
        if em.refit_due():
            em.refit_now()
    asks = [(t, _profile(sens[t]), [k], [_profile(sens[k])]) for t in names[n_measured:] for k in known[:4]]
    return em, asks, [40.0 * harm[t] for t in names[n_measured:] for _ in known[:4]]


def test_a_novel_types_interval_covers_a_first_measurement_drawn_from_the_population() -> None:
    """With the first measurements of many types seen, a novel type's interval is bounded and holds what a type
    drawn from the same population measures first, about 90 % of the time."""
    em, asks, truths = _population(64, 44, seed=5)
    got = em.predict_placements(asks)
    inside = []
    for r, y in zip(got, truths, strict=True):
        assert r is not None and r.regime == "novel" and r.interval_pct is not None
        lo, hi = r.interval_pct
        assert math.isfinite(hi), r  # enough first measurements: an upper end is supported
        inside.append(lo <= y <= hi)
    assert np.mean(inside) >= 0.8, np.mean(inside)


def test_a_novel_interval_is_unbounded_where_history_is_thin_and_never_ends_past_the_bound() -> None:
    em, asks, _ = _population(10, 4, seed=6)  # two types' first measurements: too few for a 90 % upper end
    for r in em.predict_placements(asks):
        assert r is not None and r.regime == "novel" and r.interval_pct is not None and math.isinf(r.interval_pct[1])
    em, asks, _ = _population(64, 44, seed=5, max_pct=45.0)  # a bound the population's slowdowns pass
    ends = [v for r in em.predict_placements(asks) if r is not None and r.interval_pct for v in r.interval_pct]
    assert any(math.isinf(v) for v in ends)  # past the bound: unbounded, not clipped to it
    assert all(-100.0 <= v <= 45.0 for v in ends if math.isfinite(v))

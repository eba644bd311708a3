"""models.newcomer and the live ``Newcomer`` candidate: what was measured of a job type, as the
job and as a co-runner, carried to its job sets never measured."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from records import trained_on_pairs

from models.candidates import NewcomerCandidate
from models.environment import EnvironmentModels
from models.modelconfig import ModelConfig
from models.newcomer import Newcomer, Role, roles
from models.views import CandidateKey, Views

SPAN = 40.0
"""How much more the newcomer slows down as the job than its solo profile says (the answer the stream is built on)."""


def _profile(s: float) -> dict[str, float]:
    return {"S": s, "V": s / 2, "E": 100 + s, "M": 1000.0, "throughput": 10.0}


KNOWN = {f"net{i} (batch size 8)": 10.0 + 12.0 * i for i in range(6)}
NEW = "fresh (batch size 8)"
"""Its solo profile is that of net2: nothing in its features tells it apart."""


def _truth(job: str, co: str) -> float:
    s = {**KNOWN, NEW: KNOWN["net2 (batch size 8)"]}
    return 0.5 * s[co] + 0.2 * s[job] + (SPAN if job == NEW else 0.0)


def _sample(job: str, co: str, rng: np.random.Generator):  # type: ignore[no-untyped-def]
    from models.datasets import Sample

    s = {**KNOWN, NEW: KNOWN["net2 (batch size 8)"]}
    y = _truth(job, co) + float(rng.normal(0, 0.5))
    return Sample(job, (co,), y, " + ".join(sorted((job, co))), "v100", {}, _profile(s[job]), (_profile(s[co]),))


def _trained(config: ModelConfig) -> EnvironmentModels:
    rng = np.random.default_rng(0)
    em = trained_on_pairs(EnvironmentModels("v100", config=config), sorted(KNOWN), 12, lambda a, b: _sample(a, b, rng))
    # the newcomer's first measurements, after the refit: as the job next to two co-runners
    for _ in range(4):
        for co in ("net0 (batch size 8)", "net5 (batch size 8)"):
            em.learn_sample(_sample(NEW, co, rng))
    return em


FAST = ModelConfig(online_models=("river.LinearRegression",), batch_models=("ExtraTrees", "LinearRegression"), final_fits=2)


def test_a_type_measured_with_two_co_runners_is_predicted_next_to_a_third_better_than_the_feature_model() -> None:
    em = _trained(FAST)
    cand = em.candidates[CandidateKey("placement", "all", "Newcomer")]
    assert isinstance(cand, NewcomerCandidate) and cand.servable and cand.estimator.base_key.model == "ExtraTrees"
    rng = np.random.default_rng(1)
    for third in ("net1 (batch size 8)", "net3 (batch size 8)", "net4 (batch size 8)"):
        views = Views(_sample(NEW, third, rng))
        truth = _truth(NEW, third)
        feature_model = cand.estimator.base_pct(views)
        newcomer = cand.predict_one(views)
        assert newcomer is not None
        # the feature model reads the newcomer as net2 (its profile): about SPAN too low
        assert truth - feature_model > 0.6 * SPAN
        # 8 measurements, prior 2: 80 % of the span carried over, within noise
        assert abs(truth - newcomer) < 0.35 * SPAN, (third, truth, feature_model, newcomer)
        assert abs(truth - newcomer) < 0.5 * abs(truth - feature_model)
    # a known type next to a known co-runner keeps the feature model's prediction
    views = Views(_sample("net1 (batch size 8)", "net3 (batch size 8)", rng))
    assert cand.predict_one(views) == pytest.approx(cand.estimator.base_pct(views), abs=1.0)
    # it is a candidate like the others: scored prequentially in both regimes, on the leaderboard
    assert cand.record.errors["new"].n > 0
    assert any(e.model == "Newcomer" and e.kind == "online" for e in em.leaderboard().entries)


def test_newcomer_candidate_round_trips_and_restarts_its_residuals_at_a_refit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    em = _trained(FAST)
    views = Views(_sample(NEW, "net3 (batch size 8)", np.random.default_rng(2)))
    key = CandidateKey("placement", "all", "Newcomer")
    before = em.candidates[key].predict_one(views)
    em.save(tmp_path / "v100")
    again = EnvironmentModels.load(tmp_path / "v100")
    assert again.candidates[key].predict_one(views) == pytest.approx(before)
    again.refit_now()  # the new batch model has learned the newcomer's rows: the residuals start afresh
    est = again.candidates[key].estimator
    assert est.residuals.observations == 0 and est.base is again.candidates[CandidateKey("placement", "all", "ExtraTrees")].estimator
    off = EnvironmentModels("v100", config=dataclasses.replace(FAST, newcomer=False))
    assert key not in off.candidates


def test_residual_model_learns_known_biases_online_and_in_batch() -> None:
    """residual = victim bias + aggressor bias, shrunk by n / (n + prior): both fits recover it."""
    rng = np.random.default_rng(3)
    types = [Role(f"t{i}", f"f{i // 2}") for i in range(8)]
    bv = {t.job_type: float(rng.normal(0, 10)) for t in types}
    ba = {t.job_type: float(rng.normal(0, 10)) for t in types}
    rows = [(v, [a], bv[v.job_type] + ba[a.job_type] + float(rng.normal(0, 0.5))) for v in types for a in types] * 3
    spread = float(np.mean([abs(r) for _, _, r in rows]))
    online = Newcomer(rank=0, prior=0.5)
    for v, a, r in rows:
        online.learn_one(v, a, r)
    batch = Newcomer(rank=0, prior=0.5).fit(rows)
    for m in (online, batch):
        err = float(np.mean([abs(m.predict_one(v, a) - r) for v, a, r in rows]))
        assert err < 0.15 * spread, err
    # nothing measured of a type: no correction (the feature model stands)
    assert batch.predict_one(Role("other", "g"), [Role("x", "h")]) == 0.0
    with pytest.raises(ValueError, match="finite"):
        online.learn_one(*roles("a", ["b"]), math.nan)


def test_a_novel_type_with_a_solo_profile_is_predicted_from_it_with_a_wide_interval() -> None:
    """Item 4: never measured here, solo profile known: predicted (placement mode), regime novel, its interval at
    least the spread of every measured slowdown around their median; no profile, or observed mode: nothing."""
    em = _trained(FAST)
    profile = _profile(KNOWN["net3 (batch size 8)"])
    r = em.predict_placement("brand-new", profile, ["net1 (batch size 8)"], [_profile(KNOWN["net1 (batch size 8)"])])
    assert r is not None and r.regime == "novel" and r.interval_pct is not None
    median = em.candidates[CandidateKey("placement", "all", "baseline.median")].offsets("new", em.config.min_samples)
    assert median is not None
    lo, hi = r.interval_pct
    assert lo <= r.interference_pct + median[0] + 1e-9 and hi >= min(r.interference_pct + median[1], em.config.max_pct) - 1e-9
    known = em.predict_placement("net3 (batch size 8)", profile, ["net1 (batch size 8)"], [_profile(KNOWN["net1 (batch size 8)"])])
    assert known is not None and known.regime != "novel"
    assert em.predict_placement("brand-new", {}, ["net1 (batch size 8)"], [_profile(KNOWN["net1 (batch size 8)"])]) is None
    off = _trained(dataclasses.replace(FAST, predict_novel=False))
    assert off.predict_placement("brand-new", profile, ["net1 (batch size 8)"], [_profile(KNOWN["net1 (batch size 8)"])]) is None


def test_online_factors_stay_finite_on_residuals_of_hundreds_of_points() -> None:
    """Early residuals of a job set far beyond the feature model's range (hundreds of points): the factors' SGD
    steps are bounded (``max_step``), so they neither overflow nor swamp the biases."""
    m = Newcomer(rank=2, prior=2.0, seed=0)
    rng = np.random.default_rng(0)
    names = [f"t{i} (batch size 8)" for i in range(4)]
    for _ in range(400):
        job, co = rng.choice(names), list(rng.choice(names, size=2))
        m.learn_one(*roles(str(job), [str(c) for c in co]), float(rng.choice([-900.0, 900.0])))
    factors = np.array([*m.p.values(), *m.q.values()])
    assert np.isfinite(factors).all() and np.abs(factors).max() < 1e3
    assert all(math.isfinite(m.predict_one(*roles(a, [b]))) for a in names for b in names)

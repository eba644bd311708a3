"""A job set of three never measured, composed from its measured pairs (models/compose.py), on a stream built so
that the answer is known: each co-runner takes its share of the job's time, ``(1 + s_a)(1 + s_b) - 1``."""

from __future__ import annotations

import math

import numpy as np
from jobsets import FAST, SENS, composed_pct, profile, sample
from records import trained_on_pairs

from models.environment import EnvironmentModels
from models.modelconfig import ModelConfig


def _pair_pct(job: str, co: str) -> float:
    return 0.8 * SENS[co] + 0.4 * SENS[job]


def _truth(job: str, co: list[str]) -> float:
    return composed_pct(_pair_pct, job, co)


def test_a_three_job_set_never_measured_is_composed_from_its_pairs_better_than_the_feature_model() -> None:
    rng = np.random.default_rng(0)
    em = EnvironmentModels("v100", config=FAST)
    names = sorted(SENS)
    for _ in range(8):  # every pair measured, no job set of three
        for a in names:
            for b in names:
                em.learn_sample(sample(a, [b], _pair_pct(a, b) + float(rng.normal(0, 0.5))))
    em.refit_now()
    job, co = "net4 (batch size 8)", ["net3 (batch size 8)", "net4 (batch size 8)"]
    truth = _truth(job, co)
    feature_model = em.predict_sample(sample(job, co, math.nan), "placement", compose=False)
    served = em.predict_placement(job, profile(SENS[job]), co, [profile(SENS[c]) for c in co])
    assert feature_model is not None and served is not None
    assert feature_model.regime == served.regime == "new" and served.model.startswith("compose/")
    # the feature model knows pairs only, and a new job set is bounded to the slowdowns measured (pairs')
    assert truth - feature_model.interference_pct > 20.0
    assert abs(served.interference_pct - truth) < 3.0, (truth, feature_model.interference_pct, served.interference_pct)
    assert served.interval_pct is not None and served.interval_pct[0] <= truth <= served.interval_pct[1]


def test_the_composition_is_not_served_where_its_prequential_error_is_worse_and_the_interval_learns_that_error() -> None:
    rng = np.random.default_rng(0)
    names = sorted(SENS)
    em = trained_on_pairs(
        EnvironmentModels("v100", config=FAST),
        names,
        8,
        lambda a, b: sample(a, [b], _pair_pct(a, b) + float(rng.normal(0, 0.5))),
    )
    # a stream where a third job adds nothing: the pairs' composition over-predicts every job set of three
    for a in names[:-1]:  # net4 never the job of a set of three
        for b in names:
            for c in names:
                if b <= c:
                    em.learn_sample(sample(a, [b, c], max(_pair_pct(a, b), _pair_pct(a, c))))
    assert em.compose_scores[True].n >= FAST.min_samples and not em.compose_scores[True].serve_composed()
    job, co = "net4 (batch size 8)", ["net0 (batch size 8)", "net1 (batch size 8)"]
    served = em.predict_placement(job, profile(SENS[job]), co, [profile(SENS[c]) for c in co])
    assert served is not None and served.regime == "new" and not served.model.startswith("compose/")
    # its interval: at least as wide as the feature model's, and as what the sets of three measured first were off by
    own = em.predict_sample(sample(job, co, math.nan), "placement", compose=False)
    truth = max(_pair_pct(job, c) for c in co)
    assert own is not None and own.interval_pct is not None and served.interval_pct is not None
    assert served.interval_pct[0] <= own.interval_pct[0] and served.interval_pct[1] >= own.interval_pct[1]
    assert served.interval_pct[0] <= truth <= served.interval_pct[1], (truth, own.interval_pct, served.interval_pct)
    assert not own.interval_pct[0] <= truth <= own.interval_pct[1]  # the pairs' interval misses it


def test_a_three_job_set_with_a_pair_never_measured_is_composed_and_so_is_its_running_jobs_prediction() -> None:
    rng = np.random.default_rng(1)
    em = EnvironmentModels("v100", config=FAST)
    names = sorted(SENS)
    job, co = "net4 (batch size 8)", ["net3 (batch size 8)", "net2 (batch size 8)"]
    for _ in range(8):  # every pair but net4 next to net3
        for a in names:
            for b in names:
                if (a, b) != (job, co[0]):
                    em.learn_sample(sample(a, [b], _pair_pct(a, b) + float(rng.normal(0, 0.5))))
    em.refit_now()
    truth = _truth(job, co)
    feature_model = em.predict_sample(sample(job, co, math.nan), "placement", compose=False)
    served = em.predict_placement(job, profile(SENS[job]), co, [profile(SENS[c]) for c in co])
    running = em.predict_sample(sample(job, co, math.nan), "placement")  # what the running job is told
    assert feature_model is not None and served is not None and running is not None
    assert served.regime == "new" and served.model.startswith("compose/") and running.model == served.model
    assert abs(served.interference_pct - truth) < 5.0 < abs(feature_model.interference_pct - truth), (
        truth, feature_model.interference_pct, served.interference_pct,
    )  # fmt: skip


def test_a_composed_slowdown_compounds_past_the_bound_of_one_pair() -> None:
    em = EnvironmentModels("v100", config=ModelConfig(**{**FAST.__dict__, "max_pct": 60.0}))
    names = sorted(SENS)
    for _ in range(8):
        for a in names:
            for b in names:
                em.learn_sample(sample(a, [b], min(60.0, _pair_pct(a, b))))
    em.refit_now()
    job, co = "net4 (batch size 8)", ["net4 (batch size 8)", "net3 (batch size 8)"]
    served = em.predict_placement(job, profile(SENS[job]), co, [profile(SENS[c]) for c in co])
    assert served is not None and served.model.startswith("compose/")
    # each pair at the bound (60 %): a third of solo speed is 1.6 x 1.6 = 2.56 x the time, 156 %, not 60 %
    assert 150.0 < served.interference_pct <= 156.0 + 1e-9
    # a running job's own prediction keeps the bound (what stage 2 publishes as its slowdown: [-100, max_pct])
    running = em.predict_sample(sample(job, co, math.nan), "placement")
    assert running is not None and running.model.startswith("compose/") and running.interference_pct == 60.0 and running.clipped

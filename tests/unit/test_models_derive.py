"""A pair never measured, derived from measured job sets of three (models/derive.py), on a stream built so that the
answer is known: each co-runner takes its share of the job's time, and one pair slows its job far more than the
profiles say (what no feature model can know of a pair it never saw)."""

from __future__ import annotations

import numpy as np
from jobsets import FAST, SENS, composed_pct, profile, sample

from models.derive import DERIVED
from models.environment import EnvironmentModels

JOB, CO, OTHER = "net3 (batch size 8)", "net0 (batch size 8)", "net4 (batch size 8)"
"""The pair never measured, whose slowdown is 60 points more than the profiles say; JOB next to CO and OTHER never
measured either."""


def _pair_pct(job: str, co: str) -> float:
    return 0.8 * SENS[co] + 0.4 * SENS[job] + (60.0 if (job, co) == (JOB, CO) else 0.0)


def _truth(job: str, co: list[str]) -> float:
    return composed_pct(_pair_pct, job, co)


def _trained(rng: np.random.Generator) -> EnvironmentModels:
    em = EnvironmentModels("v100", config=FAST)
    names = sorted(SENS)
    for _ in range(6):  # every pair measured but JOB next to CO (and CO next to JOB); JOB next to CO and one other
        for a in names:
            for b in names:
                if {a, b} != {JOB, CO}:
                    em.learn_sample(sample(a, [b], _pair_pct(a, b) + float(rng.normal(0, 0.5))))
        for x in names:
            if x not in (JOB, CO, OTHER):
                em.learn_sample(sample(JOB, [CO, x], _truth(JOB, [CO, x]) + float(rng.normal(0, 0.5))))
    em.refit_now()
    return em


def test_a_pair_never_measured_is_derived_from_the_job_sets_of_three_it_was_measured_in() -> None:
    em = _trained(np.random.default_rng(0))
    truth = _pair_pct(JOB, CO)
    served = em.predict_placement(JOB, profile(SENS[JOB]), [CO], [profile(SENS[CO])])
    assert served is not None and served.regime == "new" and served.model == DERIVED
    assert abs(served.interference_pct - truth) < 2.0, (truth, served.interference_pct)
    # the feature models never saw the pair: they miss its 60 points
    em.compose_scores[True].n, em.compose_scores[True].composed_abs, em.compose_scores[True].served_abs = 100, 9.0, 1.0
    model = em.predict_placement(JOB, profile(SENS[JOB]), [CO], [profile(SENS[CO])])
    assert model is not None and model.model != DERIVED and truth - model.interference_pct > 20.0


def test_a_what_if_of_three_never_measured_is_composed_from_a_derived_pair() -> None:
    em = _trained(np.random.default_rng(1))
    co = [CO, OTHER]  # never measured; JOB next to OTHER alone was
    truth = _truth(JOB, co)
    served = em.predict_placement(JOB, profile(SENS[JOB]), co, [profile(SENS[c]) for c in co])
    assert served is not None and served.regime == "new" and served.model.startswith("compose/")
    assert abs(served.interference_pct - truth) < 4.0, (truth, served.interference_pct)
    em.compose_scores[True].n, em.compose_scores[True].composed_abs, em.compose_scores[True].served_abs = 100, 9.0, 1.0
    guessed = em.predict_placement(JOB, profile(SENS[JOB]), co, [profile(SENS[c]) for c in co])  # the pair a model's
    assert guessed is not None and guessed.model.startswith("compose/") and truth - guessed.interference_pct > 40.0

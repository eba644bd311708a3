"""The placement experiment with families the training fleet never ran (aip bench placement's second run)."""

from __future__ import annotations

import pytest


def test_training_never_sees_hidden_families_and_results_split_by_family() -> None:
    from placement.experiment import Setup, Truth, WhatIfService, family, run_seed, train_models, training_observations

    setup = Setup(jobs=40, gpus=4, train_gpus=6, train_duration_s=1200.0, unseen_families=("recommendation", "resnet-50"))
    truth = Truth(setup.gpu_model)
    obs = training_observations(setup, truth)
    assert obs and not any({family(t) for t in (o.job_type, *o.co_job_types)} & set(setup.unseen_families) for o in obs)
    everything = training_observations(Setup(train_gpus=6, train_duration_s=1200.0), truth)
    assert len(everything) > len(obs)  # the same fleet did run them: they were left out
    service = WhatIfService(train_models(setup, truth), truth)
    result = run_seed(3, setup, truth, service)
    for policy in ("random", "least_loaded", "guided", "guided_upper", "oracle"):
        seen, unseen = result[f"{policy}.seen"]["jobs"], result[f"{policy}.unseen"]["jobs"]
        assert unseen > 0 and seen + unseen == result[policy]["jobs"] == 40.0


def test_oracle_what_ifs_are_the_true_slowdowns() -> None:
    from placement.experiment import Truth, TruthService

    truth = Truth("v100")
    service = TruthService(truth)
    running = ["A3C"]
    entries = {e.job_type: e for e in service.what_if(running)}
    assert entries and set(entries) == {t for t in truth.types if truth.fits([*running, t])}
    # by hand, from Gavel's v100 measurements (producers/data/gavel_pairs.json): CycleGAN runs 4.7356 steps/s
    # alone and 3.1633 next to A3C; A3C runs 7.4796 alone and 4.5621 next to CycleGAN.  Slowdown = solo / paired - 1.
    assert entries["CycleGAN"].newcomer_pct == pytest.approx((4.735589112139888 / 3.1632656249608218 - 1) * 100)  # 49.71
    assert entries["CycleGAN"].existing_pct == pytest.approx((7.479619707470718 / 4.562135656281291 - 1) * 100)  # 63.95
    assert entries["CycleGAN"].newcomer_pct == pytest.approx(49.7057, abs=1e-4)
    assert entries["CycleGAN"].existing_pct == pytest.approx(63.9500, abs=1e-4)
    idle = {e.job_type: e for e in service.what_if([])}
    assert set(idle) == set(truth.types) and all(e.newcomer_pct == 0.0 == e.existing_pct for e in idle.values())

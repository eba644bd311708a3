"""The placement experiment with families the training fleet never ran (aip bench placement's second run)."""

from __future__ import annotations


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
    running = [truth.types[0]]
    entries = {e.job_type: e for e in service.what_if(running)}
    assert entries and set(entries) == {t for t in truth.types if truth.fits([*running, t])}
    t = next(iter(entries))
    pair = [*running, t]
    assert entries[t].newcomer_pct == (1.0 / truth.speed(pair, 1) - 1.0) * 100.0
    assert entries[t].existing_pct == (1.0 / truth.speed(pair, 0) - 1.0) * 100.0
    idle = {e.job_type: e for e in service.what_if([])}
    assert set(idle) == set(truth.types) and all(e.newcomer_pct == 0.0 == e.existing_pct for e in idle.values())

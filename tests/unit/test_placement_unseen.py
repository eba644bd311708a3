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
    for policy in ("random", "least_loaded", "guided", "guided_upper"):
        seen, unseen = result[f"{policy}.seen"]["jobs"], result[f"{policy}.unseen"]["jobs"]
        assert unseen > 0 and seen + unseen == result[policy]["jobs"] == 40.0

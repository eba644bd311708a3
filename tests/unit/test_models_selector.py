"""The AIP selector (models.environment.EnvironmentModels): learning, selection, refits, drift, persistence."""

from __future__ import annotations

import dataclasses
import functools
import math

import msgspec
import pytest

from events import CATEGORIES, Leaderboard
from models import persist
from models.datasets import BUILTIN
from models.environment import Config, EnvironmentModels, PredictionResult
from models.live import slot
from models.selection import grouped_folds

SMALL = Config(batch_models=("LinearRegression", "DecisionTree"), refit_rows=200, refit_every=150, folds=3, jobset_min=15)


@pytest.fixture
def stream(data_dir):  # type: ignore[no-untyped-def]
    return _stream(data_dir / "gavel" / "physical_cluster_throughputs.json")


GAVEL_PATH = BUILTIN["gavel"]


@functools.cache
def _stream(path, n: int = 400, seed: int = 3):  # type: ignore[no-untyped-def]
    from models.synthetic import gavel_observations

    return gavel_observations(n, seed=seed, path=path)


def test_unlabelled_is_noop_and_nothing_predicted_before_learning(stream) -> None:  # type: ignore[no-untyped-def]
    em = EnvironmentModels("v100", config=SMALL)
    assert em.predict(stream[0], "observed") is None
    em.learn(msgspec.structs.replace(stream[0], interference_pct=None))
    assert em.observations == 0 and not em.history
    assert em.predict_placement("A3C", {"throughput": 1.0}, ["LM"], [{"throughput": 2.0}]) is None


def test_learn_select_refit_and_leaderboard(stream) -> None:  # type: ignore[no-untyped-def]
    em = EnvironmentModels("v100", config=SMALL)
    for o in stream[:300]:
        em.learn(o)
    assert em.refit_due()
    task = em.refit_task()
    assert not em.refit_due()  # one refit in flight at a time
    before = em.observations
    result = task()
    assert em.observations == before  # the task touched no live state
    em.apply_refit(result)
    assert em.last_refit is not None and not em.refit_due()
    lb = em.leaderboard()
    assert isinstance(lb, Leaderboard) and lb.selection_seconds is not None
    kinds = {e.kind for e in lb.entries}
    assert kinds == {"online", "batch", "baseline"}
    assert set(lb.selected) == {f"{m}:{c}" for m in ("observed", "placement") for c in CATEGORIES}
    # batch models carry their grouped-CV error (what to expect on new job sets) beside the prequential one
    assert all(e.cv_mae is not None for e in lb.entries if e.kind == "batch")
    for mode in ("observed", "placement"):
        r = em.predict(stream[350], mode)
        assert isinstance(r, PredictionResult) and math.isfinite(r.interference_pct)
        assert r.regime in ("seen", "new") and r.expected_error_pct is not None and r.expected_error_pct >= 0
        served = {(s.mode, s.regime): s for s in lb.served}[(mode, r.regime)]
        if r.regime == "new":  # judged by CV error: the smallest of the mode's CV errors
            assert r.expected_error_pct == min(e.cv_mae for e in lb.entries if e.mode == mode and e.cv_mae is not None)
        else:  # the environment's choice, unless the slot has enough measurements for its own
            key = slot(stream[350].job_type, stream[350].co_job_types)
            own = em.measurements.measured(key) >= em.config.jobset_min
            assert own or (served.model, served.category, served.error_pct) == (r.model, r.category, r.expected_error_pct)
    # placement is learnable on job sets the selector never saw: beats predicting the training mean there
    trained = {" + ".join(sorted((o.job_type, *o.co_job_types))) for o in stream[:300]}
    held = [o for o in _stream(GAVEL_PATH, 400, 11) if " + ".join(sorted((o.job_type, *o.co_job_types))) not in trained]
    assert len(held) > 50
    mean = sum(o.interference_pct for o in stream[:300]) / 300  # type: ignore[misc]
    results = [em.predict(o, "placement") for o in held]
    assert all(r is not None and r.regime == "new" for r in results)
    errs = [abs(r.interference_pct - o.interference_pct) for r, o in zip(results, held, strict=True)]  # type: ignore[union-attr,operator]
    assert sum(errs) / len(errs) < sum(abs(o.interference_pct - mean) for o in held) / len(held)  # type: ignore[operator]


def test_jobset_selection_falls_back_until_enough(stream) -> None:  # type: ignore[no-untyped-def]
    em = EnvironmentModels("v100", config=dataclasses.replace(SMALL, jobset_min=5, min_samples=2))
    target = stream[0]
    key = slot(target.job_type, target.co_job_types)
    same = [o for o in stream if slot(o.job_type, o.co_job_types) == key]
    for o in stream[:100]:
        if o not in same:
            em.learn(o)
    assert em.selector.choice("observed", key) is not None and em.selector.choice("observed", key)[0] == "new"
    for o in ((same or [target]) * 4)[:4]:  # one short of jobset_min
        em.learn(o)
    assert em.measurements.measured(key) == 4
    assert em.selector.choice("observed", key) == ("seen", em.selector.selected["seen"]["observed"])
    for o in (same or [target]) * 5:
        em.learn(o)
    regime, (err, _cat, _name) = em.selector.choice("observed", key)  # type: ignore[misc]
    assert regime == "seen" and err == min(
        e.get()
        for k, c in em.candidates.items()
        if k.mode == "observed" and c.servable and (e := c.record.slots.get(key)) and e.n >= 2
    )


def test_drift_requests_a_refit(data_dir) -> None:  # type: ignore[no-untyped-def]
    from models.synthetic import gavel_observations

    obs = gavel_observations(900, seed=5, drift_at=450, path=data_dir / "gavel" / "physical_cluster_throughputs.json")
    em = EnvironmentModels("v100", config=dataclasses.replace(SMALL, refit_every=10_000))
    for o in obs[:300]:
        em.learn(o)
    em.refit_now()
    assert not em.refit_due()
    for o in obs[300:450]:
        em.learn(o)
    quiet = em.drift_events
    for o in obs[450:]:
        em.learn(o)
    assert em.drift_events > quiet
    assert em.refit_due()


def test_save_load_predicts_the_same_and_refuses_foreign_files(stream, tmp_path) -> None:  # type: ignore[no-untyped-def]
    em = EnvironmentModels("v100", config=SMALL)
    for o in stream[:250]:
        em.learn(o)
    em.refit_now()
    em.save(tmp_path / "state" / "v100")
    loaded = EnvironmentModels.load(tmp_path / "state" / "v100")
    for o in stream[250:290]:
        for mode in ("observed", "placement"):
            assert loaded.predict(o, mode) == em.predict(o, mode)
    assert loaded.leaderboard().selected == em.leaderboard().selected
    assert loaded.leaderboard().served == em.leaderboard().served
    # it resumes learning
    loaded.learn(stream[300])
    assert loaded.observations == em.observations + 1
    # a river file signed by another state directory (another key) is refused
    with pytest.raises(persist.SignatureError):
        EnvironmentModels.load(tmp_path / "state" / "v100", key_dir=tmp_path / "elsewhere")
    # a tampered file is refused
    f = tmp_path / "state" / "v100" / "online" / "0.pkl"
    f.write_bytes(f.read_bytes() + b"x")
    with pytest.raises(persist.SignatureError):
        EnvironmentModels.load(tmp_path / "state" / "v100")


def test_grouped_folds_never_split_a_group() -> None:
    groups = [f"g{i % 17}" for i in range(200)]
    folds = grouped_folds(groups, 5, seed=1)
    assert len(folds) == 5
    covered = set()
    for train, test in folds:
        assert not {groups[i] for i in train} & {groups[i] for i in test}
        covered |= set(test.tolist())
    assert covered == set(range(200))

"""The AIP selector (models.environment.EnvironmentModels): learning, selection, refits, drift, persistence."""

from __future__ import annotations

import dataclasses
import functools
import math

import msgspec
import pytest

from events import CATEGORIES, Leaderboard
from models import persist
from models.crossval import grouped_folds
from models.datasets import BUILTIN, Sample
from models.environment import STATE_FILE, EnvironmentModels, PredictionResult
from models.live import slot
from models.modelconfig import ModelConfig
from models.state import EnvironmentState
from models.views import Views
from models.zoo.online import RiverState

SMALL = ModelConfig(batch_models=("LinearRegression", "DecisionTree"), refit_rows=200, refit_every=150, folds=3, jobset_min=15)


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
    em = EnvironmentModels("v100", config=dataclasses.replace(SMALL, jobset_min=4, min_samples=3))  # slots of their own
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
    for o in stream[:5] * 6:  # five job sets measured often enough for their own selection
        em.learn(o)
    branches = {"new": 0, "seen": 0, "own": 0}
    for o in stream[300:380] + stream[:5] * 2:
        key = slot(o.job_type, o.co_job_types)
        for mode in ("observed", "placement"):
            r = em.predict(o, mode)
            assert isinstance(r, PredictionResult) and math.isfinite(r.interference_pct)
            assert r.regime in ("seen", "new") and r.expected_error_pct is not None and r.expected_error_pct >= 0
            served = {(s.mode, s.regime): s for s in em.served()}[(mode, r.regime)]
            if r.regime == "new":  # the smallest published error on new job sets: CV, else prequential on first ones
                branches["new"] += 1
                errors = [
                    e.cv_mae if e.cv_mae is not None else e.new_mae
                    for e in em.leaderboard().entries
                    if (e.mode == mode or (mode == "observed" and e.kind != "baseline"))
                    and (e.cv_mae is not None or (e.new_samples or 0) >= em.config.min_samples)
                ]  # fmt: skip
                assert r.expected_error_pct == served.error_pct == min(errors)  # type: ignore[type-var]
                continue
            own = [
                (e.get(), k.category, k.name_in(mode))
                for k, c in em.candidates.items()
                if c.servable and (k.mode == mode or (mode == "observed" and k.mode == "placement" and c.kind != "baseline"))
                and (e := c.record.slots.get(key)) is not None and e.n >= em.config.min_samples
            ]  # fmt: skip
            if em.measurements.measured(key) >= em.config.jobset_min and own:
                branches["own"] += 1  # the slot's own choice: the smallest of its candidates' errors on this slot
                assert (r.expected_error_pct, r.category, r.model) == min(own)
            else:  # the environment's choice
                branches["seen"] += 1
                assert (served.model, served.category, served.error_pct) == (r.model, r.category, r.expected_error_pct)
        em.learn(o)
    assert all(branches.values()), branches  # every branch was checked
    # placement is learnable on job sets the selector never saw: beats predicting the training mean there
    trained = {" + ".join(sorted((o.job_type, *o.co_job_types))) for o in stream[:380]}
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
    quiet = em.drift.events
    for o in obs[450:]:
        em.learn(o)
    assert em.drift.events > quiet
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
    # a tampered learner is refused
    path = tmp_path / "state" / "v100" / STATE_FILE
    state = persist.read_state(path, EnvironmentState)
    river = next(c.estimator for c in state.candidates if isinstance(c.estimator, RiverState))
    river.data += b"x"
    persist.write_state(path, state)
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


def test_selection_is_recomputed_only_for_the_regimes_whose_errors_changed(stream) -> None:  # type: ignore[no-untyped-def]
    em = EnvironmentModels("v100", config=SMALL)
    for o in stream[:250]:
        em.learn(o)
    em.refit_now()
    calls: list[str] = []
    best = em.selector.best_per_mode
    em.selector.best_per_mode = lambda regime: calls.append(regime) or best(regime)  # type: ignore[method-assign]
    em.selector.select()
    assert calls == []  # nothing changed since the refit's selection
    seen = next(o for o in stream[250:] if em.measurements.measured(slot(o.job_type, o.co_job_types)))
    em.learn(seen)  # a measured job set: only errors on measured job sets change
    assert calls == ["seen"]  # once for both modes
    calls.clear()
    new = next(o for o in stream[250:] if not em.measurements.measured(slot(o.job_type, o.co_job_types)))
    em.learn(new)  # first observation of a job set: the online learners' errors on new job sets change
    assert calls == ["new"]
    calls.clear()
    before = em.served()
    em.selector.select()
    assert calls == [] and em.served() == before
    em.refit_now()  # other candidates, other CV errors: both regimes
    assert calls.count("new") >= 1 and calls.count("seen") >= 1


def test_a_refit_fits_the_final_fits_best_by_cv_and_serves_only_those(stream) -> None:  # type: ignore[no-untyped-def]
    models = ("LinearRegression", "DecisionTree", "KNN", "HistGradientBoosting")
    em = EnvironmentModels("v100", config=dataclasses.replace(SMALL, batch_models=models, final_fits=2))
    for o in stream[:250]:
        em.learn(o)
    result = em.refit_now()
    by_slice: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for key, score in result.scores.items():
        if key.model in models and score.mae is not None:
            by_slice.setdefault((key.mode, key.category), []).append((score.mae, key.model))
    assert len(by_slice) == 8  # two modes x four categories, every model scored
    for (mode, cat), ranked in by_slice.items():
        assert len(ranked) == len(models)
        fitted = {k.model for k in result.fitted if (k.mode, k.category) == (mode, cat)}
        assert fitted == {name for _, name in sorted(ranked)[:2]}, (mode, cat, sorted(ranked))
    entries = {(e.mode, e.category, e.model): e for e in em.leaderboard().entries if e.kind == "batch"}
    assert len(entries) == 8 * len(models) and all(e.cv_mae is not None for e in entries.values())
    served = {k for k, c in em.candidates.items() if c.kind == "batch" and c.servable}
    assert served == set(result.fitted) and len(served) == 16
    for o in stream[250:350]:
        for mode in ("observed", "placement"):
            r = em.predict(o, mode)
            assert r is not None
            src, _, name = r.model.rpartition("/")
            if name in models:
                assert (src or mode, r.category, name) in served  # never a model the refit did not fit
        em.learn(o)
    everything = EnvironmentModels("v100", config=dataclasses.replace(SMALL, batch_models=models, final_fits=None))
    for o in stream[:250]:
        everything.learn(o)
    assert len(everything.refit_now().fitted) == 8 * len(models)


@pytest.mark.parametrize("predict_novel", [True, False])
def test_what_if_for_a_never_measured_type(stream, predict_novel: bool) -> None:  # type: ignore[no-untyped-def]
    """A job type never measured here: predicted from its solo profile in regime ``novel`` (with an interval), or,
    with ``predict_novel`` off, withheld and counted; a new pair of measured types is ``new``."""
    em = EnvironmentModels("v100", config=dataclasses.replace(SMALL, predict_novel=predict_novel))
    for o in stream[:300]:
        em.learn(o)
    em.refit_now()
    measured = stream[0]
    types = sorted({t for o in stream[:300] for t in (o.job_type, *o.co_job_types)})
    a, b = next(
        (x, y) for x in types for y in types if x != y and not em.measurements.measured(slot(x, [y]))
    )  # two measured types never measured together
    profile = dict(measured.solo)
    asks = [
        (measured.job_type, measured.solo, measured.co_job_types, measured.co_solo),
        (a, profile, [b], [profile]),
        ("never-measured", profile, [b], [profile]),
        (a, profile, ["never-measured"], [profile]),
    ]
    withheld = em.withheld_novel
    got = em.predict_placements(asks)
    assert got[0] is not None and got[0].regime == "seen"
    assert got[1] is not None and got[1].regime == "new" and math.isfinite(got[1].interference_pct)
    if predict_novel:
        for r in got[2:]:
            assert r is not None and r.regime == "novel" and math.isfinite(r.interference_pct)
            assert r.interval_pct is not None and r.interval_pct[0] <= r.interference_pct <= r.interval_pct[1]
        assert em.withheld_novel == withheld
    else:
        assert got[2] is None and got[3] is None  # no candidate carries over to it
        assert em.withheld_novel == withheld + 2


def test_a_state_of_another_format_is_refused_with_a_clear_error(stream, tmp_path) -> None:  # type: ignore[no-untyped-def]
    em = EnvironmentModels("v100", config=SMALL)
    for o in stream[:60]:
        em.learn(o)
    em.save(tmp_path / "state" / "v100")
    path = tmp_path / "state" / "v100" / STATE_FILE
    state = msgspec.msgpack.decode(path.read_bytes())
    path.write_bytes(msgspec.msgpack.encode({**state, "format": 2}))
    with pytest.raises(ValueError, match="state format 2"):
        EnvironmentModels.load(tmp_path / "state" / "v100")
    del state["format"], state["candidates"]  # another layout altogether
    path.write_bytes(msgspec.msgpack.encode(state))
    with pytest.raises(msgspec.ValidationError, match="format"):
        EnvironmentModels.load(tmp_path / "state" / "v100")


def test_the_other_role_of_a_job_set_just_measured_is_not_scored_as_new() -> None:
    """A GPU's window gives one observation per job: ``a | b``, then ``b | a``.  The second is a slot never
    measured, but its job set was, one observation ago: an online learner that has just learned ``a | b`` would be
    judged there on a question no what-if of a job set never measured asks.  Only the first counts as new."""
    from models.datasets import Sample
    from models.views import CandidateKey

    def sample(job: str, co: str, y: float) -> Sample:
        prof = {"a": {"S": 10.0, "M": 100.0}, "b": {"S": 50.0, "M": 300.0}, "c": {"S": 90.0, "M": 200.0}}
        return Sample(job, (co,), y, " + ".join(sorted((job, co))), "v100", {}, prof[job], (prof[co],))

    em = EnvironmentModels("v100", config=ModelConfig(online_models=("river.LinearRegression",), batch_models=("LinearRegression",)))
    key = CandidateKey("placement", "all", "river.LinearRegression")
    for job, co in (("a", "b"), ("b", "a"), ("a", "c"), ("c", "a"), ("b", "c"), ("c", "b")):
        em.learn_sample(sample(job, co, 10.0))
    new = em.candidates[key].record.errors["new"]
    assert new.n == 2  # a + c and b + c (the first, a + b, came before anything was learned: not ready)
    em.learn_sample(sample("a", "b", 10.0))  # measured now: seen
    assert em.candidates[key].record.errors["seen"].n >= 1 and new.n == 2


@pytest.mark.parametrize("sampled", [True, False])
def test_the_batch_candidates_are_tested_on_the_online_learners_sample(stream, sampled: bool) -> None:  # type: ignore[no-untyped-def]
    """``ModelConfig.batch_sampled``: the batch candidates are scored on the observations the online learners are tested
    on (one in ``online_sample`` by the observation's draw), the same rows, so the selection compares them on the
    same observations; the baselines on every one.  Off: the batch candidates on every observation."""
    from models.views import CandidateKey

    config = dataclasses.replace(SMALL, online_models=("river.LinearRegression",), batch_sampled=sampled, window=1000)
    em = EnvironmentModels("v100", config=config)
    for o in stream[:250]:
        em.learn(o)
    em.refit_now()

    def scored(key: CandidateKey) -> int:
        return sum(m.n for m in em.candidates[key].record.errors.values())

    batch = next(k for k, c in em.candidates.items() if c.kind == "batch" and c.servable and k.mode == "placement")
    online, baseline = CandidateKey("placement", batch.category, "river.LinearRegression"), CandidateKey("placement", "all", "baseline.median")
    before = {k: scored(k) for k in (batch, online, baseline)}
    for o in stream[250:]:
        em.learn(o)
    em.score_pending()
    got = {k: scored(k) - before[k] for k in (batch, online, baseline)}
    assert 0 < got[online] < got[baseline] <= 150
    assert got[batch] == (got[online] if sampled else got[baseline])



def test_a_job_set_never_measured_is_served_by_the_mean_of_the_best_candidates_on_new_job_sets(stream) -> None:  # type: ignore[no-untyped-def]
    em = EnvironmentModels("v100", config=dataclasses.replace(SMALL, min_samples=3, new_members=3))
    for o in stream[:300]:
        em.learn(o)
    em.apply_refit(em.refit_task()())
    solos = {o.job_type: dict(o.solo) for o in stream[:300]}
    m = em.measurements
    a, b = next((a, b) for a in sorted(solos) for b in sorted(solos) if m.measured(slot(a, [b])) == 0)
    choice = em.selector.selected["new"]["placement"]
    members = em.selector.members("placement", choice, "new")
    assert len(members) == 3 and members[0] == choice
    assert [c.error for c in members] == sorted(c.error for c in members)  # the three smallest errors, best first
    assert em.selector.members("placement", choice, "seen") == [] and em.selector.members("observed", choice, "new") == []
    views = Views(Sample(a, (b,), math.nan, "", "v100", {}, solos[a], (solos[b],)))
    own = []
    for c in members:  # each member alone
        cand = em.selector.candidate("placement", c)
        own.append(cand.predict_one(cand.features(views)))
    r = em.predict_placement(a, solos[a], [b], [solos[b]])
    assert r is not None and r.regime == "new"
    assert r.model == "Average[" + ",".join(f"{c.name}:{c.category}" for c in members) + "]"
    assert r.interference_pct == pytest.approx(min(max(math.fsum(own) / 3, m.lo), m.hi))  # bounded to what was measured
    em.selector.config = dataclasses.replace(em.selector.config, new_members=1)  # the best alone
    em.selector.stale.add("new")
    em.selector.select()
    r1 = em.predict_placement(a, solos[a], [b], [solos[b]])
    assert r1 is not None and r1.model == choice.name and r1.interference_pct == pytest.approx(min(max(own[0], m.lo), m.hi))

"""The live selection (models.environment.EnvironmentModels) on streams built so that the right answer is known.

* Trees are best on job sets already measured, but poor on new ones (their CV error is high): the old
  selector compared the trees' CV error with the online learners' prequential error and served the worse
  online learner; every candidate is now scored the same way on the stream, so the trees are served.
* The served model is the candidate with the lowest prequential error of its regime.
* The drift detector sees test-then-train errors, and a change is detected within a bound.
* Predictions stay in the physically possible range.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from models.datasets import Sample
from models.environment import EnvironmentModels
from models.live import LAST_MEASURED, LastMeasured, Measurements, clip_pct, slot
from models.modelconfig import ModelConfig
from models.rolling import RollingMedian
from models.views import CandidateKey, Views

ONLINE_LINEAR = ("river.LinearRegression",)
TREES = ModelConfig(
    batch_models=("DecisionTree", "LinearRegression"),
    online_models=ONLINE_LINEAR,
    refit_rows=2000,
    refit_every=10_000,
    folds=3,
    jobset_min=10_000,  # environment-wide selection only: the test is about comparing candidates
    score_batch_every=16,
    workers=1,
)


def _memorised_stream(n: int, seed: int, slots: int = 30) -> list[Sample]:
    """Each job set has its own random base slowdown, told apart only by an id-like feature (S); within a
    job set a per-window switch (V) adds 30 points.  A tree learns both on job sets it has seen; nothing
    can predict a new job set's base (grouped CV error is high); the last measurement misses the switch
    half the time; a linear model of S and V cannot map ids to bases."""
    rng = random.Random(seed)
    ids = rng.sample(range(1000), slots)
    base = [rng.uniform(0.0, 100.0) for _ in range(slots)]
    out = []
    for _ in range(n):
        j = rng.randrange(slots)
        switch = rng.random() < 0.5
        y = base[j] + (30.0 if switch else 0.0) + rng.gauss(0.0, 0.3)
        pcts = {"S": float(ids[j]), "V": 1.0 if switch else -1.0}
        out.append(Sample(f"A{j}", (f"B{j}",), y, f"A{j} + B{j}", "v100", pcts))
    return out


def _mae(em: EnvironmentModels, samples: list[Sample], mode: str = "observed") -> tuple[float, list[str]]:
    errors, models = [], []
    for s in samples:
        r = em.predict_sample(s, mode)
        assert r is not None
        errors.append(abs(r.interference_pct - s.target))
        models.append(r.model)
        em.learn_sample(s)
    return sum(errors) / len(errors), models


def test_trees_that_predict_measured_job_sets_best_are_served() -> None:
    stream = _memorised_stream(1400, seed=1)
    em = EnvironmentModels("v100", config=TREES)
    for s in stream[:600]:
        em.learn_sample(s)
    em.refit_now()
    # the premise: judged by grouped CV (new job sets) the tree looks worse than the online learner does
    cv_tree = em.candidates[CandidateKey("observed", "2", "DecisionTree")].record.cv.mae  # type: ignore[union-attr]
    online = em.candidates[CandidateKey("observed", "2", "river.LinearRegression")].record.errors["seen"].get()
    assert cv_tree is not None
    assert online is not None and cv_tree > online
    _served_mae, models = _mae(em, stream[600:1000])
    tail = models[len(models) // 2 :]
    assert tail.count("DecisionTree") >= 0.9 * len(tail), sorted(set(tail))
    # what it serves beats each alternative on the same observations
    lb = em.leaderboard()
    tree = min(e.mae for e in lb.entries if e.model == "DecisionTree" and e.mode == "observed" and e.mae is not None)
    for e in lb.entries:
        if e.mode == "observed" and e.model != "DecisionTree" and e.samples >= em.config.min_samples:
            assert e.mae is not None and e.mae > 2 * tree, (e.model, e.category, e.mae, tree)
    later_mae, _ = _mae(em, stream[1000:])
    assert later_mae < 3.0, later_mae
    served = {(s.mode, s.regime): s for s in lb.served}
    assert served[("observed", "seen")].model == "DecisionTree"
    # a job set never measured, of job types measured in other sets, is served by its CV error, and the
    # prediction says so
    new = Sample("A0", ("B1",), math.nan, "A0 + B1", "v100", {"S": 5000.0, "V": 1.0})
    r = em.predict_sample(new, "observed")
    assert r is not None and r.regime == "new"
    assert r.expected_error_pct == pytest.approx(
        min(c.record.cv.mae for k, c in em.candidates.items() if k.mode == "observed" and c.record.cv and c.record.cv.mae)
    )
    # a job type never measured at all: no prediction, and it is counted
    for novel in (
        Sample("A-new", ("B1",), math.nan, "A-new + B1", "v100", {"S": 5000.0, "V": 1.0}),
        Sample("A0", ("B-new",), math.nan, "A0 + B-new", "v100", {"S": 5000.0, "V": 1.0}),
    ):
        assert em.predict_sample(novel, "observed") is None
    assert em.withheld_novel == 2


def _linear_stream(pairs: list[tuple[int, int]], n: int, seed: int) -> list[Sample]:
    """The slowdown is exactly 2 S + 3, S a percent change that varies within each job set (so the last
    measurement of a job set is off by up to 4 points) and V noise: a least-squares line is right to
    rounding, on job sets measured and never measured alike, and every other candidate is wrong."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        j, k = pairs[rng.randrange(len(pairs))]
        s = 10.0 * j + k + rng.uniform(-1.0, 1.0)
        out.append(Sample(f"A{j}", (f"B{k}",), 2.0 * s + 3.0, f"A{j} + B{k}", "v100", {"S": s, "V": rng.gauss(0, 20)}))
    return out


def test_served_predictions_are_the_known_answer_in_both_regimes() -> None:
    pairs = [(j, k) for j in range(6) for k in range(6)]
    random.Random(0).shuffle(pairs)
    trained, unseen = pairs[:24], pairs[24:]
    em = EnvironmentModels("v100", config=dataclasses.replace(TREES, jobset_min=20))
    for s in _linear_stream(trained, 700, seed=1):
        em.learn_sample(s)
    em.refit_now()
    for s in _linear_stream(trained, 800, seed=2):  # every job set gets min_samples scores of the refit's models
        em.learn_sample(s)
    regimes = {"seen": 0, "new": 0}
    for s in _linear_stream(trained, 100, seed=3) + _linear_stream(unseen, 100, seed=4):
        r = em.predict_sample(s, "observed")
        assert r is not None
        regimes[r.regime] += 1
        assert r.regime == ("seen" if em.measurements.measured(slot(s.job_type, s.co_job_types)) else "new")
        assert r.interference_pct == pytest.approx(s.target, abs=1e-6), (r, s.target)
        assert r.model == "LinearRegression" and r.expected_error_pct is not None and r.expected_error_pct < 1e-6
    assert regimes == {"seen": 100, "new": 100}


def test_last_measured_baseline_wins_where_job_sets_repeat_exactly() -> None:
    """Job sets whose slowdown never changes: nothing beats what was measured last time, and it is served."""
    rng = random.Random(3)
    base = {j: rng.uniform(0, 150) for j in range(12)}
    stream = [
        Sample(
            f"A{j}", (f"B{j}",), base[j] + rng.gauss(0, 0.1), f"A{j}+B{j}", "v100", {"S": rng.gauss(0, 5), "V": rng.gauss(0, 5)}
        )
        for j in (rng.randrange(12) for _ in range(700))
    ]
    em = EnvironmentModels("v100", config=TREES)
    for s in stream[:400]:
        em.learn_sample(s)
    em.refit_now()
    mae, _ = _mae(em, stream[400:])
    own = em.selector.best("seen", "observed")  # observed mode's own candidates: the last measurement wins
    assert own is not None and own[2] == LAST_MEASURED
    # placement's models read the job identities and may match it; observed mode weighs them, never worse
    assert em.selector.selected["seen"]["observed"][0] <= own[0]
    assert mae < 1.0


def test_drift_scores_the_served_prediction_before_learning() -> None:
    """The detector is fed |served prediction - y| computed before any learner sees y (test-then-train)."""

    class Recorder:
        def __init__(self) -> None:
            self.values: list[float] = []
            self.drift_detected = False

        estimation = 0.0

        def update(self, v: float) -> None:
            self.values.append(v)

    stream = _memorised_stream(300, seed=4)
    em = EnvironmentModels("v100", config=TREES)
    for s in stream[:150]:
        em.learn_sample(s)
    em.refit_now()
    rec = Recorder()
    em.drift.detectors["observed"] = rec
    expected = []
    for s in stream[150:]:
        r = em.predict_sample(s, "observed")
        assert r is not None
        expected.append(abs(r.interference_pct - s.target))
        em.learn_sample(s)
    assert rec.values == pytest.approx(expected)


def test_drift_is_detected_soon_after_a_change_and_not_before() -> None:
    rng = random.Random(5)
    base = {j: rng.uniform(0, 50) for j in range(8)}

    def stream(n: int, shift: float) -> list[Sample]:
        out = []
        for _ in range(n):
            j = rng.randrange(8)
            out.append(
                Sample(
                    f"A{j}", (f"B{j}",), base[j] + shift + rng.gauss(0, 1.0), "", "v100", {"S": float(j), "V": rng.gauss(0, 1)}
                )
            )
        return out

    em = EnvironmentModels("v100", config=TREES)
    for s in stream(300, 0.0):
        em.learn_sample(s)
    em.refit_now()
    for s in stream(300, 0.0):
        em.learn_sample(s)
    assert em.drift.events == 0 and not em.refit_due()
    after = 0
    for s in stream(200, 60.0):
        em.learn_sample(s)
        after += 1
        if em.drift.events:
            break
    assert em.drift.events > 0 and after <= 40, after
    assert em.refit_due()


def test_predictions_stay_physically_possible_and_clipping_is_counted() -> None:
    rng = random.Random(6)
    em = EnvironmentModels("v100", config=dataclasses.replace(TREES, max_pct=80.0))
    for i in range(400):
        j = i % 10
        y = 40.0 * j + rng.gauss(0, 1)  # up to 360 %
        em.learn_sample(Sample(f"A{j}", (f"B{j}",), y, "", "v100", {"S": float(j), "V": rng.gauss(0, 1)}))
    em.refit_now()
    values = []
    for j in range(10):
        r = em.predict_sample(Sample(f"A{j}", (f"B{j}",), math.nan, "", "v100", {"S": float(j), "V": 0.0}), "observed")
        assert r is not None
        values.append(r.interference_pct)
        assert -100.0 <= r.interference_pct <= 80.0
    assert max(values) == 80.0 and em.clipped >= 1
    assert clip_pct(-1e9, 80.0) == (-100.0, True)


def test_online_linear_learner_does_not_blow_up_on_an_outlier() -> None:
    from models.zoo import make_online

    m = make_online("river.LinearRegression")
    rng = random.Random(7)
    for _ in range(1000):
        m.learn_one({"a": 1.0 + rng.gauss(0, 1e-6), "b": rng.gauss(0, 1)}, 10.0)
    assert m.predict_one({"a": 1.0, "b": 0.0}) == pytest.approx(10.0, abs=0.01)  # it has learned the constant
    m.learn_one({"a": 1e6, "b": 0.0}, 10.0)  # a z-score of ~1e12 before bounding
    m.learn_one({"a": 1e6, "b": 0.0}, 500.0)  # and an outlying label
    for b in (0.0, 1.0):
        assert m.predict_one({"a": 1.0, "b": b}) == pytest.approx(10.0, abs=1.0)


def test_baselines_keep_the_last_measurement_and_the_median() -> None:
    last, median, measured = LastMeasured(span=1), RollingMedian(window=5), Measurements()
    assert median.predict_one(None) is None and last.predict_one("x") is None
    for key, y in (("x", 10.0), ("x", 20.0), ("x", 30.0), ("y", 100.0)):
        last.learn_one(key, y)
        median.learn_one(None, y)
        measured.update(key, y)
    assert last.predict_one("x") == 30.0  # span 1: the last value
    assert measured.measured("x") == 3 and measured.measured("z") == 0
    assert median.predict_one("anything") == 25.0  # median of 10, 20, 30, 100
    again = LastMeasured.restore(last.state()), RollingMedian.restore(median.state()), Measurements.restore(measured.state())
    assert again[0].predict_one("x") == 30.0 and again[1].predict_one("q") == median.predict_one("q")
    assert again[2].measured("x") == 3 and (again[2].lo, again[2].hi) == (10.0, 100.0)
    # span 3 (the default): an exponentially weighted mean, alpha = 2 / (3 + 1), starting at the first value
    ewm = LastMeasured(span=3)
    for y in (10.0, 20.0, 40.0):
        ewm.learn_one("x", y)
    assert ewm.predict_one("x") == pytest.approx((10.0 * 0.5 + 20.0 * 0.5) * 0.5 + 40.0 * 0.5)


def test_save_load_keeps_errors_baselines_and_choices(tmp_path) -> None:  # type: ignore[no-untyped-def]
    stream = _memorised_stream(500, seed=8)
    em = EnvironmentModels("v100", config=TREES)
    for s in stream[:300]:
        em.learn_sample(s)
    em.refit_now()
    for s in stream[300:420]:
        em.learn_sample(s)
    em.save(tmp_path / "state" / "v100")
    loaded = EnvironmentModels.load(tmp_path / "state" / "v100")
    for s in stream[420:]:
        assert loaded.predict_sample(s, "observed") == em.predict_sample(s, "observed")
        em.learn_sample(s)
        loaded.learn_sample(s)
    assert loaded.leaderboard().served == em.leaderboard().served


def test_a_new_job_set_is_not_predicted_outside_every_measured_slowdown() -> None:
    """A linear model asked about a job set far outside its training data extrapolates past anything measured
    (here to thousands of points below zero); a new job set's prediction stays within the measured range."""
    rng = random.Random(9)
    config = dataclasses.replace(TREES, batch_models=("LinearRegression",), online_models=ONLINE_LINEAR)
    em = EnvironmentModels("v100", config=config)
    for _ in range(300):
        j = rng.randrange(20)
        y = 5.0 * j + rng.gauss(0, 0.5)
        em.learn_sample(Sample(f"A{j}", (f"B{j}",), y, f"A{j} + B{j}", "v100", {"S": float(j), "V": rng.gauss(0, 1)}))
    em.refit_now()
    far = Sample("A0", ("B1",), math.nan, "", "v100", {"S": -1000.0, "V": 0.0})  # a job set never measured
    raw = em.candidates[CandidateKey("observed", "all", "LinearRegression")].estimator.predict_one(
        far.features("observed", "all")
    )
    assert raw < -1000.0  # what the model alone says
    r = em.predict_sample(far, "observed")
    assert r is not None and r.regime == "new" and r.clipped
    assert em.measurements.lo <= r.interference_pct <= em.measurements.hi


def test_a_novel_type_is_not_predicted_outside_every_measured_slowdown() -> None:
    """A type never measured, predicted from its solo profile (placement mode): a profile far from every measured
    one extrapolates a linear model far below zero; what is served stays within the measured range, as a new job
    set's does (the quick accuracy bench's novel newcomers were served -100 % where the truth was 10^6 %)."""
    config = dataclasses.replace(TREES, batch_models=("LinearRegression",), online_models=ONLINE_LINEAR)
    em = EnvironmentModels("v100", config=config)
    for s in _solo_stream([(a, b) for a in range(12) for b in range(12)] * 2, seed=5):
        em.learn_sample(s)
    em.refit_now()
    far = Sample("J0", ("NEW",), math.nan, "", "v100", {}, {"S": 0.0, "M": 100.0}, ({"S": -3000.0, "M": 100.0},))
    r = em.predict_sample(far, "placement")
    assert r is not None and r.regime == "novel" and r.clipped
    raw = em.candidates[CandidateKey("placement", r.category, r.model)].predict_many(
        [em.candidates[CandidateKey("placement", r.category, r.model)].features(Views(far))]
    )[0]
    assert raw is not None and raw < em.measurements.lo - 100.0  # what the model alone says
    assert em.measurements.lo <= r.interference_pct <= em.measurements.hi


def _solo_stream(pairs: list[tuple[int, int]], seed: int) -> list[Sample]:
    """The co-runner's solo SM utilisation decides the slowdown; the percent changes are noise."""
    rng = random.Random(seed)
    out = []
    for a, b in pairs:
        y = 0.6 * (3.0 * b) + rng.gauss(0.0, 1.0)
        pcts = {p: rng.gauss(0.0, 20.0) for p in ("E", "S", "V")}
        solo, co = {"S": 3.0 * a, "M": 100.0}, {"S": 3.0 * b, "M": 100.0}
        out.append(Sample(f"J{a}", (f"K{b}",), y, f"J{a} + K{b}", "v100", pcts, solo, (co,)))
    return out


def test_observed_mode_is_never_served_worse_than_placement_mode() -> None:
    """Observed mode knows the solo profiles too: on job sets never measured it serves placement's model when that
    is the better one by the same error (its CV error)."""
    rng = random.Random(4)
    combos = [(a, b) for a in range(30) for b in range(30)]
    rng.shuffle(combos)
    em = EnvironmentModels("v100", config=TREES)
    for s in _solo_stream(combos[:600], 5):
        em.learn_sample(s)
    em.refit_now()
    new = _solo_stream(combos[600:700], 6)
    got = {mode: [em.predict_sample(s, mode) for s in new] for mode in ("observed", "placement")}
    assert all(r is not None and r.regime == "new" for rs in got.values() for r in rs)
    err = {m: sum(abs(r.interference_pct - s.target) for r, s in zip(rs, new, strict=True)) / len(new) for m, rs in got.items()}  # type: ignore[union-attr]
    assert err["observed"] <= err["placement"] + 1e-9 and err["placement"] < 3.0, err
    assert {r.model for r in got["observed"]} == {f"placement/{r.model}" for r in got["placement"]}  # type: ignore[union-attr]
    own = em.selector.best("new", "observed")  # what observed mode alone would serve: percent changes that say nothing
    assert own is not None and own[0] > 3 * got["observed"][0].expected_error_pct  # type: ignore[union-attr]

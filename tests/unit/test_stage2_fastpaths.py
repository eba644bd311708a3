"""Stage 2's cheaper paths answer what the paths they replaced answer, on fitted models.

* learning an observation with what :meth:`EnvironmentModels.serve` computed for it (features, uncomposed
  predictions) equals learning it afresh;
* a what-if batch (compositions first, no prediction of a job set of 3+ whose composition is served, the newcomer's
  base model in one batch) equals the per-row path;
* ``refit_due``'s job-set run equals a scan of the history; the tree predictions equal scikit-learn's; a pair's
  placement features are what ``sum`` makes of one co-runner; cached conformal offsets equal fresh ones;
* the selection (each candidate's error once for both modes) chooses what ``Selector.best`` chooses; the batch
  candidates' vectorised test from one array equals each model's ``predict`` of the frame.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from models.candidates import NewcomerCandidate
from models.datasets import Sample
from models.environment import EnvironmentModels, sample_of
from models.features import placement_features
from models.intervals import conformal_offsets
from models.modelconfig import ModelConfig
from models.rolling import ResidualWindow
from models.synthetic import gavel_observations
from models.views import Views
from models.zoo import make_batch
from models.zoo.frames import Prepared
from models.zoo.scikit import forest_predict, tree_predict

SMALL = ModelConfig(
    online_models=("river.LinearRegression",), batch_models=("ExtraTrees", "DecisionTree", "LinearRegression"), final_fits=2
)


def _fitted(n: int = 240, seed: int = 5) -> tuple[EnvironmentModels, dict]:
    em = EnvironmentModels("v100", config=SMALL)
    known: dict = {}
    for o in gavel_observations(n, seed=seed):
        em.learn(o)
        known[o.job_type] = o.solo
        for t, p in zip(o.co_job_types, o.co_solo, strict=True):
            known.setdefault(t, p)
    em.refit_now()
    return em, known


def _close(a: object, b: object) -> bool:
    """Equal, floats to 1e-9 (relative), recursively."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "__dataclass_fields__") and type(a) is type(b):
        return all(_close(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)  # type: ignore[attr-defined]
    return a == b


def test_learning_what_was_served_equals_learning_afresh() -> None:
    stream = gavel_observations(420, seed=9)
    fast, slow = EnvironmentModels("v100", config=SMALL), EnvironmentModels("v100", config=SMALL)
    for i, o in enumerate(stream):
        served = fast.serve(o)
        assert served.results == {m: slow.predict(o, m) for m in ("observed", "placement")}
        fast.learn(o, served)
        slow.learn(o)
        if i in (150, 300):
            fast.refit_now()
            slow.refit_now()
    assert fast.refits == 2 and fast.observations == slow.observations == len(stream)
    assert (fast.drift.events, fast.clipped, fast.withheld_novel) == (slow.drift.events, slow.clipped, slow.withheld_novel)
    assert fast.leaderboard().entries == slow.leaderboard().entries and fast.selected() == slow.selected()
    for name in ("seen_residuals", "novel_residuals", "many_residuals"):  # what the drift pass keeps besides
        assert list(getattr(fast, name).values) == list(getattr(slow, name).values), name
    assert {m: d.estimation for m, d in fast.drift.detectors.items()} == {
        m: d.estimation for m, d in slow.drift.detectors.items()
    }
    # a Served of another state of the models is not reused (the models learned since): learning computes afresh
    o, nxt = stream[0], stream[1]
    stale = fast.serve(o)
    fast.learn(nxt, fast.serve(nxt))
    slow.learn(nxt)
    assert stale.generation != fast.generation
    fast.learn(o, stale)
    slow.learn(o)
    assert fast.leaderboard().entries == slow.leaderboard().entries


@pytest.mark.parametrize("composed_served", [True, False])
def test_a_what_if_batch_equals_the_per_row_path(composed_served: bool) -> None:
    em, known = _fitted()
    for score in em.compose_scores.values():  # the composition served, or beaten by what is served
        score.n, score.composed_abs, score.served_abs = 100, (1.0 if composed_served else 9.0), 2.0
    types = sorted(known)
    running = [types[0], types[3]]
    asks = []
    for jt in types:  # what streams.whatif.what_if_entries asks for a GPU running two jobs
        asks.append((jt, known[jt], running, [known[t] for t in running]))
        asks.append((running[0], known[running[0]], [running[1], jt], [known[running[1]], known[jt]]))
    batch = em.predict_placements(asks)
    one_by_one = [em.predict_placements([a])[0] for a in asks]
    # the path before: every ask predicted by its candidate (with its interval), then the job sets of 3+ composed
    # from their pairs (with theirs)
    samples = [Sample(jt, tuple(co), math.nan, "", "v100", {}, dict(s), tuple(cs)) for jt, s, co, cs in asks]
    results = em._predict_many([(Views(s), "placement") for s in samples])
    many = [
        i for i, (s, r) in enumerate(zip(samples, results, strict=True)) if r and r.regime == "new" and len(s.co_job_types) >= 2
    ]
    assert many
    compositions = dict(zip(many, em._compose([samples[i] for i in many], intervals=True), strict=True))
    before = em._finish(samples, results, compose=True, what_if=True, compositions=compositions)
    assert all(r is not None for r in batch)
    assert _close(batch, one_by_one) and _close(batch, before)
    composed = [r for r in batch if r is not None and r.model.startswith("compose/")]
    assert (len(composed) > 0) == composed_served


def test_the_newcomer_candidate_predicts_a_batch_as_row_by_row() -> None:
    em, known = _fitted()
    newcomer = next(c for c in em.candidates.values() if isinstance(c, NewcomerCandidate))
    assert newcomer.servable
    types = sorted(known)
    views = [Views(Sample(a, (b,), math.nan, "", "v100", {}, known[a], (known[b],))) for a in types[:6] for b in types[:6]]
    batch = newcomer.predict_many(views)
    assert _close(batch, [newcomer.predict_one(v) for v in views])


def test_refit_due_reads_the_job_sets_of_the_recent_history_as_a_scan_does() -> None:
    rng = random.Random(2)
    config = ModelConfig(refit_min_rows=3, refit_rows=5, history=8)
    em = EnvironmentModels("v100", config=config)
    for _ in range(300):
        a, b = rng.choice("aab"), rng.choice("abbc")
        em._append(Sample(a, (b,), 1.0, ""))
        recent = list(em.history)[-config.refit_rows :]
        scan = len(em.history) >= config.refit_min_rows and len({s.job_set for s in recent}) >= 2
        assert em.refit_due() == scan


@pytest.mark.parametrize("name", ["RandomForest", "ExtraTrees", "DecisionTree"])
def test_tree_predictions_are_scikit_learns(name: str) -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(200, 5))
    y = a[:, 0] * 3 + np.sin(a[:, 1]) + rng.normal(0, 0.1, 200)
    model = make_batch(name, 0).fit_prepared(Prepared.of_array(list("abcde"), a, y))
    x = rng.normal(size=(37, 5))
    ours = forest_predict(model.estimator, x) if name != "DecisionTree" else tree_predict(model.estimator, x)
    assert np.array_equal(ours, model.estimator.predict(x))


def test_a_pairs_placement_features_are_what_sum_makes_of_its_co_runner() -> None:
    job = {"E": 100.0, "S": 3.0, "M": 7.0, "throughput": 2.0}
    for co in ({"E": -0.0, "S": float("nan"), "V": 4, "throughput": None}, {"E": 5.5, "T": float("inf")}, {}):
        one = placement_features(job, [co], job_type="a (batch size 4)", co_job_types=["b"])
        for k in ("E", "T", "S", "V", "R", "W", "M", "throughput"):
            values = [float(v) for v in (co.get(k),) if v is not None and math.isfinite(float(v))]
            if values:
                assert repr(one[f"other_solo_{k}"]) == repr(sum(values))  # -0.0 too: sum() makes it 0.0
            else:
                assert f"other_solo_{k}" not in one
            assert f"other_max_{k}" not in one


def test_cached_conformal_offsets_are_fresh_ones() -> None:
    rng = random.Random(1)
    w = ResidualWindow(50)
    for i in range(200):
        w.update(rng.gauss(0, 3) if i % 7 else math.nan)
        lo, hi = conformal_offsets(list(w.values))
        fresh = (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None
        assert w.offsets() == fresh and w.offsets() == fresh  # twice: the second from the cache
        assert w.offsets(0.8) == ResidualWindow(50, list(w.values)).offsets(0.8)


def test_the_selection_weighs_each_error_once_and_chooses_as_best_does() -> None:
    """:meth:`Selector.select` (each candidate's error computed once for both modes) chooses what
    :meth:`Selector.best` (``wider``) chooses per regime and mode: on a stream with refits, and with errors drawn
    from three values (ties, placement mode's models best in observed mode)."""
    from models.candidates import CvScore

    em = EnvironmentModels("v100", config=SMALL)
    sel = em.selector

    def same() -> int:
        sel.stale.update(("seen", "new"))
        sel.select()
        for regime in ("seen", "new"):
            for mode in ("observed", "placement"):
                assert sel.selected[regime].get(mode) == sel.best(regime, mode, wider=True), (regime, mode)
        return sum(c is not None for by_mode in sel.selected.values() for c in by_mode.values())

    for i, o in enumerate(gavel_observations(300, seed=4)):
        em.learn(o)
        if i in (100, 200):
            em.refit_now()
        same()
    rng = random.Random(3)
    chosen = set()
    for _ in range(200):
        for c in sel.candidates.values():
            c.record.cv = CvScore(rng.choice((1.0, 1.5, 2.0)), None, 10)
            for _ in range(em.config.min_samples):
                c.record.errors["seen"].update(rng.choice((1.0, 1.5, 2.0)))
        sel.changed()  # records changed behind the selector's back (not scored): every error weighed afresh
        assert same() == 4
        chosen.update(c.name for c in sel.selected["seen"].values())
    assert any(name.startswith("placement/") for name in chosen)  # observed mode chose placement's models too


def test_the_selection_weighs_again_only_the_candidates_scored_since_and_chooses_as_best_does() -> None:
    """A selection computes the errors of the candidates scored since the last one (every candidate's after a
    refit), and still chooses what :meth:`Selector.best` chooses: on a stream with refits, and with scores drawn
    from three values for a random few candidates at a time (ties, a best candidate getting worse)."""
    from models.candidates import Candidate

    em = EnvironmentModels("v100", config=SMALL)
    sel = em.selector
    for i, o in enumerate(gavel_observations(300, seed=4)):
        em.learn(o)
        if i in (100, 200):
            em.refit_now()
    calls: list[object] = []
    error = Candidate.error

    def counted(self: Candidate, regime: str, min_samples: int) -> float | None:
        calls.append(self.key)
        return error(self, regime, min_samples)

    servable = [c for c in sel.candidates.values() if c.servable]
    rng = random.Random(7)
    try:
        Candidate.error = counted  # type: ignore[method-assign]
        for _ in range(300):
            scored = rng.sample(servable, 3)
            for c in scored:
                sel._score(c, rng.choice((1.0, 1.5, 2.0)), 0.0, rng.choice(("seen", "new")), None)
            calls.clear()
            sel.select()
            assert set(calls) <= {c.key for c in scored}  # the others' errors have not moved
            calls.clear()
            for regime in ("seen", "new"):
                for mode in ("observed", "placement"):
                    assert sel.selected[regime].get(mode) == sel.best(regime, mode, wider=True), (regime, mode)
    finally:
        Candidate.error = error  # type: ignore[method-assign]


def test_scoring_pending_rows_from_one_array_equals_each_models_frame() -> None:
    """The batch candidates' vectorised test takes each model's columns from one array of the mode's features:
    the predictions equal ``estimator.predict`` of the frame (reindexed to its columns, filled), bit for bit."""
    import pandas as pd

    from models.candidates import BatchCandidate

    em, _ = _fitted(300, seed=6)
    stream = gavel_observations(80, seed=8)
    batch = [c for c in em.candidates.values() if isinstance(c, BatchCandidate) and c.servable]
    assert {c.key.mode for c in batch} == {"observed", "placement"} and len({c.key.category for c in batch}) > 1
    for mode in ("observed", "placement"):
        views = [Views(sample_of(o)) for o in stream]
        rows = [v.full(mode) for v in views if v.full(mode)]
        rows[3] = {k: v for k, v in list(rows[3].items())[1:]}  # a row without one of the features
        frame = pd.DataFrame(rows)
        union = frame.to_numpy(dtype=float, na_value=np.nan)
        where = {str(c): j for j, c in enumerate(frame.columns)}
        for c in batch:
            if c.key.mode == mode:
                expected = np.asarray(c.estimator.predict(frame.iloc[2:]), dtype=float)
                assert np.array_equal(c.predict_matrix(union[2:], where), expected), c.key


def test_the_rolling_mean_is_rivers_to_the_last_bit() -> None:
    """:class:`models.rolling.RollingMean` (river's arithmetic without its wrappers) gives river's
    ``utils.Rolling(stats.Mean, window)`` floats exactly, from empty and from a saved state."""
    from river import stats, utils

    from models.rolling import RollingMean

    rng = random.Random(11)
    for window in (1, 2, 7, 200):
        ours, rivers = RollingMean(window), utils.Rolling(stats.Mean, window_size=window)
        for i in range(3 * window + 50):
            v = abs(rng.gauss(0, 50)) if i % 5 else rng.choice((0.0, 1e-9, 1e6))
            ours.update(v)
            rivers.update(v)
            assert repr(ours.get()) == repr(float(rivers.get())) and ours.n == len(rivers.window)
            if i % 17 == 0:  # a restart from the saved state continues the same floats
                restored = RollingMean(window, ours.state())
                assert (restored.count, restored.mean, list(restored.values)) == (ours.count, ours.mean, list(ours.values))
                ours = restored


def test_the_deferred_newcomer_learns_predicts_and_is_scored_as_on_arrival(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Newcomer candidate is tested then trained with the batch pass, in order, its base model's predictions of
    the rows in one call: once it has settled, its residual model, its record (errors, residuals, per-slot errors)
    and what it predicts equal testing then training it on arrival; and whatever asks it for a prediction first gets
    it from everything learned so far (it settles itself)."""
    import contextlib

    from models.newcomer import NewcomerEstimator, dump

    @contextlib.contextmanager
    def on_arrival_mode():  # type: ignore[no-untyped-def]
        NewcomerCandidate.deferred = False  # type: ignore[misc]
        try:
            yield
        finally:
            NewcomerCandidate.deferred = True  # type: ignore[misc]

    stream = gavel_observations(700, seed=12)
    deferred = EnvironmentModels("v100", config=SMALL)
    with on_arrival_mode():
        on_arrival = EnvironmentModels("v100", config=SMALL)
    calls = {"one": 0, "many": 0}
    base_pct, base_many = NewcomerEstimator.base_pct, NewcomerEstimator.base_many

    def one(self: NewcomerEstimator, views: Views) -> float:
        calls["one"] += 1
        return base_pct(self, views)

    def many(self: NewcomerEstimator, xs: list[Views]) -> list[float]:
        calls["many"] += 1
        return base_many(self, xs)

    monkeypatch.setattr(NewcomerEstimator, "base_pct", one)
    monkeypatch.setattr(NewcomerEstimator, "base_many", many)
    probe = Views(sample_of(stream[0]))
    key = next(k for k, c in deferred.candidates.items() if isinstance(c, NewcomerCandidate))
    for i, o in enumerate(stream):
        with on_arrival_mode():
            on_arrival.learn(o)
        before = calls["one"]
        deferred.learn(o)
        assert calls["one"] == before  # never one row at a time
        if i in (150, 450):
            deferred.refit_now()
            with on_arrival_mode():
                on_arrival.refit_now()
        if i % 97 == 0 and deferred.candidates[key].servable:  # asked directly: it settles first
            with on_arrival_mode():
                expected = on_arrival.candidates[key].predict_one(probe)
            assert deferred.candidates[key].predict_one(probe) == expected
    assert calls["many"] > 0 and on_arrival.candidates[key].waiting is None and deferred.candidates[key].waiting is not None
    deferred.score_pending()
    a, b = deferred.candidates[key], on_arrival.candidates[key]
    assert a.servable and a.record.state() == b.record.state() and a.record.errors["seen"].n > 0
    assert dump(a.estimator.residuals) == dump(b.estimator.residuals)

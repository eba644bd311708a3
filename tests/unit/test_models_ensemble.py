"""The Ensemble candidate (models.candidates.EnsembleCandidate, models.refit.ensemble_of): the refit's best placement
models averaged in log-speed points, scored on their out-of-fold predictions averaged the same way."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest

from models.candidates import ENSEMBLE, CandidateKey, CvScore, EnsembleEstimator, log_mean_pct
from models.environment import Config, EnvironmentModels
from models.refit import Refitted, ensemble_of

SMALL = Config(batch_models=("LinearRegression", "DecisionTree", "KNN"), refit_rows=300, refit_every=200, folds=3)
KEY = CandidateKey("placement", "all", ENSEMBLE)


@functools.cache
def _stream(path, n: int = 400, seed: int = 3):  # type: ignore[no-untyped-def]
    from models.synthetic import gavel_observations

    return gavel_observations(n, seed=seed, path=path)


@pytest.fixture
def stream(data_dir):  # type: ignore[no-untyped-def]
    return _stream(data_dir / "gavel" / "physical_cluster_throughputs.json")


def test_two_models_off_by_the_same_factor_either_way_average_to_the_truth() -> None:
    """A stream built so that the answer is known: one member predicts a speed a factor 1.5 too low on every row, the
    other a factor 1.5 too high, a third is 5 points off.  The log-speed mean of the two best is exact, so its CV MAE
    is 0 and its intervals empty, where the arithmetic mean and either member are off."""
    y = np.linspace(0.0, 300.0, 40)
    slow, fast = (1 + y / 100) * 1.5 * 100 - 100, (1 + y / 100) / 1.5 * 100 - 100
    key = lambda n: CandidateKey("placement", "1", n)  # noqa: E731
    out = {
        key("slow"): Refitted(CvScore(float(np.mean(abs(slow - y))), None, 40), None, object()),
        key("fast"): Refitted(CvScore(float(np.mean(abs(fast - y))), None, 6), None, object()),
        key("near"): Refitted(CvScore(5.0, None, 6), None, None),  # not fitted: never a member
        CandidateKey("observed", "all", "best"): Refitted(CvScore(0.1, None, 6), None, object()),  # another mode
    }
    oof = {key("slow"): slow, key("fast"): fast, key("near"): y + 5.0, CandidateKey("observed", "all", "best"): y}
    got = ensemble_of(out, oof, y, 2)
    assert got is not None
    ens_key, ens = got
    assert ens_key == KEY and ens.model == (tuple(key("fast")), tuple(key("slow")))
    assert ens.cv is not None and ens.cv.mae is not None and ens.cv.mae < 1e-9 and ens.cv.rows == 40
    assert ens.offsets is not None and max(abs(o) for o in ens.offsets) < 1e-9
    assert float(np.mean(abs((slow + fast) / 2 - y))) > 10.0  # the arithmetic mean is not exact
    assert ensemble_of(out, oof, y, 3) is None  # only two fitted placement models
    assert ensemble_of(out, oof, y, 1) is None


def test_an_untested_row_of_one_member_is_not_scored() -> None:
    y = np.array([10.0, 20.0, 30.0])
    key = lambda n: CandidateKey("placement", "all", n)  # noqa: E731
    out = {key(n): Refitted(CvScore(1.0, None, 3), None, object()) for n in ("a", "b")}
    got = ensemble_of(out, {key("a"): np.array([10.0, np.nan, 30.0]), key("b"): np.array([10.0, 20.0, 90.0])}, y, 2)
    assert got is not None and got[1].cv is not None
    assert got[1].cv.rows == 2 and got[1].cv.mae == pytest.approx(abs(log_mean_pct([np.array([30.0]), np.array([90.0])])[0] - 30.0) / 2)


def test_live_ensemble_is_its_members_log_mean_judged_by_cv_and_survives_save_load(stream, tmp_path) -> None:  # type: ignore[no-untyped-def]
    em = EnvironmentModels("v100", config=SMALL)
    assert KEY in em.candidates and not em.candidates[KEY].servable  # before any refit
    for o in stream[:300]:
        em.learn(o)
    result = em.refit_now()
    ens = em.candidates[KEY]
    assert ens.servable and KEY in result.candidates and KEY not in result.fitted
    est = ens.estimator
    assert isinstance(est, EnsembleEstimator) and len(est.keys) == 2
    members = [em.candidates[k] for k in est.keys]
    assert all(c.kind == "batch" and c.servable and k.mode == "placement" for k, c in zip(est.keys, members, strict=True))
    cvs = sorted(r.cv.mae for k, r in result.candidates.items() if k.mode == "placement" and r.model is not None and k != KEY)
    assert [c.record.cv.mae for c in members] == cvs[:2]  # the two best fitted by CV
    assert ens.record.cv is not None and ens.error("new", SMALL.min_samples) == ens.record.cv.mae
    from models.candidates import Views
    from models.environment import sample_of

    views = Views(sample_of(stream[350]))
    want = log_mean_pct([np.asarray([c.predict_many([views.get(k.mode, k.category)])[0]]) for k, c in zip(est.keys, members, strict=True)])
    assert ens.predict_one(views) == pytest.approx(float(want[0]))
    em.score_pending()
    em.save(tmp_path / "v100")
    back = EnvironmentModels.load(tmp_path / "v100")
    again = back.candidates[KEY]
    assert again.servable and again.predict_one(views) == pytest.approx(ens.predict_one(views))
    assert again.record.cv == ens.record.cv


def test_off_below_two_members(stream) -> None:  # type: ignore[no-untyped-def]
    em = EnvironmentModels("v100", config=dataclasses.replace(SMALL, ensemble_k=1))
    for o in stream[:300]:
        em.learn(o)
    result = em.refit_now()
    assert KEY not in em.candidates and KEY not in result.candidates
    assert not math.isnan(em.observations)

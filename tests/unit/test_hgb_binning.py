"""HistGradientBoosting's weighted bin thresholds in one pass (models.zoo.hgbbinning) against scikit-learn's own."""

from __future__ import annotations

import numpy as np
import pytest

from models.zoo import hgbbinning

binning = pytest.importorskip("sklearn.ensemble._hist_gradient_boosting.binning")
if not hgbbinning.install():
    pytest.skip("the installed scikit-learn's binning is not one hgbbinning mirrors", allow_module_level=True)


def columns(rng: np.random.Generator):
    """Columns with ties, NaNs, zero and fractional weights, few and many distinct values."""
    for n in (3, 40, 300, 700, 2500):
        for distinct in (2, 50, 255, 256, 400, None):
            values = rng.normal(size=n) * 10.0
            if distinct is not None:
                values = rng.choice(rng.normal(size=distinct), size=n)
            if n > 10:
                values[rng.random(n) < 0.03] = np.nan
            weights = rng.integers(0, 6, size=n).astype(float)
            yield values, weights
            yield values, weights * rng.random(n)
            yield values, np.ones(n)


def test_the_same_thresholds_as_scikit_learn():
    rng = np.random.default_rng(0)
    original = hgbbinning._original
    compared = 0
    for values, weights in columns(rng):
        if not (weights[~np.isnan(values)] > 0).any():
            continue
        for max_bins in (255, 63):
            ours = binning._find_binning_thresholds(values, max_bins, sample_weight=weights)
            theirs = original(values, max_bins, sample_weight=weights)
            assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
            np.testing.assert_array_equal(ours, theirs)
            compared += 1
    assert compared > 150


def test_a_weighted_fit_predicts_as_with_scikit_learns_binning():
    from sklearn.ensemble import HistGradientBoostingRegressor

    rng = np.random.default_rng(1)
    X = rng.normal(size=(700, 6))
    y = X[:, 0] * 3 + np.sin(X[:, 1]) + rng.normal(scale=0.1, size=700)
    w = rng.integers(1, 20, size=700).astype(float)

    def fit_predict():
        m = HistGradientBoostingRegressor(max_iter=30, max_depth=4, min_samples_leaf=1, early_stopping=False, random_state=0)
        return m.fit(X, y, sample_weight=w).predict(X)

    ours = fit_predict()
    binning._find_binning_thresholds = hgbbinning._original
    try:
        theirs = fit_predict()
    finally:
        binning._find_binning_thresholds = hgbbinning.find_binning_thresholds
    np.testing.assert_array_equal(ours, theirs)

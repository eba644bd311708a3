"""HistGradientBoosting's bin thresholds of weighted rows, computed in one pass per feature.

The refit fits placement mode's distinct feature rows weighted by their copies.  With ``sample_weight``, scikit-learn
1.8 and 1.9 find each feature's 254 bin thresholds by calling ``sklearn.utils.stats._weighted_percentile`` once
per threshold, and each call sorts the column again: measured in the workers of ``aip bench fleet``, that binning
was a fifth of every refit's CPU, more than the boosting itself.  scikit-learn fixed it upstream after 1.9.1
(scikit-learn/scikit-learn#34248, "Optimize binning in HGBT").  Until a release has it, :func:`install` puts
:func:`find_binning_thresholds` in its place: the same thresholds (the same "averaged inverted CDF" arithmetic,
:func:`weighted_thresholds`; ``tests/unit/test_hgb_binning.py`` compares them with scikit-learn's on random
columns with ties and fractional weights), one sort, one cumulative sum and one ``searchsorted`` per feature.

Installed only on the versions whose code it mirrors (``SKLEARN_VERSIONS``); on any other the original stays.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

SKLEARN_VERSIONS = ((1, 8), (1, 9))
"""(major, minor) of the scikit-learn releases whose ``_find_binning_thresholds`` this mirrors."""

_original: Any = None
_installing = threading.Lock()


def weighted_thresholds(sorted_values: np.ndarray, sorted_weights: np.ndarray, max_bins: int) -> np.ndarray:
    """The ``max_bins - 1`` inner weighted percentiles (averaged inverted CDF) of a sorted column whose weights are
    all positive, as ``_weighted_percentile(values, weights, p, average=True)`` gives them one ``p`` at a time.

    >>> weighted_thresholds(np.array([1.0, 2.0, 3.0, 4.0]), np.ones(4), 2)  # the median of 1..4: between 2 and 3
    array([2.5])
    >>> weighted_thresholds(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 1.0, 1.0, 5.0]), 2)
    array([4.])
    """
    percentiles = np.linspace(0, 100, num=max_bins + 1)[1:-1]
    cdf = np.cumsum(sorted_weights)
    ranks = percentiles / 100 * cdf[-1]
    last = len(sorted_values) - 1
    at = np.clip(np.searchsorted(cdf, ranks), 0, last)
    above = (cdf[at] - ranks) > np.finfo(sorted_values.dtype).eps
    nxt = np.clip(at + 1, 0, last)
    return np.where(above, sorted_values[at], (sorted_values[at] + sorted_values[nxt]) / 2)


def find_binning_thresholds(col_data: np.ndarray, max_bins: int, sample_weight: np.ndarray | None = None) -> np.ndarray:
    """scikit-learn's ``_find_binning_thresholds`` with the weighted percentiles of :func:`weighted_thresholds`;
    without weights, or with at most ``max_bins`` distinct values, scikit-learn's own."""
    if sample_weight is None:
        return _original(col_data, max_bins, sample_weight)
    keep = ~np.isnan(col_data) & (sample_weight != 0)
    col_data, sample_weight = col_data[keep], sample_weight[keep]
    order = np.argsort(col_data)
    col_data, sample_weight = col_data[order], sample_weight[order]
    if len(np.unique(col_data)) <= max_bins:
        return _original(col_data, max_bins, sample_weight)
    thresholds = np.unique(weighted_thresholds(col_data, sample_weight, max_bins))
    np.clip(thresholds, a_min=None, a_max=_almost_inf(), out=thresholds)
    return thresholds


def _almost_inf() -> float:
    from sklearn.ensemble._hist_gradient_boosting.common import ALMOST_INF

    return float(ALMOST_INF)


def install() -> bool:
    """Put :func:`find_binning_thresholds` in scikit-learn's place, once; False where the installed release is not
    one it mirrors (the original stays)."""
    global _original
    if _original is not None:  # asked at every HistGradientBoosting made
        return True
    import sklearn
    from sklearn.ensemble._hist_gradient_boosting import binning

    if tuple(int(p) for p in sklearn.__version__.split(".")[:2]) not in SKLEARN_VERSIONS:
        return False
    with _installing:  # refits in two threads: the second must not keep the first's replacement as the original
        if _original is None:
            _original = binning._find_binning_thresholds
            binning._find_binning_thresholds = find_binning_thresholds
    return True

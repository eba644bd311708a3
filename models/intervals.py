"""90 % prediction intervals from held-out residuals (``actual - predicted``).

* Batch models: split-conformal offsets from out-of-fold residuals (:func:`conformal_offsets`): the
  interval of a prediction ``p`` is ``[p + lo, p + hi]``, each tail holding ``(1 - coverage) / 2`` of the
  residuals with the finite-sample correction; offline (``aip evaluate``) the locally weighted form
  (:func:`scaled_offsets`), the residuals scaled by how much several models disagree on the row.
* Online learners (and the baselines): the same quantiles over a rolling window of their prequential
  residuals (:class:`models.rolling.ResidualWindow`): each residual was measured before the learner saw the observation.

Pure arithmetic: no Kafka, no faust.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

COVERAGE = 0.9
"""Nominal coverage of every interval."""


def conformal_offsets(residuals: Sequence[float] | np.ndarray, coverage: float = COVERAGE) -> tuple[float, float]:
    """Offsets ``(lo, hi)`` such that ``[pred + lo, pred + hi]`` covers ``coverage`` of new rows exchangeable
    with the residuals' rows: the ``floor((n + 1) t)``-th and ``ceil((n + 1) (1 - t))``-th smallest residuals,
    ``t = (1 - coverage) / 2`` (infinite when there are too few residuals for that).

    >>> conformal_offsets(np.arange(-50, 51, dtype=float))
    (-46.0, 46.0)
    >>> conformal_offsets([1.0, 2.0])
    (-inf, inf)

    Each end at 90 %: a tail of 0.05 each side, finite from 19 residuals (``ceil(0.95 (n + 1)) <= n``); a 90 %
    upper end alone (``coverage`` 0.8 here: one tail of 0.1) from 9.

    >>> conformal_offsets(np.arange(18.0))[1], conformal_offsets(np.arange(19.0))[1]
    (inf, 18.0)
    >>> conformal_offsets(np.arange(8.0), 0.8)[1], conformal_offsets(np.arange(9.0), 0.8)[1]
    (inf, 8.0)
    """
    r = np.asarray(residuals, dtype=float)
    r = np.sort(r[np.isfinite(r)])
    n = len(r)
    tail = (1.0 - coverage) / 2.0
    k_hi = math.ceil((n + 1) * (1.0 - tail))
    k_lo = math.floor((n + 1) * tail)
    hi = math.inf if n == 0 or k_hi > n else float(r[k_hi - 1])
    lo = -math.inf if n == 0 or k_lo < 1 else float(r[k_lo - 1])
    return lo, hi


def scaled_offsets(
    residuals: Sequence[float] | np.ndarray, spread: Sequence[float] | np.ndarray, coverage: float = COVERAGE
) -> tuple[float, float, float]:
    """Locally weighted split-conformal: offsets ``(lo, hi)`` of the scores ``residual / (spread + beta)``, and
    ``beta``, the median absolute residual.  The interval of a prediction ``p`` whose ``spread`` is ``s`` is
    ``[p + lo (s + beta), p + hi (s + beta)]``: wider where ``s``, a difficulty measured the same way on the
    calibration rows (the disagreement of several models), is larger.  With ``s`` constant it is
    :func:`conformal_offsets`.

    >>> lo, hi, beta = scaled_offsets(np.arange(-50, 51, dtype=float), np.zeros(101))
    >>> beta, round(lo * beta, 6), round(hi * beta, 6)
    (25.0, -46.0, 46.0)
    """
    r, s = np.asarray(residuals, dtype=float), np.asarray(spread, dtype=float)
    beta = max(float(np.median(np.abs(r[np.isfinite(r)]))) if np.isfinite(r).any() else 0.0, 1e-9)
    lo, hi = conformal_offsets(r / (s + beta), coverage)
    return lo, hi, beta


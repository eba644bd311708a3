"""Monotonic constraints where the physics is known: more co-runner load never predicts less slowdown."""

from __future__ import annotations

import numpy as np
import pandas as pd

from models.zoo import make_batch
from models.zoo.scikit import monotone_direction


def _data(n: int = 400, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    """Slowdown rises with the co-runner's SM utilisation (0.5 points per point), plus heavy noise, and varies
    with the job's own throughput; a free model fits wiggles of the noise that go the wrong way."""
    rng = np.random.default_rng(seed)
    X = pd.DataFrame(
        {
            "other_solo_S": rng.uniform(0, 100, n),
            "solo_S": rng.uniform(0, 100, n),
            "solo_throughput": rng.uniform(1, 10, n),
        }
    )
    y = 0.5 * X["other_solo_S"] + 2.0 * X["solo_throughput"] + rng.normal(0, 15, n)
    return X, y.to_numpy()


def _decreases(name: str) -> float:
    """The largest fall of the prediction as other_solo_S rises (0: never falls), over 20 fixed rows."""
    X, y = _data()
    model = make_batch(name, 0).fit(X, y)
    grid = np.linspace(0, 100, 101)
    worst = 0.0
    for i in range(20):
        rows = pd.DataFrame({"other_solo_S": grid, "solo_S": X["solo_S"][i], "solo_throughput": X["solo_throughput"][i]})
        pred = model.predict(rows)
        worst = max(worst, float(-np.diff(pred).min()))
    return worst


def test_monotone_model_never_predicts_less_slowdown_for_more_co_runner_load() -> None:
    assert _decreases("HistGradientBoosting-monotone") == 0.0
    assert _decreases("HistGradientBoosting") > 0.5  # the same model unconstrained does, on the same data


def test_only_co_runner_load_is_constrained() -> None:
    assert monotone_direction("other_solo_V") == monotone_direction("other_max_E") == 1
    assert monotone_direction("solo_S") == monotone_direction("log_other_solo_throughput") == 0

"""Online learners: river regressors behind :class:`models.zoo.OnlineModel` (:class:`RiverModel`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from models import persist


class RiverModel:
    """A river regressor (usually a pipeline) behind :class:`OnlineModel`.

    ``predict_one`` never returns None: before the first ``learn_one`` (AMF
    returns None then) it answers the running mean of the targets seen (0 at first).
    """

    def __init__(self, name: str, estimator: Any) -> None:
        self.name = name
        self.estimator = estimator
        self.n = 0
        self.mean = 0.0

    def learn_one(self, x: Mapping[str, float], y: float) -> None:
        self.estimator.learn_one(dict(sorted(x.items())), float(y))
        self.n += 1
        self.mean += (float(y) - self.mean) / self.n

    def predict_one(self, x: Mapping[str, float]) -> float:
        if self.n == 0:
            return self.mean
        y = self.estimator.predict_one(dict(sorted(x.items())))
        if y is None or not math.isfinite(y):
            return self.mean
        return float(y)

    def to_state(self, key: bytes) -> RiverState:
        """The learner pickled in memory and signed with ``key`` (:func:`models.persist.dump_signed`)."""
        data, signature = persist.dump_signed({"name": self.name, "estimator": self.estimator, "n": self.n, "mean": self.mean}, key)
        return RiverState(data, signature)

    @classmethod
    def from_state(cls, state: RiverState, key: bytes) -> RiverModel:
        """What :meth:`to_state` made; :class:`models.persist.SignatureError` where it was not signed with ``key``."""
        saved = persist.load_signed(state.data, state.signature, key)
        model = cls(saved["name"], saved["estimator"])
        model.n, model.mean = saved["n"], saved["mean"]
        return model


class RiverState(msgspec.Struct, tag="river"):
    """A saved :class:`RiverModel`: its pickle and the pickle's HMAC-SHA256."""

    data: bytes
    signature: str


Z_MAX = 10.0
"""Standardised inputs of the online linear learner are bounded to +-Z_MAX: early in a stream a feature's
variance is tiny and one ordinary value is a z-score of thousands, which made the SGD weights blow up."""


def bound_z(x: dict[str, float]) -> dict[str, float]:
    """Each value clipped to ``[-Z_MAX, Z_MAX]`` (a module-level function, so the pipeline pickles).

    >>> bound_z({"a": 1e6, "b": -0.5})
    {'a': 10.0, 'b': -0.5}
    """
    return {k: Z_MAX if v > Z_MAX else -Z_MAX if v < -Z_MAX else v for k, v in x.items()}


def _river_linear(seed: int) -> Any:
    from river import compose, linear_model, optim, preprocessing

    # bounded inputs and a bounded loss gradient (an error of 50 points): no single observation moves it far
    return (
        preprocessing.StandardScaler()
        | compose.FuncTransformer(bound_z)
        | linear_model.LinearRegression(optimizer=optim.SGD(0.01), l2=0.001, clip_gradient=100.0)
    )


def _river_knn(seed: int) -> Any:
    from river import neighbors, preprocessing

    return preprocessing.StandardScaler() | neighbors.KNNRegressor(
        n_neighbors=5, engine=neighbors.LazySearch(window_size=100), aggregation_method="mean"
    )


def _river_hatr(seed: int) -> Any:
    from river import preprocessing, tree

    return preprocessing.StandardScaler() | tree.HoeffdingAdaptiveTreeRegressor(
        grace_period=50, max_depth=8, leaf_prediction="mean", seed=seed
    )


def _river_amf(seed: int) -> Any:
    from river import forest

    return forest.AMFRegressor(n_estimators=3, step=1.0, use_aggregation=True, seed=seed)


ONLINE: dict[str, Callable[[int], Any]] = {
    "river.LinearRegression": _river_linear,
    "river.KNNRegressor": _river_knn,
    "river.HoeffdingAdaptiveTreeRegressor": _river_hatr,
    "river.AMFRegressor": _river_amf,
}
HEAVY_ONLINE = ("river.KNNRegressor", "river.HoeffdingAdaptiveTreeRegressor", "river.AMFRegressor")
"""Online learners updated on a stride (see ``EnvironmentModels``) to hold the per-observation budget."""


def make_online(name: str, seed: int = 0) -> RiverModel:
    return RiverModel(name, ONLINE[name](seed))

"""The model zoo behind two small contracts, one module per library.

* :class:`OnlineModel`: ``learn_one(x, y)`` / ``predict_one(x)`` on feature dicts
  (river learners, updated on every observation): :mod:`models.zoo.online`;
* :class:`BatchModel`: ``fit(X, y)`` / ``predict(X)`` on frames, plus ``predict_rows(xs)`` on
  feature dicts for serving (one matrix, one ``predict``): scikit-learn in :mod:`models.zoo.scikit`, the torch
  MLP in :mod:`models.zoo.torchmlp`, the frame handling both share in :mod:`models.zoo.frames`.

Each family is wrapped once (:class:`models.zoo.online.RiverModel`, :class:`models.zoo.scikit.SklearnModel`,
:class:`models.zoo.torchmlp.TorchMLP`); :data:`ONLINE` and :data:`BATCH` name every member.  Models
never depend on feature order (columns are sorted by name) and handle missing
features: an absent indicator (``key=value``) is 0, any other absent feature
takes its training median.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from models.zoo.online import HEAVY_ONLINE, ONLINE, RiverState, make_online
from models.zoo.scikit import SKLEARN, SklearnModel, SklearnState
from models.zoo.torchmlp import MlpState, TorchMLP

BatchState = SklearnState | MlpState
"""A saved batch model (its ``to_state()``)."""

__all__ = ["BATCH", "HEAVY_ONLINE", "ONLINE", "REFIT_BATCH", "BatchModel", "BatchState", "OnlineModel", "batch_from_state", "make_batch", "make_online"]


@runtime_checkable
class OnlineModel(Protocol):
    name: str

    def learn_one(self, x: Mapping[str, float], y: float) -> None: ...

    def predict_one(self, x: Mapping[str, float]) -> float: ...

    def to_state(self, key: bytes) -> RiverState: ...


@runtime_checkable
class BatchModel(Protocol):
    name: str

    def fit(self, X: pd.DataFrame, y: Sequence[float]) -> BatchModel: ...

    def predict(self, X: pd.DataFrame) -> np.ndarray: ...

    def predict_rows(self, xs: Sequence[Mapping[str, float]]) -> np.ndarray: ...

    def predict_one(self, x: Mapping[str, float]) -> float: ...

    def to_state(self) -> BatchState: ...


BATCH: tuple[str, ...] = (*SKLEARN, "MLP")
"""Every batch model (``aip evaluate`` runs them all: the paper's models, ExtraTrees, HistGradientBoosting, MLP)."""
REFIT_BATCH: tuple[str, ...] = tuple(n for n in BATCH if n not in ("GradientBoosting", "HistGradientBoosting-monotone"))
"""The batch models of the stream's refits (``ModelConfig.batch_models``): every model but the paper's
GradientBoosting, whose place HistGradientBoosting takes (same boosting settings; on the 10,000-observation
refit its fits cost ~3 s of CPU against ~0.3 s, at the same or lower CV error; docs/MODELS.md), and but the
monotone HistGradientBoosting (``aip evaluate`` only so far: the stream's refit budget was measured without it)."""


def make_batch(name: str, seed: int = 0) -> SklearnModel | TorchMLP:
    return TorchMLP(seed) if name == TorchMLP.name else SklearnModel(name, seed)


def batch_from_state(state: BatchState) -> SklearnModel | TorchMLP:
    """A batch model from its ``to_state()``.  A scikit-learn model loaded before from the same state (the same fit
    id and skops bytes) is that model again (:data:`LOADED_KEPT`): every snapshot between two refits carries the
    same batch models, and skops loads a forest in tens of milliseconds.  A fitted model only predicts (its memo of
    rows predicted is the same function's), so the models of two snapshots may share it."""
    if isinstance(state, MlpState):
        return TorchMLP.from_state(state)
    key = (state.fit_id, hashlib.blake2b(state.skops, digest_size=16).digest())
    with _LOADED_LOCK:  # snapshots are built in a reader's thread
        model = _LOADED.get(key)
    if model is None or model.name != state.name or model.cols is None or model.cols.columns != state.columns:
        model = SklearnModel.from_state(state)
        with _LOADED_LOCK:
            if len(_LOADED) >= LOADED_KEPT:
                del _LOADED[next(iter(_LOADED))]
            _LOADED[key] = model
    return model


LOADED_KEPT = 32
"""scikit-learn models :func:`batch_from_state` keeps loaded (the oldest forgotten first)."""

_LOADED: dict[tuple[str, bytes], SklearnModel] = {}
_LOADED_LOCK = threading.Lock()

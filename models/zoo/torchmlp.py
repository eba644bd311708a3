"""The torch MLP behind :class:`models.zoo.BatchModel` (:class:`TorchMLP`): torch builds, seeds and saves the
network, :mod:`models.mlp` trains it in numpy."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from models.zoo.frames import Columns, FittedState, Prepared, new_fit_id, one_thread

BATCH_ROWS = 256
"""Rows of one minibatch of the MLP (every row when fewer)."""
WEIGHT_DECAY = 1e-4
"""The MLP's L2 weight decay (added to the gradient, as torch's Adam does)."""


class TorchMLP:
    """A small MLP (CPU, one thread, deterministic for a seed) behind :class:`BatchModel`."""

    name = "MLP"

    def __init__(self, seed: int = 0, hidden: int = 32, epochs: int = 120, lr: float = 0.03) -> None:
        self.seed, self.hidden, self.epochs, self.lr = seed, hidden, epochs, lr
        self.cols: Columns | None = None
        self.net: Any = None
        self.stats = np.zeros(0)
        self.fit_id = ""
        self._state: MlpState | None = None

    def _build(self, n_in: int) -> Any:
        import torch

        torch.manual_seed(self.seed)
        return torch.nn.Sequential(
            torch.nn.Linear(n_in, self.hidden), torch.nn.ReLU(), torch.nn.Linear(self.hidden, self.hidden), torch.nn.ReLU(),
            torch.nn.Linear(self.hidden, 1),
        )  # fmt: skip

    def fit(self, X: pd.DataFrame, y: Sequence[float]) -> TorchMLP:
        return self.fit_prepared(Prepared.of_frame(X, y))

    def fit_prepared(self, data: Prepared) -> TorchMLP:
        """Fits every row (not the distinct ones): the minibatches sample rows, so copies weigh as rows.

        torch builds and seeds the network (its default initialisation) and keeps it for saving; the steps run in
        numpy (:func:`models.mlp.adam`: torch's Adam and smooth-L1 arithmetic, about a quarter of its cost per fit)."""
        import torch

        from models import mlp

        self.cols = data.cols
        a, t = data.a, data.y
        mu, sd = a.mean(axis=0), a.std(axis=0)
        sd[sd == 0] = 1.0
        self.stats = np.concatenate([mu, sd, [t.mean(), t.std() or 1.0]])
        torch.set_num_threads(1)  # refits run beside the event loop on a small machine; one thread each
        with torch.random.fork_rng(devices=[]):
            self.net = self._build(a.shape[1])
        linears = [m for m in self.net if hasattr(m, "weight")]
        shapes = [(m.in_features, m.out_features) for m in linears]
        flat = np.concatenate(
            [np.concatenate([m.weight.detach().numpy().T.ravel(), m.bias.detach().numpy()]) for m in linears]
        ).astype(np.float32)
        xs = ((a - mu) / sd).astype(np.float32)
        ys = ((t - self.stats[-2]) / self.stats[-1]).astype(np.float32).reshape(-1, 1)
        batches = mlp.minibatches(len(xs), self.epochs, BATCH_ROWS, self.seed)  # ``epochs`` counts steps
        with one_thread():
            mlp.adam(flat, shapes, xs, ys, batches, self.lr, WEIGHT_DECAY)
        with torch.no_grad():
            for m, (w, b) in zip(linears, mlp.layout(shapes, flat), strict=True):
                m.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T)))
                m.bias.copy_(torch.from_numpy(b.copy()))
        self._numpy_weights()
        self.fit_id = new_fit_id()
        return self

    def _numpy_weights(self) -> None:
        self.weights = [
            (m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy()) for m in self.net if hasattr(m, "weight")
        ]

    def _forward(self, a: np.ndarray, *, alone: bool = False) -> np.ndarray:
        """The network's output for the rows of ``a``.  ``alone``: each row's floats those of that row forward on its
        own, whatever rows are with it: a matrix product of several rows may differ from one row's in the last bits
        (BLAS sums in another order), so the rows go as a stack of one-row matrices, and numpy multiplies each as it
        multiplies one row alone (the same BLAS call a row; 14-18 us for 1 to 16 rows, against 14 us a row one by one)."""
        n = self.stats.shape[0] // 2 - 1
        h = (a - self.stats[:n]) / self.stats[n : 2 * n]
        if alone:
            h = h[:, None, :]
        for i, (w, b) in enumerate(self.weights):
            h = np.matmul(h, w) + b
            if i < len(self.weights) - 1:
                h = np.maximum(h, 0.0)
        out: np.ndarray = h[..., 0].reshape(len(a)) * self.stats[-1] + self.stats[-2]
        return out

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        assert self.cols is not None, "fit first"
        return self._forward(self.cols.frame(X))

    def predict_array(self, a: np.ndarray) -> np.ndarray:
        return self._forward(a)

    def predict_rows(self, xs: Sequence[Mapping[str, float]]) -> np.ndarray:
        """Each row's floats those of that row alone (:meth:`_forward`): a row served must not depend on the rows
        served with it (:meth:`models.environment.EnvironmentModels.serve_many`, the what-if pair tables)."""
        assert self.cols is not None, "fit first"
        return self._forward(self.cols.rows(xs), alone=True)

    def predict_one(self, x: Mapping[str, float]) -> float:
        return float(self.predict_rows([x])[0])

    def to_state(self) -> MlpState:
        """The fitted network's settings, columns, fill values, standardisation and weights (torch's ``state_dict``,
        as bytes); made once per fit and remembered, as :meth:`models.zoo.scikit.SklearnModel.to_state`."""
        import torch

        assert self.cols is not None, "fit first"
        state = self._state
        if state is None or state.fit_id != self.fit_id:
            buffer = io.BytesIO()
            torch.save(self.net.state_dict(), buffer)
            state = self._state = MlpState(
                columns=self.cols.columns, fill=self.cols.fill.tolist(), fit_id=self.fit_id, seed=self.seed, hidden=self.hidden,
                epochs=self.epochs, lr=self.lr, stats=self.stats.tolist(), weights=buffer.getvalue(),
            )  # fmt: skip
        return state

    @classmethod
    def from_state(cls, state: MlpState) -> TorchMLP:
        """What :meth:`to_state` made (weights loaded with ``weights_only=True``)."""
        import torch

        model = cls(state.seed, state.hidden, state.epochs, state.lr)
        model.cols, model.fit_id, model._state = Columns.of_saved(state.columns, state.fill), state.fit_id, state
        model.stats = np.array(state.stats, dtype=float)
        model.net = model._build(len(model.cols.columns))
        model.net.load_state_dict(torch.load(io.BytesIO(state.weights), weights_only=True))
        model._numpy_weights()
        return model


class MlpState(FittedState, tag="mlp"):
    """A saved MLP: its columns, fill values and fit id, its settings, standardisation and weights (torch's
    ``state_dict``)."""

    seed: int
    hidden: int
    epochs: int
    lr: float
    stats: list[float]
    weights: bytes

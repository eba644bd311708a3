"""The numpy MLP steps (models/mlp.py) against torch's: the same gradient, the same Adam update."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from models import mlp
from models.zoo.torchmlp import TorchMLP

SHAPES = [(5, 8), (8, 8), (8, 1)]


def _torch_net(seed: int) -> object:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )


def _flat(net: object) -> np.ndarray:
    lin = [m for m in net if hasattr(m, "weight")]  # type: ignore[attr-defined]
    return np.concatenate([np.concatenate([m.weight.detach().numpy().T.ravel(), m.bias.detach().numpy()]) for m in lin])


def _data(rows: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 5)).astype(np.float32)
    y = (3.0 * x[:, :1] - x[:, 1:2] ** 2 + rng.normal(size=(rows, 1))).astype(np.float32)  # |residuals| above and below 1
    return x, y


def test_gradient_is_torchs() -> None:
    net = _torch_net(0)
    x, y = _data(64)
    loss = torch.nn.functional.smooth_l1_loss(net(torch.from_numpy(x)), torch.from_numpy(y))  # type: ignore[operator]
    loss.backward()
    lin = [m for m in net if hasattr(m, "weight")]  # type: ignore[attr-defined]
    want = np.concatenate([np.concatenate([m.weight.grad.numpy().T.ravel(), m.bias.grad.numpy()]) for m in lin])
    flat = _flat(net).astype(np.float32)
    grad = np.zeros_like(flat)
    mlp.smooth_l1_gradient(mlp.layout(SHAPES, flat), mlp.layout(SHAPES, grad), x, y)
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)


def test_adam_steps_are_torchs() -> None:
    net = _torch_net(3)
    x, y = _data(600)
    batches = list(mlp.minibatches(len(x), 40, 128, seed=5))
    flat = mlp.adam(_flat(net).astype(np.float32), SHAPES, x, y, batches, lr=0.03, weight_decay=1e-4)
    opt = torch.optim.Adam(net.parameters(), lr=0.03, weight_decay=1e-4)  # type: ignore[attr-defined]
    for idx in batches:
        opt.zero_grad()
        t = torch.from_numpy(idx)
        torch.nn.functional.smooth_l1_loss(net(torch.from_numpy(x)[t]), torch.from_numpy(y)[t]).backward()  # type: ignore[operator]
        opt.step()
    want = _flat(net)
    assert np.abs(want - _flat(_torch_net(3))).max() > 0.1  # the steps moved the weights
    np.testing.assert_allclose(flat, want, rtol=1e-3, atol=1e-4)


def test_fitted_mlp_saves_the_trained_weights(tmp_path: object) -> None:
    rng = np.random.default_rng(0)
    X = pd.DataFrame(rng.normal(size=(400, 3)), columns=["a", "b", "c"])
    y = 2.0 * X["a"] + rng.normal(scale=0.1, size=400)
    model = TorchMLP(seed=1).fit(X, y)
    assert np.mean(np.abs(model.predict(X) - y)) < 0.5 * np.mean(np.abs(y - y.mean()))  # it learned
    net_out = model.net(torch.tensor(((X.to_numpy() - model.stats[:3]) / model.stats[3:6]), dtype=torch.float32))
    np.testing.assert_allclose(
        net_out.detach().numpy()[:, 0] * model.stats[-1] + model.stats[-2], model.predict(X), rtol=1e-4, atol=1e-4
    )

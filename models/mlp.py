"""The zoo's MLP trained in numpy: ReLU layers, smooth-L1 loss on minibatches, Adam with L2 weight decay.

The arithmetic of ``torch.optim.Adam`` (``weight_decay`` added to the gradient, bias-corrected moments,
``eps`` outside the square root) and of ``smooth_l1_loss`` (beta 1, mean), in float32, on one flat parameter
vector.  A step on a 256-row minibatch of a 2x32 network costs about a quarter of torch's (whose per-step cost
is its dispatch: autograd, optimizer hooks), and a refit fits the MLP 24 times in CV and up to 8 times on all rows
(docs/BENCHMARKS.md).  Pure functions of arrays; :class:`models.zoo.torchmlp.TorchMLP` builds, seeds and saves the
network with torch and trains it here (``tests/unit/test_models_mlp.py`` checks the steps against torch's).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

Layer = tuple[np.ndarray, np.ndarray]
"""One linear layer: weights (inputs x outputs) and bias, views into the flat parameter vector."""

BETAS = (0.9, 0.999)
EPS = 1e-8


def layout(shapes: Sequence[tuple[int, int]], flat: np.ndarray) -> list[Layer]:
    """Views of ``flat`` as the layers of ``shapes`` ((inputs, outputs) each): weights then bias, layer by layer.

    >>> ls = layout([(2, 3), (3, 1)], np.arange(13.0))
    >>> ls[0][0].shape, ls[0][1].tolist(), ls[1][0].ravel().tolist(), ls[1][1].tolist()
    ((2, 3), [6.0, 7.0, 8.0], [9.0, 10.0, 11.0], [12.0])
    """
    out, i = [], 0
    for n_in, n_out in shapes:
        w = flat[i : i + n_in * n_out].reshape(n_in, n_out)
        i += n_in * n_out
        out.append((w, flat[i : i + n_out]))
        i += n_out
    assert i == len(flat), "the flat vector holds exactly the layers"
    return out


def size(shapes: Sequence[tuple[int, int]]) -> int:
    """Parameters of layers of ``shapes``.

    >>> size([(2, 3), (3, 1)])
    13
    """
    return sum(n_in * n_out + n_out for n_in, n_out in shapes)


def forward(layers: Sequence[Layer], x: np.ndarray) -> np.ndarray:
    """The network's output (rows x outputs): ReLU after every layer but the last."""
    h = x
    for i, (w, b) in enumerate(layers):
        h = h @ w + b
        if i < len(layers) - 1:
            h = np.maximum(h, 0.0)
    return h


def smooth_l1_gradient(layers: Sequence[Layer], grads: Sequence[Layer], x: np.ndarray, y: np.ndarray) -> None:
    """The gradient of the network's mean smooth-L1 loss (beta 1) on ``x``, ``y`` (rows x 1), written into ``grads``
    (the same layout as ``layers``)."""
    acts = [x]
    pre = []
    h = x
    for i, (w, b) in enumerate(layers):
        h = h @ w + b
        if i < len(layers) - 1:
            pre.append(h > 0.0)
            h = np.maximum(h, 0.0)
            acts.append(h)
    d = h - y
    g = np.clip(d, -1.0, 1.0) / np.float32(d.size)  # d/dd of 0.5 d^2 (|d| < 1) or |d| - 0.5, averaged
    for i in range(len(layers) - 1, -1, -1):
        gw, gb = grads[i]
        np.matmul(acts[i].T, g, out=gw)
        np.sum(g, axis=0, out=gb)
        if i:
            g = (g @ layers[i][0].T) * pre[i - 1]


def adam(
    flat: np.ndarray, shapes: Sequence[tuple[int, int]], x: np.ndarray, y: np.ndarray, batches: Iterable[np.ndarray],
    lr: float, weight_decay: float,
) -> np.ndarray:  # fmt: skip
    """``flat`` (float32, updated in place and returned) after one Adam step per minibatch of row indices."""
    layers = layout(shapes, flat)
    grad = np.zeros_like(flat)
    grads = layout(shapes, grad)
    m, v = np.zeros_like(flat), np.zeros_like(flat)
    b1, b2 = BETAS
    denom = np.empty_like(flat)
    for t, idx in enumerate(batches, start=1):
        smooth_l1_gradient(layers, grads, x[idx], y[idx])
        grad += np.float32(weight_decay) * flat
        m *= np.float32(b1)
        m += np.float32(1.0 - b1) * grad
        v *= np.float32(b2)
        v += np.float32(1.0 - b2) * grad * grad
        np.sqrt(v, out=denom)
        denom /= np.float32(np.sqrt(1.0 - b2**t))
        denom += np.float32(EPS)
        flat -= np.float32(lr / (1.0 - b1**t)) * m / denom
    return flat


def minibatches(rows: int, steps: int, batch: int, seed: int) -> Iterable[np.ndarray]:
    """``steps`` sets of ``min(rows, batch)`` distinct row indices, drawn at random (seeded); all rows when fewer.

    >>> [b.tolist() for b in minibatches(3, 2, 256, 0)]
    [[0, 1, 2], [0, 1, 2]]
    >>> [len(set(b.tolist())) for b in minibatches(1000, 3, 256, 0)]
    [256, 256, 256]
    """
    if rows <= batch:
        every = np.arange(rows)
        for _ in range(steps):
            yield every  # a mean loss does not depend on the order of its rows
        return
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        yield rng.choice(rows, batch, replace=False)

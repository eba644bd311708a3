"""The workload catalogue: each network with its synthetic data, batch sizes and sizes.

``full`` is the published architecture at its usual input size (for a GPU);
``tiny`` keeps the architecture (same layers) with a handful of channels and
small inputs, so a CPU test trains it in milliseconds per step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from workloads import nets

SIZES = ("full", "tiny")


@dataclass(frozen=True)
class Shape:
    """What a size of a workload is made of: the network, and one synthetic batch's shape."""

    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]  # per example, without the batch dimension
    classes: int  # classes, or vocabulary for token inputs
    tokens: bool = False  # inputs are token ids (the LSTM), else float images


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    batch_sizes: tuple[int, ...]  # the batch sizes the experiments use on a GPU
    shapes: dict[str, Shape]

    def job_type(self, batch_size: int) -> str:
        """The job type name, parsed by ``models.features.parse_job_type``.

        >>> WORKLOADS["resnet50"].job_type(32)
        'resnet50-bs32'
        """
        return f"{self.name}-bs{batch_size}"


def _imagenet(
    name: str, title: str, batch_sizes: tuple[int, ...], build: Callable[..., nn.Module], tiny: dict[str, int], tiny_side: int
) -> Workload:
    """An image classifier: full, ``build(1000, width=64)`` on 3x224x224 images; tiny, ``build(10, **tiny)`` on
    3 x ``tiny_side`` x ``tiny_side`` ones."""
    return Workload(
        name,
        f"{title} on synthetic 224x224 images, 1000 classes",
        batch_sizes,
        {
            "full": Shape(lambda: build(1000, width=64), (3, 224, 224), 1000),
            "tiny": Shape(lambda: build(10, **tiny), (3, tiny_side, tiny_side), 10),
        },
    )


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        _imagenet("resnet50", "ResNet-50", (16, 32, 64), nets.resnet50, {"width": 4}, 32),
        _imagenet("vgg16", "VGG-16", (16, 32, 64), nets.vgg16, {"width": 4, "hidden": 32, "pool": 1}, 32),
        _imagenet("alexnet", "AlexNet", (64, 128, 256), nets.alexnet, {"width": 8, "hidden": 32, "pool": 1}, 64),
        Workload(
            "lstm",
            "two-layer LSTM language model (650 units, 10k words, 35-token sequences)",
            (20, 40, 80),
            {
                "full": Shape(lambda: nets.LstmLanguageModel(10_000, 650), (35,), 10_000, tokens=True),
                "tiny": Shape(lambda: nets.LstmLanguageModel(50, 16), (8,), 50, tokens=True),
            },
        ),
        Workload(
            "cnn",
            "small LeNet-style CNN on synthetic 28x28 digits",
            (64, 256, 1024),
            {
                "full": Shape(lambda: nets.small_cnn(10, width=32), (1, 28, 28), 10),
                "tiny": Shape(lambda: nets.small_cnn(10, width=4), (1, 28, 28), 10),
            },
        ),
    )
}


def get(name: str) -> Workload:
    """The workload called ``name``; ``KeyError`` with the choices otherwise."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; choose one of {', '.join(WORKLOADS)}") from None


def synthetic_batch(shape: Shape, batch_size: int, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """One fixed random batch (inputs, targets) on ``device``; token models predict every position.

    >>> x, y = synthetic_batch(WORKLOADS["lstm"].shapes["tiny"], 4, torch.device("cpu"))
    >>> tuple(x.shape), tuple(y.shape)
    ((4, 8), (32,))
    """
    g = torch.Generator().manual_seed(seed)
    if shape.tokens:
        x = torch.randint(0, shape.classes, (batch_size, *shape.input_shape), generator=g)
        y = torch.randint(0, shape.classes, (batch_size * shape.input_shape[0],), generator=g)
    else:
        x = torch.randn((batch_size, *shape.input_shape), generator=g)
        y = torch.randint(0, shape.classes, (batch_size,), generator=g)
    return x.to(device), y.to(device)

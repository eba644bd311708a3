"""The paper's kinds of networks, written with torch.nn (no torchvision, no downloads).

Every builder takes ``width`` (channels of the first stage, or hidden size) so
the same architecture runs full-size on a GPU and tiny on a CPU in tests.
"""

from __future__ import annotations

import torch
from torch import nn


def _scaled(channels: int, width: int, base: int = 64) -> int:
    """Channels of a stage when the first stage has ``width`` instead of ``base``.

    >>> _scaled(512, 64), _scaled(512, 8)
    (512, 64)
    """
    return max(1, channels * width // base)


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 reduce, 3x3, 1x1 expand (x4), with a projection shortcut when shapes change."""

    expansion = 4

    def __init__(self, in_ch: int, mid_ch: int, stride: int = 1) -> None:
        super().__init__()
        out_ch = mid_ch * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(in_ch, mid_ch, 1, bias=False),
            nn.BatchNorm2d(mid_ch),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid_ch, mid_ch, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(mid_ch),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid_ch, out_ch, 1, bias=False),
            nn.BatchNorm2d(out_ch),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))  # type: ignore[no-any-return]


def resnet50(num_classes: int = 1000, width: int = 64) -> nn.Module:
    """ResNet-50 (He et al. 2016): stages of 3, 4, 6 and 3 bottleneck blocks."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    ]
    in_ch = width
    for i, blocks in enumerate((3, 4, 6, 3)):
        mid = width * 2**i
        for j in range(blocks):
            layers.append(Bottleneck(in_ch, mid, stride=2 if (j == 0 and i > 0) else 1))
            in_ch = mid * Bottleneck.expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_ch, num_classes)]
    return nn.Sequential(*layers)


def _classifier(in_features: int, hidden: int, num_classes: int, dropout_first: bool) -> list[nn.Module]:
    """The head of VGG and AlexNet: two fully connected layers of ``hidden`` units with ReLU and dropout (before
    each layer in AlexNet, after each in VGG), then ``num_classes`` outputs.

    >>> [type(m).__name__ for m in _classifier(8, 4, 2, dropout_first=True)]
    ['Dropout', 'Linear', 'ReLU', 'Dropout', 'Linear', 'ReLU', 'Linear']
    """
    layers: list[nn.Module] = []
    for n_in in (in_features, hidden):
        fc = [nn.Linear(n_in, hidden), nn.ReLU(inplace=True)]
        layers += [nn.Dropout(), *fc] if dropout_first else [*fc, nn.Dropout()]
    return [*layers, nn.Linear(hidden, num_classes)]


VGG16_STAGES = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


def vgg16(num_classes: int = 1000, width: int = 64, hidden: int = 4096, pool: int = 7) -> nn.Module:
    """VGG-16 (Simonyan and Zisserman 2015): 13 3x3 convolutions in five stages, three fully connected layers."""
    layers: list[nn.Module] = []
    in_ch = 3
    for stage in VGG16_STAGES:
        for ch in stage:
            out = _scaled(ch, width)
            layers += [nn.Conv2d(in_ch, out, 3, padding=1), nn.ReLU(inplace=True)]
            in_ch = out
        layers.append(nn.MaxPool2d(2))
    layers += [
        nn.AdaptiveAvgPool2d(pool),
        nn.Flatten(),
        *_classifier(in_ch * pool * pool, hidden, num_classes, dropout_first=False),
    ]
    return nn.Sequential(*layers)


def alexnet(num_classes: int = 1000, width: int = 64, hidden: int = 4096, pool: int = 6) -> nn.Module:
    """AlexNet (Krizhevsky et al. 2012), in the single-GPU form torchvision also uses."""
    c1, c2, c3, c4 = (_scaled(c, width) for c in (64, 192, 384, 256))
    return nn.Sequential(
        nn.Conv2d(3, c1, 11, stride=4, padding=2),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2),
        nn.Conv2d(c1, c2, 5, padding=2),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2),
        nn.Conv2d(c2, c3, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(c3, c4, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(c4, c4, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2),
        nn.AdaptiveAvgPool2d(pool),
        nn.Flatten(),
        *_classifier(c4 * pool * pool, hidden, num_classes, dropout_first=True),
    )


class LstmLanguageModel(nn.Module):
    """A two-layer LSTM word language model (Zaremba et al. 2014, "medium": 650 units)."""

    def __init__(self, vocab: int = 10_000, hidden: int = 650, layers: int = 2, dropout: float = 0.5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, layers, dropout=dropout if layers > 1 else 0.0, batch_first=True)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.drop(self.embed(tokens)))
        logits: torch.Tensor = self.head(self.drop(out))
        return logits.reshape(-1, logits.shape[-1])  # (batch * seq, vocab), to match flattened targets


def small_cnn(num_classes: int = 10, width: int = 32) -> nn.Module:
    """A LeNet-style CNN for 28x28 single-channel images (the paper's small MNIST network)."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * width * 7 * 7, 4 * width),
        nn.ReLU(inplace=True),
        nn.Linear(4 * width, num_classes),
    )

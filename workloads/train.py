"""A plain synthetic-data training loop with a per-step hook and a time budget."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from workloads.catalog import Workload, synthetic_batch


@dataclass(frozen=True)
class TrainResult:
    steps: int
    seconds: float
    final_loss: float

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


def pick_device(name: str = "auto") -> torch.device:
    """``auto``: CUDA when available, else the CPU; otherwise the named device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Trainer:
    """A workload's network, optimiser and one fixed synthetic batch on ``device``, ready to train."""

    def __init__(
        self, workload: Workload, batch_size: int, *, size: str = "full", device: torch.device | None = None, seed: int = 0
    ) -> None:
        self.device = device or pick_device()
        torch.manual_seed(seed)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # the warm-up steps pick the kernels
        shape = workload.shapes[size]
        self.model: nn.Module = shape.build().to(self.device)
        self.model.train()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()
        self.x, self.y = synthetic_batch(shape, batch_size, self.device, seed)
        self._sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)

    def run(
        self,
        *,
        duration_s: float | None = None,
        max_steps: int | None = None,
        on_step: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> TrainResult:
        """Train until ``duration_s`` or ``max_steps`` (at least one step).

        ``on_step(step_time_s)`` is called after every step with the step's wall
        time (on CUDA, once the step's kernels have finished).
        """
        if duration_s is None and max_steps is None:
            raise ValueError("give duration_s or max_steps")
        steps = 0
        loss = torch.zeros(())
        start = clock()
        while True:
            t0 = clock()
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.model(self.x), self.y)
            loss.backward()
            self.optimizer.step()
            self._sync()
            t1 = clock()
            steps += 1
            if on_step is not None:
                on_step(t1 - t0)
            if (max_steps is not None and steps >= max_steps) or (duration_s is not None and t1 - start >= duration_s):
                break
        return TrainResult(steps, clock() - start, float(loss.detach().cpu()))


def train(
    workload: Workload,
    batch_size: int,
    *,
    size: str = "full",
    device: torch.device | None = None,
    duration_s: float | None = None,
    max_steps: int | None = None,
    on_step: Callable[[float], None] | None = None,
    seed: int = 0,
) -> TrainResult:
    """Build and train ``workload`` in one call (see :class:`Trainer`)."""
    trainer = Trainer(workload, batch_size, size=size, device=device, seed=seed)
    return trainer.run(duration_s=duration_s, max_steps=max_steps, on_step=on_step)

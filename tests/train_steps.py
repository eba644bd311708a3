"""A plain PyTorch training script (no aip import) whose steps take a known time: the step hook's test subject.

``python train_steps.py OUT.json [STEPS] [STEP_S]``: trains a tiny CPU model for STEPS steps (default 300),
each holding ``STEP_S`` seconds (default 0.01) of sleep besides its forward, backward and optimizer step, and
writes its own measured mean step time (from the end of the first step to the end of the last) to OUT.json.
"""

import json
import sys
import time

import torch


def main() -> None:
    out = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    step_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.01
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    ends = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        time.sleep(step_s)  # the step's known cost
        optimizer.step()
        ends.append(time.perf_counter())
    with open(out, "w") as f:
        json.dump({"steps": steps, "step_time_s": (ends[-1] - ends[0]) / (steps - 1)}, f)


if __name__ == "__main__":
    main()

"""Place a job on the GPU where it interferes least, from the live predictions.

Next to `aip up` (or any worker):  python examples/scheduler.py "ResNet-50 (batch size 64)" [GPU ...]
Without GPUs it chooses among every GPU it has heard of.  Settings come from AIP_* variables.
"""

import sys

from clients import SchedulerClient
from config import Settings

job_type = sys.argv[1] if len(sys.argv) > 1 else "ResNet-50 (batch size 64)"
client = SchedulerClient(Settings.from_env(), from_beginning=True)
client.catch_up(timeout_s=15.0)  # read what the topics hold; a service would call client.start() instead
gpus = sys.argv[2:] or sorted(client.snapshot())
for gpu, cost in client.ranked(job_type, gpus)[:5]:
    print(f"{gpu}: predicted cost {'unknown' if cost is None else f'{cost:.1f} %'}")
print("best GPU:", client.best_gpu(job_type, gpus))
client.close()

"""React to interference alerts: ask for the job to be moved, once per raised alert, with a cool-down.

Next to `aip up` (or any worker):  python examples/load_balancer.py [--cooldown-s 120] [--from-beginning]
Replace `ask_to_move` with your cluster's call (Kubernetes eviction, Slurm requeue, a ticket...).
"""

import argparse
import json

from clients import LoadBalancer, MoveRequest
from config import Settings


def ask_to_move(request: MoveRequest) -> None:
    """The callback: here it prints one JSON line per move request."""
    print(
        json.dumps({"move": request.job_id, "off": request.gpu_uuid, "interference_pct": round(request.interference_pct, 1)}),
        flush=True,
    )


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--cooldown-s", type=float, default=120.0, help="per-GPU pause after a move request (s)")
parser.add_argument("--from-beginning", action="store_true", help="also handle alerts already on the topic")
args = parser.parse_args()
try:
    LoadBalancer(ask_to_move, cooldown_s=args.cooldown_s).run(Settings.from_env(), from_beginning=args.from_beginning)
except KeyboardInterrupt:
    pass

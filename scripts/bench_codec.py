"""Decode and encode microseconds per record, this tree against another checkout, in one run.

    python scripts/bench_codec.py --against /path/to/other/checkout [--rounds 5] [--repeat 3]

The payloads are made once, here (the simulator's samples and lifecycle events, stage 1's
observations and stage 2's predictions of a short simulated fleet); each tree then decodes
the same bytes and encodes the records it decoded, in a subprocess of its own with
``PYTHONPATH`` set to it.  The trees take turns for ``--rounds`` rounds (so that a busy
moment of the machine falls on both), each round ``--repeat`` passes over every payload;
the figure is the best pass, per record.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

KINDS = {  # label -> (topic, record class name)
    "MetricSample": "gpu.metrics",
    "JobEvent": "jobs.lifecycle",
    "Observation": "interference.observations",
    "Prediction": "interference.predictions",
}
START_TS = 1_700_000_000.0


def payloads(per_kind: int) -> dict[str, list[str]]:
    """The JSON of up to ``per_kind`` records of each kind, from this tree's pipeline."""
    from events import encode
    from producers.sim import Simulator
    from streams.serving import LearnAndServe
    from streams.stage1 import Stage1

    events = [r for _t, r in Simulator(gpus=2, gpu_model="v100", seed=1, start_ts=START_TS, duration_s=600.0).events()]
    stage1 = Stage1(window_s=10.0, lateness_s=2.0)
    observations = [o for e in events for o in (stage1.on_metric(e) if hasattr(e, "power_w") else stage1.on_job(e))]
    with tempfile.TemporaryDirectory() as state_dir:
        stage2 = LearnAndServe.build(clock=lambda: START_TS + 600.0, max_pct=20.0, state_dir=Path(state_dir))
        predictions = [p for o in observations for p in stage2.on_observation(o).predictions]
    records = [*events, *observations, *sorted(predictions, key=lambda p: -len(p.what_if))]  # placement ones first
    out: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for record in records:
        kind = type(record).__name__
        if len(out[kind]) < per_kind:
            out[kind].append(encode(record).decode())
    return out


def best_us(fn: Callable[[Any], object], items: list[Any], repeat: int) -> float:
    """Best of ``repeat`` passes of ``fn`` over ``items``, in microseconds per item."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, time.perf_counter() - t0)
    return best / len(items) * 1e6


def measure(path: Path, repeat: int) -> dict[str, dict[str, float]]:
    """Decode and encode microseconds per record of each kind, with the ``events`` on ``sys.path``."""
    from events import RECORD_OF, decode, encode

    out = {}
    for kind, raw in json.loads(path.read_text()).items():
        cls = RECORD_OF[KINDS[kind]]
        data = [r.encode() for r in raw]
        records = [decode(cls, d) for d in data]
        assert [encode(r) for r in records] == data  # both trees write the same bytes
        out[kind] = {
            "records": len(data),
            "decode_us": best_us(functools.partial(decode, cls), data, repeat),
            "encode_us": best_us(encode, records, repeat),
        }
    return out


def run(tree: Path, path: Path, repeat: int) -> dict[str, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, __file__, "--measure", str(path), "--repeat", str(repeat)]
    result: dict[str, dict[str, float]] = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True).stdout)
    return result


def best(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per kind and figure, the lowest of the rounds."""
    return {kind: {k: min(r[kind][k] for r in rounds) for k in rounds[0][kind]} for kind in rounds[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, help="the other checkout (for example a worktree of main)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--per-kind", type=int, default=2000)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.repeat)))
        return
    here = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "payloads.json"
        path.write_text(json.dumps(payloads(args.per_kind)))
        trees = {"this": here, **({"against": args.against.resolve()} if args.against else {})}
        rounds: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                rounds[name].append(run(tree, path, args.repeat))
    results = {name: best(r) for name, r in rounds.items()}
    print(f"{'record':<14}{'n':>6}" + "".join(f"{name + ' ' + op:>18}" for op in ("decode_us", "encode_us") for name in results))
    for kind in KINDS:
        row = [results[name][kind] for name in results]
        cells = "".join(f"{r[op]:>18.2f}" for op in ("decode_us", "encode_us") for r in row)
        print(f"{kind:<14}{row[0]['records']:>6}{cells}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()

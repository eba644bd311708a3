"""One training job: ``python -m workloads.run --model resnet50 --batch-size 32 --duration 20``.

Builds the network, trains a few warm-up steps (CUDA context, cuDNN autotuning),
then reports ``started``, progress and ``finished`` to ``jobs.lifecycle``
through the producers' job reporter (:class:`producers.lifecycle.JobReporter`;
broker, topic prefix and, under ``aip run-job``, job id, type and GPU from the
``AIP_*`` environment) while training for ``--duration`` seconds.  With ``--wait-go`` it prints ``ready`` after the
warm-up and waits for a line ``go GO_AT END_AT`` (Unix seconds) on stdin, so a
driver can start co-located jobs at the same instant.  Prints one JSON summary
line on stdout at the end; progress and errors go to stderr.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import torch

from config import Settings, SettingsError
from producers.lifecycle import JobReporter
from workloads import catalog
from workloads.catalog import SIZES
from workloads.train import Trainer, pick_device


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workloads.run", description="Train one synthetic-data workload and report its lifecycle."
    )
    p.add_argument("--model", required=True, choices=tuple(catalog.WORKLOADS), help="the network")
    p.add_argument("--batch-size", type=int, required=True, help="examples per step")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of training after the warm-up (default 20)")
    p.add_argument(
        "--size", choices=SIZES, default="full", help="full: the published network; tiny: a few channels, for CPU tests"
    )
    p.add_argument("--tiny", action="store_const", const="tiny", dest="size", help="same as --size tiny")
    p.add_argument("--device", default="auto", help="auto (CUDA when available, else CPU), cpu, cuda, cuda:1 ...")
    p.add_argument("--threads", type=int, help="CPU threads torch may use (default: torch's)")
    p.add_argument("--warmup-steps", type=int, default=3, help="steps trained before reporting starts (default 3)")
    p.add_argument("--job-id", help="default: $AIP_JOB_ID, else <job type>-<random>")
    p.add_argument("--job-type", help="default: $AIP_JOB_TYPE, else <model>-bs<batch size>")
    p.add_argument(
        "--gpu-uuid", help="GPU in lifecycle events (default: $AIP_JOB_GPU_UUID, else the CUDA device's UUID, else cpu-<host>)"
    )
    p.add_argument("--report-every", type=float, default=1.0, help="at most one progress event per this many seconds (default 1)")
    p.add_argument("--no-report", action="store_true", help="train without publishing lifecycle events")
    p.add_argument(
        "--wait-go", action="store_true", help="after the warm-up print 'ready' and wait for 'go GO_AT END_AT' on stdin"
    )
    return p


def device_uuid(device: torch.device) -> str:
    """NVML's name for the CUDA device (``GPU-<uuid>``), or ``cpu-<host>``."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        raw = getattr(props, "uuid", None)
        if raw is not None:
            return f"GPU-{raw}"
    return f"cpu-{socket.gethostname()}"


def wait_go(stdin: Any = sys.stdin, stdout: Any = sys.stdout) -> tuple[float, float]:
    """Print ``ready``; read ``go GO_AT END_AT``; return the two instants."""
    print("ready", file=stdout, flush=True)
    line = stdin.readline().split()
    if len(line) != 3 or line[0] != "go":
        raise SystemExit(f"workloads.run: expected 'go GO_AT END_AT' on stdin, got {' '.join(line)!r}")
    return float(line[1]), float(line[2])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.batch_size < 1 or args.duration <= 0:
        print("workloads.run: error: --batch-size and --duration must be positive", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    workload = catalog.get(args.model)
    try:
        device = pick_device(args.device)
        settings = Settings.from_env()
    except (RuntimeError, SettingsError) as exc:
        print(f"workloads.run: error: {exc}", file=sys.stderr)
        return 2
    job_type = args.job_type or settings.job_type or workload.job_type(args.batch_size)
    job_id = args.job_id or settings.job_id or f"{job_type}-{uuid.uuid4().hex[:8]}"
    trainer = Trainer(workload, args.batch_size, size=args.size, device=device)
    if args.warmup_steps > 0:
        trainer.run(max_steps=args.warmup_steps)
    end_at: float | None = None  # with --wait-go every job ends at the same moment; without, --duration of training
    if args.wait_go:
        go_at, end_at = wait_go()
        time.sleep(max(0.0, go_at - time.time()))

    reporter = JobReporter(
        job_type,
        job_id=job_id,
        gpu_uuid=args.gpu_uuid or settings.job_gpu_uuid or device_uuid(device),
        batch_size=args.batch_size,
        settings=settings,
        publish=(lambda topic, record: None) if args.no_report else None,
        min_interval_s=args.report_every,
    )
    with reporter:
        duration_s = args.duration if end_at is None else max(0.0, end_at - time.time())
        result = trainer.run(duration_s=duration_s, on_step=lambda _step_time_s: reporter.step())
    summary = {"job_id": job_id, "job_type": job_type, "device": str(device), "steps": result.steps,
               "seconds": round(result.seconds, 3), "steps_per_s": round(result.steps_per_s, 3)}  # fmt: skip
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

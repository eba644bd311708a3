"""``aip experiment``: run jobs solo and co-located on one GPU, record, and build the observations CSV."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from aip.common import add_kafka_args, broker_errors, settings_from, sigterm_as_interrupt
from aip.errors import CliError

DEFAULT_JOBS = "resnet50:32,vgg16:32,alexnet:128,lstm:40,cnn:256"
CONFIG_ARGS = ("duration_per_run_s", "triples", "size", "device", "window_s", "sample_interval_s", "gpu_index", "max_wall_s")
"""Options that are :class:`workloads.experiment.ExperimentConfig` fields of the same name (their ``dest``)."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "experiment",
        help="run training jobs solo and co-located on one GPU while NVML is sampled; write recordings, observations CSV and table",
        description="Each job solo, then every pair (and --triples triples) on one GPU, sampled by `aip produce nvml`. "
        "Writes recordings/ (aip tail --json lines), observations.csv, table.md, runs.json and summary.json under --out.",
    )
    p.add_argument(
        "--jobs",
        default=DEFAULT_JOBS,
        help=f"comma-separated MODEL:BATCH (models: resnet50 vgg16 alexnet lstm cnn); default {DEFAULT_JOBS}",
    )
    p.add_argument(
        "--duration-per-run", dest="duration_per_run_s", type=float, default=25.0, help="seconds each run trains, rounded to whole windows (default 25)"
    )
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--triples", type=int, default=0, help="also run the first N triples (default 0)")
    p.add_argument("--size", choices=("full", "tiny"), default="full", help="full networks (GPU) or tiny ones (CPU rehearsal)")
    p.add_argument("--device", default="auto", help="torch device of the jobs: auto, cuda, cpu (default auto)")
    p.add_argument("--window", dest="window_s", type=float, default=5.0, help="stage-1 window length in seconds for the conversion (default 5)")
    p.add_argument("--interval", dest="sample_interval_s", type=float, default=0.5, help="NVML sampling interval in seconds, at most 1 (default 0.5)")
    p.add_argument("--gpu-index", type=int, default=0, help="NVML index of the GPU to use (default 0)")
    p.add_argument(
        "--max-wall",
        dest="max_wall_s",
        type=float,
        help="skip the remaining runs (pairs and triples come last) when the next would end after this many seconds",
    )
    p.add_argument(
        "--job-arg",
        dest="job_args",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for every `python -m workloads.run` (repeatable)",
    )
    p.add_argument(
        "--fake-nvml", action="store_true", help="sample a fake GPU in-process instead of `aip produce nvml` (CPU rehearsal)"
    )
    p.add_argument(
        "--convert-only", action="store_true", help="only rebuild observations.csv and the table from --out's recordings"
    )
    add_kafka_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from aip.broker import BrokerError, EmbeddedBroker, free_port
    from workloads.experiment import ExperimentConfig, ExperimentError, convert_outputs, parse_job, run_experiment

    settings = settings_from(args)
    out = Path(args.out)
    try:
        if args.convert_only:
            print(json.dumps(convert_outputs(out, args.window_s)))
            return 0
        cfg = ExperimentConfig(
            jobs=[parse_job(t) for t in args.jobs.split(",") if t.strip()],
            out_dir=out,
            job_args=list(args.job_args),
            **{name: getattr(args, name) for name in CONFIG_ARGS},
        )
        cfg.check()
        nvml = None
        if args.fake_nvml:
            from producers.fakenvml import FakeGpu, FakeNvml

            nvml = FakeNvml([FakeGpu("GPU-fake-0000", name="fake")])
        broker = None
        if not args.broker:
            broker = EmbeddedBroker(port=free_port()).start()
            settings = settings.replace(broker=broker.address)
        if not settings.spool_dir:
            settings = settings.replace(spool_dir=str(out / "spool"))
        try:
            with broker_errors(), sigterm_as_interrupt():
                summary = run_experiment(cfg, settings, nvml=nvml)
        finally:
            if broker is not None:
                broker.stop()
    except (ExperimentError, BrokerError) as exc:
        raise CliError(str(exc)) from None
    print(
        json.dumps(
            {
                k: summary[k]
                for k in ("environment", "runs", "failed_runs", "skipped_runs", "rows", "labelled_rows", "groups", "wall_s")
            }
        )
    )
    return 1 if summary["failed_runs"] else 0

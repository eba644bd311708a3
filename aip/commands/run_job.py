"""``aip run-job --type T [--gpu UUID] -- CMD ...``: run a command and report its lifecycle and its steps.

Started and finished come from here; progress from the step hook (``producers/stephook``) that it puts first
on the command's ``PYTHONPATH``: a Python child that imports torch reports its optimizer steps to a
:class:`producers.stepcollector.StepCollector` this process runs on a temporary unix socket
(``AIP_STEP_SOCKET``), with no change to the script.  A script that reports with ``JobReporter`` itself is
counted there instead, once.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from typing import Any

from aip.common import add_kafka_args, broker_errors, settings_from
from aip.errors import CliError


def register(sub: Any) -> None:
    p = sub.add_parser("run-job", help="run a training command and report started/finished (and its progress) to jobs.lifecycle")
    p.add_argument("--type", required=True, dest="job_type", help="job type, e.g. 'ResNet-50 (batch size 64)'")
    p.add_argument("--gpu", help="GPU UUID the job runs on (default: GPU 0 as NVML reports it)")
    p.add_argument("--job-id", help="job id (default: a new uuid)")
    p.add_argument("--batch-size", type=int, help="batch size, if known")
    p.add_argument(
        "--no-step-hook",
        action="store_true",
        help="do not inject the step hook (progress then comes only from a script that uses JobReporter)",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    add_kafka_args(p)
    p.set_defaults(func=run)


def _gpu_zero() -> str:
    from producers.nvml import NvmlSampler, NvmlUnavailable

    try:
        sampler = NvmlSampler().open()
    except (ModuleNotFoundError, NvmlUnavailable):
        raise CliError("no GPU UUID: pass --gpu UUID (NVML is not available to find one)") from None
    try:
        if not sampler.devices:
            raise CliError("no GPU UUID: NVML found no GPU; pass --gpu UUID")
        return sampler.devices[0].uuid
    finally:
        sampler.close()


def run(args: argparse.Namespace) -> int:
    from producers.publisher import Publisher, PublisherError
    from transport import check_reachable

    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        raise CliError("no command given: aip run-job --type T -- CMD ARGS...")
    gpu = args.gpu or _gpu_zero()
    job_id = args.job_id or f"job-{uuid.uuid4().hex[:12]}"
    settings = settings_from(args)
    with broker_errors():
        check_reachable(settings)
        try:
            pub = Publisher(settings, f"run-job-{job_id}")
        except PublisherError as exc:
            raise CliError(str(exc)) from None
    host = settings.host or socket.gethostname()
    with tempfile.TemporaryDirectory(prefix="aip-steps-") as tmp:
        return _run(args, cmd, settings, pub, gpu, job_id, host, None if args.no_step_hook else os.path.join(tmp, "steps.sock"))


def _child_env(
    settings: Any, args: argparse.Namespace, gpu: str, job_id: str, host: str, step_socket: str | None
) -> dict[str, str]:
    from producers.stephook import HOOK_DIR

    env = dict(os.environ)
    # the wrapped script's progress events are keyed by host, as this host's GPU samples: the same name
    env |= {
        "AIP_HOST": host,
        "AIP_BROKER": settings.broker,
        "AIP_TOPIC_PREFIX": settings.topic_prefix,
        "AIP_JOB_ID": job_id,
        "AIP_JOB_TYPE": args.job_type,
        "AIP_JOB_GPU_UUID": gpu,
        "AIP_JOB_BATCH_SIZE": str(args.batch_size or 0),
        "AIP_JOB_WRAPPED": "1",
    }
    if step_socket is not None:
        env["AIP_STEP_SOCKET"] = step_socket
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOK_DIR), env.get("PYTHONPATH", "")) if p)
    return env


def _run(
    args: argparse.Namespace, cmd: list[str], settings: Any, pub: Any, gpu: str, job_id: str, host: str, step_socket: str | None
) -> int:
    from producers.lifecycle import JobReporter
    from producers.stepcollector import StepCollector, one_job

    collector = None
    if step_socket is not None:
        collector = StepCollector(step_socket, one_job(job_id, args.job_type, gpu, args.batch_size), pub.publish, host=host)
        try:
            collector.open()
        except OSError as exc:
            print(f"aip run-job: no step collector ({exc}); steps are not measured", file=sys.stderr)
            collector, step_socket = None, None
    env = _child_env(settings, args, gpu, job_id, host, step_socket)
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        if collector is not None:
            collector.close()
        pub.close(timeout_s=1)
        raise CliError(f"cannot run {cmd[0]!r}: {exc.strerror or exc}", code=127) from None
    reporter = JobReporter(
        args.job_type,
        job_id=job_id,
        gpu_uuid=gpu,
        batch_size=args.batch_size,
        settings=settings,
        publish=pub.publish,
        host=host,
        pid=proc.pid,
        wrapped=False,
    )
    reporter.__enter__()
    previous = signal.signal(signal.SIGTERM, lambda s, f: proc.send_signal(signal.SIGTERM))
    try:
        code = _wait(proc, collector)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if collector is not None:
        collector.poll()  # the reports the child sent as it exited
        collector.close()
        reporter.steps = collector.steps(job_id) or 0
    reporter.finish(code)
    left = pub.close(timeout_s=10.0)
    if left:
        print(f"aip run-job: {left} lifecycle records not delivered yet (kept in the spool)", file=sys.stderr)
    return code


def _wait(proc: subprocess.Popen[bytes], collector: Any) -> int:
    """Wait for the child, collecting its step reports meanwhile; Ctrl-C is passed on to it."""
    while True:
        try:
            if collector is None:
                return proc.wait()
            code = proc.poll()
            if code is not None:
                return code
            collector.poll(timeout_s=0.25)
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)

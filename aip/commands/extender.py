"""``aip extender``: HTTP scoring for schedulers that do not read Kafka (kube-scheduler, Volcano).

Follows ``interference.predictions`` and ``jobs.lifecycle`` with :class:`clients.SchedulerClient`
and serves :mod:`clients.extender`: ``POST /filter`` and ``POST /prioritize`` (kube-scheduler
extender v1), ``POST /volcano/predicate`` and ``POST /volcano/prioritize`` (Volcano's extender
plugin), ``GET /score``, ``GET /healthz`` and ``GET /metrics``.  No faust, no models.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from aip.common import add_kafka_args, broker_errors, settings_from, sigterm_as_interrupt
from aip.errors import CliError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "extender", help="HTTP scoring for kube-scheduler and Volcano (extender verbs) from the live predictions"
    )
    p.add_argument("--host", help="address to listen on (default: $AIP_EXTENDER_HOST, 127.0.0.1; 0.0.0.0 in a container)")
    p.add_argument("--port", type=int, help="port (default: $AIP_EXTENDER_PORT, 8888; 0: a free port)")
    p.add_argument(
        "--full-scale-pct",
        type=float,
        help="predicted cost (newcomer + existing slowdown, %%) that scores 0; the score falls linearly from 10 at 0 "
        "(default: $AIP_EXTENDER_FULL_SCALE_PCT, 250)",
    )
    p.add_argument(
        "--neutral-score",
        type=int,
        help="score 0-10 of a node without predictions or a pod without a job type (default: $AIP_EXTENDER_NEUTRAL_SCORE, 5)",
    )
    p.add_argument("--max-age", type=float, default=300.0, help="ignore predictions older than this many seconds (default 300)")
    p.add_argument(
        "--from-beginning",
        action="store_true",
        help="read the topics' whole history first (then each GPU's job set is known at once; default: from now on)",
    )
    add_kafka_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clients import SchedulerClient
    from clients.extender import ExtenderServer, Scorer

    settings = settings_from(
        args,
        extender_host=args.host,
        extender_port=args.port,
        extender_full_scale_pct=args.full_scale_pct,
        extender_neutral_score=args.neutral_score,
    )
    if not 0 <= settings.extender_port <= 65535:
        raise CliError(f"--port {settings.extender_port} is not a TCP port (0-65535)")
    if args.max_age <= 0:
        raise CliError("--max-age must be positive")
    stop = threading.Event()
    with broker_errors(), sigterm_as_interrupt():
        client = SchedulerClient(settings, from_beginning=args.from_beginning, max_age_s=args.max_age)
        try:
            scorer = Scorer(client, full_scale_pct=settings.extender_full_scale_pct, neutral_score=settings.extender_neutral_score)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        try:
            server = ExtenderServer(scorer, settings.extender_host, settings.extender_port)
        except OSError as exc:
            raise CliError(f"cannot listen on {settings.extender_host}:{settings.extender_port}: {exc.strerror or exc}") from None
        try:
            client.start()
            server.start()
            print(
                f"extender ready at {server.url} (kube-scheduler: /filter /prioritize; Volcano: /volcano/predicate "
                f"/volcano/prioritize; /score /healthz /metrics); following {settings.broker}",
                flush=True,
            )
            stop.wait()
        except KeyboardInterrupt:
            pass
        finally:
            server.close()
            client.close()
    print("extender stopped", file=sys.stderr, flush=True)
    return 0

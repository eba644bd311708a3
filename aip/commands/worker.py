"""``aip worker``: one stream worker (stage 1 and stage 2) until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
from typing import Any

from aip.common import add_kafka_args, broker_errors, settings_from

LOGLEVELS = ("crit", "error", "warn", "info", "debug")


def register(sub: Any) -> None:
    p = sub.add_parser("worker", help="run one stream worker (per-GPU windows, models, predictions, alerts)")
    p.add_argument(
        "--web-port", type=int, help="HTTP port for /predictions/{gpu_uuid}, /leaderboard, /metrics (default: $AIP_WEB_PORT)"
    )
    p.add_argument("--loglevel", default="warn", choices=LOGLEVELS, help="worker log level (default warn)")
    p.add_argument("--no-create-topics", action="store_true", help="do not create the project topics at start")
    add_kafka_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from streams.app import run_worker
    from transport import check_reachable, ensure_project_topics

    settings = settings_from(args, web_port=args.web_port)
    with broker_errors():
        # Both paths check the address and the credentials first, so a wrong password is one line.
        if args.no_create_topics:
            check_reachable(settings)
        else:
            ensure_project_topics(settings)
    run_worker(settings, loglevel=args.loglevel)
    return 0

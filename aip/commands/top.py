"""``aip top``: the live view of a running pipeline's output topics (the view `aip up` shows)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from aip.common import add_kafka_args, broker_errors, settings_from, sigterm_as_interrupt
from aip.view import OUTPUT_TOPICS, LiveState
from events import Topics


def register(sub: Any) -> None:
    p = sub.add_parser("top", help="live view: per GPU job set, interference, alerts; the leaderboard")
    p.add_argument("--from-beginning", action="store_true", help="fold in everything already on the topics")
    add_kafka_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from transport import RecordConsumer

    settings = settings_from(args)
    state = LiveState(Topics(settings.topic_prefix))
    with broker_errors(), sigterm_as_interrupt():
        consumer = RecordConsumer(settings, OUTPUT_TOPICS, from_beginning=args.from_beginning)
        try:
            with Live(state.render(), refresh_per_second=2, console=Console(file=sys.stdout)) as live:
                while True:
                    for item in consumer.poll(timeout_s=0.5):
                        state.add(item)
                    live.update(state.render())
        except KeyboardInterrupt:
            return 0
        finally:
            consumer.close()

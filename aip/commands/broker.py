"""``aip broker``: run the embedded Kafka-compatible broker in the foreground."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any

from aip.broker import BrokerError, EmbeddedBroker
from aip.errors import CliError
from config import EMBEDDED_HOST, EMBEDDED_PORT


def register(sub: Any) -> None:
    p = sub.add_parser("broker", help="run the embedded Kafka-compatible broker (Tansu, memory only)")
    p.add_argument("--host", default=EMBEDDED_HOST, help=f"address to listen on (default {EMBEDDED_HOST})")
    p.add_argument("--port", type=int, default=EMBEDDED_PORT, help=f"port (default {EMBEDDED_PORT})")
    p.add_argument("--authentication", action="store_true", help="require SASL authentication (create users with `tansu user`)")
    p.add_argument("--cert", help="TLS certificate file")
    p.add_argument("--key", help="TLS key file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    broker = EmbeddedBroker(args.host, args.port, authentication=args.authentication, cert=args.cert, key=args.key)
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        broker.start()
    except BrokerError as exc:
        raise CliError(str(exc)) from None
    print(f"broker ready at {broker.address} (memory only; Ctrl-C stops it)", flush=True)
    try:
        while not stopping:
            if not broker.alive():
                print("aip broker: error: the broker process exited", file=sys.stderr)
                return 1
            time.sleep(0.2)
    finally:
        broker.stop()
    print("broker stopped", flush=True)
    return 0

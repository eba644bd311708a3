"""``aip broker``: run the embedded Kafka-compatible broker in the foreground."""

from __future__ import annotations

import argparse
import logging
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
    p.add_argument(
        "--users",
        metavar="FILE",
        help="require SASL authentication (PLAIN, SCRAM-SHA-256/512) at an authenticating front; FILE holds lines "
        'user:password or a JSON object {"user": "password"} (local and test use: PLAIN is clear text without TLS)',
    )
    p.add_argument(
        "--authentication",
        action="store_true",
        help="Tansu's own SASL (SCRAM users in its storage, which cannot be created on the memory broker; prefer --users)",
    )
    p.add_argument("--cert", help="TLS certificate file")
    p.add_argument("--key", help="TLS key file")
    p.set_defaults(func=run)


def _users(path: str | None) -> dict[str, str] | None:
    if path is None:
        return None
    from aip.authfront import UsersFileError, load_users

    try:
        return load_users(path)
    except UsersFileError as exc:
        raise CliError(str(exc)) from None


def _log_front() -> None:
    """The front's log (connections authenticated and refused; never a password) goes to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("aip broker: %(message)s"))
    front_log = logging.getLogger("aip.authfront")
    front_log.addHandler(handler)
    front_log.setLevel(logging.INFO)
    front_log.propagate = False


def run(args: argparse.Namespace) -> int:
    users = _users(getattr(args, "users", None))
    broker = EmbeddedBroker(args.host, args.port, authentication=args.authentication, cert=args.cert, key=args.key, users=users)
    if users:
        _log_front()
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
    auth = f"; SASL PLAIN/SCRAM required, {len(users)} users" if users else ""
    print(f"broker ready at {broker.address} (memory only{auth}; Ctrl-C stops it)", flush=True)
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

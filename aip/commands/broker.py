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
        'user:password or a JSON object {"user": "password"} (PLAIN is clear text without --tls-cert)',
    )
    p.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="serve TLS (1.2 or newer) at the front with this certificate chain: clients use SASL_SSL with --users, "
        "SSL without",
    )
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key (default: in the --tls-cert file)")
    p.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help="also require a client certificate signed by this CA (mutual TLS; clients set AIP_SSL_CERTFILE/AIP_SSL_KEYFILE)",
    )
    p.add_argument(
        "--authentication",
        action="store_true",
        help="Tansu's own SASL (SCRAM users in its storage, which cannot be created on the memory broker; prefer --users)",
    )
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
    """The front's log (TLS handshakes refused, connections authenticated and refused; never a password) goes to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("aip broker: %(message)s"))
    front_log = logging.getLogger("aip.authfront")
    front_log.addHandler(handler)
    front_log.setLevel(logging.INFO)
    front_log.propagate = False


def run(args: argparse.Namespace) -> int:
    users = _users(getattr(args, "users", None))
    try:
        broker = EmbeddedBroker(
            args.host,
            args.port,
            authentication=args.authentication,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_client_ca=args.tls_client_ca,
            users=users,
        )
    except BrokerError as exc:
        raise CliError(str(exc)) from None
    if users or broker.tls:
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
    tls = "; TLS" + (", client certificates required" if args.tls_client_ca else "") if broker.tls else ""
    auth = f"; SASL PLAIN/SCRAM required, {len(users)} users" if users else ""
    print(
        f"broker ready at {broker.address} (memory only{tls}{auth}; clients set AIP_SECURITY_PROTOCOL="
        f"{broker.security_protocol}; Ctrl-C stops it)",
        flush=True,
    )
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

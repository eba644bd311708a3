"""Arguments and helpers shared by the sub-commands."""

from __future__ import annotations

import argparse
import contextlib
import signal
from collections.abc import Iterator
from typing import Any

from aip.errors import CliError
from config import Settings, SettingsError


def add_kafka_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Kafka")
    group.add_argument("--broker", help="host:port, a comma-separated list, or kafka://host:port (default: $AIP_BROKER, else the embedded broker's address)")
    group.add_argument("--topic-prefix", help="prefix of every topic name (default: $AIP_TOPIC_PREFIX)")


def settings_from(args: argparse.Namespace, **extra: Any) -> Settings:
    """Settings from the environment, overridden by the command line."""
    try:
        return Settings.from_env(broker=getattr(args, "broker", None), topic_prefix=getattr(args, "topic_prefix", None), **extra)
    except SettingsError as exc:
        raise CliError(str(exc)) from None


@contextlib.contextmanager
def broker_errors() -> Iterator[None]:
    """Turn transport errors into one-line CLI errors."""
    from transport import BrokerUnavailable

    try:
        yield
    except BrokerUnavailable as exc:
        raise CliError(str(exc), code=1) from None


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C so that every command stops cleanly on either."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

"""The ``aip`` command: argument parsing and wiring only.

Each sub-command lives in ``aip/commands/<name>.py`` and exposes
``register(subparsers)``, which adds its parser and sets ``func``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from aip.errors import CliError
from config import SettingsError

COMMANDS = ("broker", "up", "produce", "worker", "tail", "top", "evaluate", "bench", "run_job", "hook", "report", "experiment", "extender")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aip",
        description="Streaming GPU co-location interference prediction (AIP) on Kafka.",
    )
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"aip.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:  # a Ctrl-C while the commands' modules import (torch, faust: seconds) is no traceback either
        parser = build_parser()
    except KeyboardInterrupt:
        return 130
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (CliError, SettingsError) as exc:
        code = getattr(exc, "code", 2)
        print(f"aip {args.command}: error: {exc}", file=sys.stderr)
        return code
    except BrokenPipeError:
        return 0


def run() -> None:  # console-script entry point
    sys.exit(main())


if __name__ == "__main__":
    run()

"""`aip produce`: not built yet (see the open issues)."""

from __future__ import annotations

import argparse
from typing import Any

from aip.errors import CliError


def register(sub: Any) -> None:
    p = sub.add_parser("produce", help="(not built yet)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise CliError("`aip produce` is not built yet")

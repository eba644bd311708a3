"""Errors the CLI reports as one line (no traceback)."""

from __future__ import annotations


class CliError(Exception):
    """A user-facing error: what was wrong and how to fix it."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code

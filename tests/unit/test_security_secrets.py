"""Secrets never appear in ``--help`` output, logs or error messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-Pa55-do-not-print"


def aip(*args: str, env: dict[str, str] | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aip.cli", *args],
        cwd=ROOT,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def secret_env(tmp_path: Path) -> dict[str, str]:
    from aip.broker import free_port

    return dict(
        os.environ,
        AIP_BROKER=f"127.0.0.1:{free_port()}",  # nothing listens there
        AIP_SECURITY_PROTOCOL="SASL_PLAINTEXT",
        AIP_SASL_MECHANISM="PLAIN",
        AIP_SASL_USERNAME="alice",
        AIP_SASL_PASSWORD=SECRET,
        AIP_CONNECT_TIMEOUT_S="1",
        AIP_SPOOL_DIR=str(tmp_path / "spool"),
        AIP_STATE_DIR=str(tmp_path / "state"),
    )


def test_settings_never_print_the_password() -> None:
    from config import Settings

    s = Settings(sasl_password=SECRET, security_protocol="SASL_PLAINTEXT")
    assert SECRET not in repr(s) and SECRET not in str(s) and SECRET not in str(s.public_dict())
    assert s.sasl_password == SECRET


@pytest.mark.parametrize("command", [[], ["broker"], ["worker"], ["tail"], ["produce", "sim"], ["up"], ["bench"]])
def test_help_shows_no_secret(tmp_path: Path, command: list[str]) -> None:
    result = aip(*command, "--help", env=secret_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout + result.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["tail", "gpu.metrics"],
        ["worker"],
        ["produce", "sim", "--gpus", "1", "--fast", "--sim-duration", "5"],
    ],
)
def test_connection_errors_are_one_line_without_the_secret(tmp_path: Path, command: list[str]) -> None:
    result = aip(*command, env=secret_env(tmp_path))
    output = result.stdout + result.stderr
    assert SECRET not in output
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "error" in lines[0]


@pytest.mark.parametrize("text", [f"alice {SECRET}\n", f'{{"alice": {SECRET!r}}}'])
def test_a_bad_users_file_is_one_line_without_the_password(tmp_path: Path, text: str) -> None:
    users = tmp_path / "users"
    users.write_text(text)
    result = aip("broker", "--port", "1", "--users", str(users), env=secret_env(tmp_path))
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "users file" in lines[0], result.stderr
    assert SECRET not in result.stdout + result.stderr

"""``aip broker`` in its own process, for the security tests that start it with their own flags."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from conftest import ROOT, wait_for

from aip.broker import free_port


def clean_env() -> dict[str, str]:
    """This process's environment without any ``AIP_`` setting."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AIP_")}


@dataclass
class CliBroker:
    """``aip broker`` in its own process; its stdout and stderr in files."""

    proc: subprocess.Popen[bytes]
    address: str
    out: Path
    err: Path

    def output(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)


def start_cli_broker(tmp: Path, *args: str) -> CliBroker:
    """``aip broker --port P *args`` on a free port, its output in ``tmp``; returned once it says it is ready."""
    port = free_port()
    out, err = tmp / "broker.out", tmp / "broker.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aip.cli", "broker", "--port", str(port), *args], cwd=ROOT, stdout=o, stderr=e, env=clean_env()
        )
    broker = CliBroker(proc, f"127.0.0.1:{port}", out, err)
    wait_for(lambda: "broker ready" in broker.output() or proc.poll() is not None, timeout_s=30, what=" ".join(["aip broker", *args]))
    assert proc.poll() is None, broker.output()
    return broker

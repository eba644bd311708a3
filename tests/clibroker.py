"""``aip broker`` in its own process, and its clients, for the security tests that start it with their own flags."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import ROOT, wait_for

from aip.broker import free_port


def clean_env() -> dict[str, str]:
    """This process's environment without any ``AIP_`` setting."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AIP_")}


def set_aip_env(monkeypatch: Any, env: dict[str, str]) -> None:
    """This process's ``AIP_`` environment replaced by ``env``'s, for a command run in-process (undone with
    ``monkeypatch``)."""
    for name in [n for n in os.environ if n.startswith("AIP_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("AIP_"):
            monkeypatch.setenv(name, value)


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
    wait_for(
        lambda: "broker ready" in broker.output() or proc.poll() is not None, timeout_s=30, what=" ".join(["aip broker", *args])
    )
    assert proc.poll() is None, broker.output()
    return broker


def client_env(address: str, tmp: Path, prefix: str, **settings: str) -> dict[str, str]:
    """The environment of a client of the broker at ``address``: a fresh topic prefix starting with ``prefix``,
    its spool and state in ``tmp``, then ``settings`` (``AIP_`` names)."""
    return (
        clean_env()
        | {
            "AIP_BROKER": address,
            "AIP_TOPIC_PREFIX": f"{prefix}{uuid.uuid4().hex[:10]}.",
            "AIP_PARTITIONS": "2",
            "AIP_CONNECT_TIMEOUT_S": "10",
            "AIP_GROUP_INSTANCE_ID": "none",  # dynamic membership: Tansu holds a static member's SyncGroup 3 s longer
            "AIP_SPOOL_DIR": str(tmp / "spool"),
            "AIP_STATE_DIR": str(tmp / "state"),
        }
        | settings
    )


def round_trip(settings: Any, tag: str | None = None, n: int = 20) -> None:
    """``n`` raw records, each with ``tag`` in it (by default the security protocol), produced to gpu.metrics and
    all read back."""
    from transport import RecordConsumer, RecordProducer, ensure_topics

    ensure_topics(settings, [settings.topic_prefix + "gpu.metrics"])
    tag = tag or f"over {settings.security_protocol}"
    values = [f"record {i} {tag}".encode() for i in range(n)]
    with RecordProducer(settings) as producer:
        for v in values:
            producer.send_raw("gpu.metrics", v, key=v[-3:])
        producer.flush(10)
    with RecordConsumer(settings, ["gpu.metrics"], from_beginning=True) as consumer:
        got = consumer.read(until=lambda items: len(items) >= len(values), timeout_s=20)
    assert sorted(r.value for r in got) == sorted(values)


def bad_input_dead_letters(
    settings: Any, timeout_s: float, stopped: Callable[[], bool] = lambda: False
) -> tuple[list[bytes], list[Any]]:
    """Three records that are not JSON sent to gpu.metrics, and the dead letters read back: as many, or what came
    within ``timeout_s`` or before ``stopped()`` (the worker died, say)."""
    from transport import RecordConsumer, RecordProducer, ensure_topics

    # the worker creates them too; created here, reading does not depend on how soon the worker started
    ensure_topics(settings, [settings.topic_prefix + name for name in ("gpu.metrics", "aip.deadletter")])
    bad = [f"not json {i}".encode() for i in range(3)]
    with RecordProducer(settings) as producer:
        for b in bad:
            producer.send_raw("gpu.metrics", b)
        producer.flush(10)
    with RecordConsumer(settings, ["aip.deadletter"], from_beginning=True) as consumer:
        letters = consumer.read(until=lambda items: len(items) >= len(bad) or stopped(), timeout_s=timeout_s)
    return bad, letters

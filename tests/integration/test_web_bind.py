"""The worker's web server listens where AIP_WEB_HOST says: another container reaches it only when it is 0.0.0.0."""

from __future__ import annotations

import dataclasses
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from aip.broker import free_port
from aip.faults.worker import WorkerProcess
from transport import ensure_project_topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _external_address() -> str | None:
    """This machine's address on its default route (what another container or host connects to)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing interface
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_worker_web_server_is_reachable_on_a_non_loopback_address_only_when_bound_to_all(settings: Any, tmp_path: Path) -> None:
    address = _external_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    ensure_project_topics(settings)
    ports = {}
    workers = []
    for host in ("0.0.0.0", "127.0.0.1"):
        s = dataclasses.replace(settings, web_host=host, state_dir=str(tmp_path / host / "state"))
        w = WorkerProcess(s, free_port(), tmp_path / f"worker-{host}.log").start()
        workers.append(w)
        ports[host] = w.web_port
    try:
        for w in workers:
            w.wait_ready()
        with urllib.request.urlopen(f"http://{address}:{ports['0.0.0.0']}/metrics", timeout=5) as r:
            assert b"aip_stream" in r.read()
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://{address}:{ports['127.0.0.1']}/metrics", timeout=5)
    finally:
        for w in workers:
            w.stop()

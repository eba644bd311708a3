"""The worker's web server listens where AIP_WEB_HOST says: another container reaches it only when it is 0.0.0.0.

"Another container" is a network namespace of its own (``ip netns``, iproute2: ``make setup``), joined to
this one by a veth pair, as a container on a bridge is: it reaches this machine only at this side's
address of the pair, never at 127.0.0.1.  Making one needs root (CAP_NET_ADMIN); without it the test fails
saying so, it does not skip.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aip.broker import free_port
from aip.faults.worker import WorkerProcess
from transport import ensure_project_topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FETCH = """
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
        print("status", r.status, b"aip_stream" in r.read())
except OSError as exc:
    print("refused", type(exc).__name__, exc)
"""


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if result.returncode != 0:
        pytest.fail(f"`ip {' '.join(args)}` failed ({result.stderr.strip()}): this test makes a network namespace, "
                    "which needs iproute2 (make setup installs it) and root (CAP_NET_ADMIN)")  # fmt: skip


@contextlib.contextmanager
def other_host() -> Iterator[tuple[str, str]]:
    """A network namespace joined to this one by a veth pair: (its name, this side's address in the pair)."""
    tag = uuid.uuid4().hex[:8]
    name, here, there = f"aip-{tag}", f"va{tag}", f"vb{tag}"
    net = f"10.{random.randrange(200, 250)}.{random.randrange(256)}.{4 * random.randrange(64)}"  # a /30 of our own
    base = net.rsplit(".", 1)
    near, far = f"{base[0]}.{int(base[1]) + 1}", f"{base[0]}.{int(base[1]) + 2}"
    _ip("netns", "add", name)
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        try:
            _ip("link", "set", there, "netns", name)
            _ip("addr", "add", f"{near}/30", "dev", here)
            _ip("link", "set", here, "up")
            _ip("-n", name, "addr", "add", f"{far}/30", "dev", there)
            _ip("-n", name, "link", "set", there, "up")
            yield name, near
        finally:
            subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=20)
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)


def fetch_from(namespace: str, url: str) -> str:
    """What a client in ``namespace`` gets for ``url``: "status 200 True" or "refused ..."."""
    result = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", FETCH, url],
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_worker_web_server_is_reachable_from_another_host_only_when_bound_to_all(settings: Any, tmp_path: Path) -> None:
    ensure_project_topics(settings)
    ports = {}
    workers = []
    for host in ("0.0.0.0", "127.0.0.1"):
        s = dataclasses.replace(settings, web_host=host, state_dir=str(tmp_path / host / "state"))
        w = WorkerProcess(s, free_port(), tmp_path / f"worker-{host}.log").start()
        workers.append(w)
        ports[host] = w.web_port
    try:
        with other_host() as (namespace, address):
            for w in workers:
                w.wait_ready()
            assert fetch_from(namespace, f"http://{address}:{ports['0.0.0.0']}/metrics") == "status 200 True"
            refused = fetch_from(namespace, f"http://{address}:{ports['127.0.0.1']}/metrics")
            assert refused.startswith("refused") and "Connection refused" in refused, refused
            # and on this machine itself, both answer at 127.0.0.1 (the refusal above is the bind's, not the port's)
            for port in ports.values():
                assert fetch_from_here(f"http://127.0.0.1:{port}/metrics") == "status 200 True"
    finally:
        stop_together(workers)


def stop_together(workers: list[WorkerProcess]) -> None:
    """SIGTERM to every worker first, then wait: their shutdowns overlap."""
    for w in workers:
        if w.alive():
            w.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    for w in workers:
        try:
            w.proc.wait(60)  # type: ignore[union-attr]  # within worker_stop_within_s (45 s)
        except subprocess.TimeoutExpired:
            w.kill()


def fetch_from_here(url: str) -> str:
    result = subprocess.run([sys.executable, "-c", FETCH, url], capture_output=True, text=True, timeout=30)
    return result.stdout.strip()

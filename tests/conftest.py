"""Shared fixtures.

Integration tests talk to one real embedded broker (Tansu) per test session,
started on a free port; every test gets a fresh uuid topic prefix and consumer
group, so tests never share topics and never reach localhost:9092.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "models" / "data"
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Never let a developer's environment point tests at a real cluster.
for _name in list(os.environ):
    if _name.startswith("AIP_") and not _name.startswith("AIP_TEST_"):  # AIP_TEST_*: knobs of the tests themselves
        del os.environ[_name]
# grpcio's fork support restarts its poller thread in a forked child, where subprocess then closes the poller's epoll
# descriptor: in a test process that had run a fake kubelet (gRPC), a broker started next aborted before its exec
# ("exited at start (code -6)", "epoll_wait error: Bad file descriptor").  Nothing here forks to use gRPC.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"


@pytest.fixture
def few_identity_trees(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """``aip evaluate``'s job-identity baseline forest with 20 trees (100 in the product; on the unit tests' datasets of
    a few dozen rows its per-tree set-up was half of every evaluation's CPU), except where a test measures against it."""
    if "one_hot_baseline" not in request.node.name:
        monkeypatch.setattr("models.evaluate.IDENTITY_TREES", 20)


@pytest.fixture(scope="session")
def broker() -> Iterator[Any]:
    from aip.broker import EmbeddedBroker, free_port

    b = EmbeddedBroker(port=free_port()).start()
    yield b
    b.stop()


@pytest.fixture
def settings(broker: Any, tmp_path: Path) -> Any:
    from config import Settings

    return Settings(
        broker=broker.address,
        topic_prefix=f"t{uuid.uuid4().hex[:12]}.",
        partitions=4,
        connect_timeout_s=5.0,
        spool_dir=str(tmp_path / "spool"),
        state_dir=str(tmp_path / "state"),
    )


def worker_settings(broker: Any, tmp: Path, prefix: str, partitions: int = 4) -> Any:
    """Settings for a module's own worker: a fresh uuid topic prefix starting with ``prefix``, its state in
    ``tmp``/state, and the project's topics created."""
    from config import Settings
    from transport import ensure_project_topics

    settings = Settings(
        broker=broker.address,
        topic_prefix=f"{prefix}{uuid.uuid4().hex[:10]}.",
        partitions=partitions,
        state_dir=str(tmp / "state"),
    )
    ensure_project_topics(settings)
    return settings


@pytest.fixture
def topics(settings: Any) -> Any:
    from events import Topics

    return Topics(settings.topic_prefix)


@pytest.fixture
def group_id() -> str:
    return f"g{uuid.uuid4().hex[:12]}"


def wait_for(condition: Callable[[], Any], timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy; fail the test after ``timeout_s``."""
    from aip.faults.worker import wait_until

    try:
        return wait_until(condition, timeout_s, what, interval_s=interval_s)
    except TimeoutError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def data_dir() -> Path:
    """The datasets the project ships (licences beside them): gavel/, aip_paper/, miso_a100_solo/."""
    return DATA


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s direct children (none when it is gone)."""
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def exited(pid: int) -> bool:
    """True once ``pid`` is gone or a zombie (dead, not yet reaped)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True

"""Real ``aip worker`` processes for fault tests: start, wait until ready, SIGKILL, restart, read metrics and RSS."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

from config import Settings


def settings_env(settings: Settings) -> dict[str, str]:
    """The ``AIP_*`` variables that give a child process these settings (secrets included: environment only)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIP_")}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if value != f.default:
            env[f"AIP_{f.name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def metric_values(text: str, name: str, **labels: str) -> list[float]:
    """The values of the samples named ``name`` whose labels include ``labels``, in a Prometheus text page.

    >>> page = 'x_total{topic="a",p="0"} 2\\nx_total{topic="a",p="1"} 3\\nx_total{topic="b",p="0"} 5\\n'
    >>> metric_values(page, "x_total", topic="a")
    [2.0, 3.0]
    """
    return [
        float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    """Poll ``condition`` until truthy; raise TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


class WorkerProcess:
    """One ``aip worker`` subprocess with its own web port and log file."""

    def __init__(self, settings: Settings, web_port: int, log_path: str | Path, extra_env: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.web_port = web_port
        self.log_path = Path(log_path)
        self.extra_env = extra_env or {}
        # AIP_TEST_WORKER_LOGLEVEL=info puts faust's group and recovery steps into the log file
        self.loglevel = os.environ.get("AIP_TEST_WORKER_LOGLEVEL", "warn")
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> WorkerProcess:
        env = settings_env(self.settings) | self.extra_env
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "aip.cli",
                    "worker",
                    "--loglevel",
                    self.loglevel,
                    "--no-create-topics",
                    "--web-port",
                    str(self.web_port),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def get(self, path: str, timeout_s: float = 5.0) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}{path}", timeout=timeout_s) as r:
            body = r.read()
        return body.decode() if path.split("?")[0] == "/metrics" else json.loads(body)

    def ready(self) -> bool:
        if not self.alive():
            raise RuntimeError(f"the worker exited (code {self.proc.returncode if self.proc else None}): {self.log_tail()}")
        try:
            self.get("/leaderboard", timeout_s=1.0)
            return True
        except OSError:
            return False

    def wait_ready(self, timeout_s: float = 90.0) -> float:
        """Wait until the web server answers; return the seconds it took."""
        t0 = time.monotonic()
        wait_until(self.ready, timeout_s, "the worker's web server")
        return time.monotonic() - t0

    def counter(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 when none or the worker does not answer)."""
        try:
            text = self.get("/metrics", timeout_s=10.0)  # a loaded worker can take seconds; 0 is for "not answering"
        except OSError:
            return 0.0
        return sum(metric_values(text, name, **labels))

    def samples(self, *names: str) -> dict[str, float]:
        """The non-zero samples of the series ``names``, keyed ``name{labels}`` ({} when the worker does not answer)."""
        try:
            text = self.get("/metrics", timeout_s=10.0)
        except OSError:
            return {}
        return {
            f"{s.name}{{{','.join(f'{k}={v}' for k, v in sorted(s.labels.items()))}}}": s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name in names and s.value
        }

    def handover_lines(self) -> list[str]:
        """The lines of its log that tell where stage 1's partitions went (the worker logs them as warnings)."""
        told = ("stage 1 continues", "stage 1 keeps", "stage 1 skipped", "forgetting", "stops short", "could not read the stage-1")
        return [line.split("] ", 3)[-1] for line in self.log_tail(10**7).splitlines() if any(t in line for t in told)]

    def rss_mb(self) -> float:
        return float(psutil.Process(self.pid).memory_info().rss / 2**20)

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, no final commit, no model save."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> None:
        """SIGTERM without waiting: the worker leaves its group cleanly while the caller goes on."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def stop_all(workers: Iterable[WorkerProcess], timeout_s: float = 30.0) -> None:
    """Stop workers together: SIGTERM to each, then wait for each (a clean stop takes seconds)."""
    workers = list(workers)
    for w in workers:
        w.terminate()
    for w in workers:
        w.stop(timeout_s)


@contextlib.contextmanager
def worker_on_embedded_broker(prefix: str, ready_timeout_s: float = 90.0, **overrides: Any) -> Iterator[WorkerProcess]:
    """A fresh embedded broker with the project's topics (4 partitions, prefix ``<prefix><random>.``) and one
    ready ``aip worker`` with its own state directory (``overrides``: other settings); both stopped on exit.
    ``worker.settings`` reach them."""
    from aip.broker import EmbeddedBroker, free_port
    from transport import ensure_project_topics

    with EmbeddedBroker(port=free_port()) as broker, tempfile.TemporaryDirectory() as tmp:
        settings = Settings.from_env(
            broker=broker.address,
            topic_prefix=f"{prefix}{uuid.uuid4().hex[:8]}.",
            partitions=4,
            state_dir=f"{tmp}/state",
            **overrides,
        )
        ensure_project_topics(settings)
        worker = WorkerProcess(settings, free_port(), f"{tmp}/worker.log").start()
        try:
            worker.wait_ready(ready_timeout_s)
            yield worker
        finally:
            worker.stop(30)

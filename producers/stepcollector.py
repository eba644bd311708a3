"""The local collector of the step hook's datagrams: they become ``JobEvent`` progress records.

Training processes running the hook of ``producers/stephook`` (``aip run-job`` injects it; on Kubernetes a
pod adds ``PYTHONPATH=/var/run/aip/hook`` and mounts ``/var/run/aip``) send their step counts, without
Kafka or credentials, to a unix datagram socket; this class owns the socket.  ``aip run-job`` runs one
in-process on a temporary socket; a node's producer runs one on the ``step_socket`` setting
(``/var/run/aip/steps.sock``) and maps each message to its pod's job.

Datagram: one UTF-8 JSON object per report (at most 1 KiB)::

    {"v": 1, "pid": 4242, "steps": 120, "step_time_s": 0.0503, "ts": 1700000000.25,
     "pod_uid": "0f8c...", "job_id": "j1", "job_type": "ResNet-50"}

``v`` format version (1); ``pid`` the sender's pid in its own PID namespace; ``steps`` its optimizer steps
so far (cumulative); ``step_time_s`` the mean step time since its previous report; ``ts`` the wall-clock time
(Unix s) of the last step counted; optional: ``pod_uid`` (from the sender's ``/proc/self/cgroup``),
``job_id`` and ``job_type`` (its env ``AIP_JOB_ID``, ``AIP_JOB_TYPE``).  The collector adds
``sender_pid``: the pid the kernel vouches for (``SO_PASSCRED``), in the collector's PID namespace (the host's
for a DaemonSet with ``hostPID``), or None where the platform gives none.

``resolve(message) -> (job_id, job_type, gpu_uuid) | None`` names the job of a message (a 4th element,
the batch size, is optional); None drops it (counted ``unresolved``).  A job follows one process: another
pid's reports are ignored (``other_pid``) until the followed one has been silent ``handover_s``, then its
steps continue the job's count.  Progress goes out through a :class:`producers.lifecycle.JobReporter` per job
(``wrapped``: progress only; started and finished are the wrapper's or the node producer's).

>>> import tempfile, os, socket, json
>>> events = []
>>> path = os.path.join(tempfile.mkdtemp(), "steps.sock")
>>> c = StepCollector(path, lambda m: ("j1", "A3C", "GPU-1"), publish=lambda t, r: events.append(r), host="h").open()
>>> s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
>>> _ = s.sendto(json.dumps({"v": 1, "pid": 7, "steps": 40, "step_time_s": 0.05, "ts": 1.7e9}).encode(), path)
>>> c.poll(timeout_s=1.0)
1
>>> [(e.kind, e.job_id, e.steps, e.step_time_s, e.gpu_uuid) for e in events]
[('progress', 'j1', 40, 0.05, 'GPU-1')]
>>> c.close()
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import socket
import stat
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from events.records import TS_MAX_S, TS_MIN_S
from producers.lifecycle import JobReporter
from producers.stephook.aip_stephook import MAX_DATAGRAM_BYTES, MIN_INTERVAL_S, VERSION

log = logging.getLogger(__name__)

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_PASSCRED = getattr(socket, "SO_PASSCRED", None)
_CREDENTIALS = getattr(socket, "SCM_CREDENTIALS", None)


class StepTarget(NamedTuple):
    """The job a step message belongs to (what ``resolve`` returns)."""

    job_id: str
    job_type: str
    gpu_uuid: str
    batch_size: int | None = None


Resolve = Callable[[dict[str, Any]], "tuple[str, str, str] | StepTarget | None"]


def parse(payload: bytes) -> dict[str, Any]:
    """One datagram as a message dict; ValueError saying what is wrong.

    >>> parse(b'{"v": 1, "pid": 3, "steps": 5, "step_time_s": 0.1, "ts": 1700000000.0, "job_id": "j"}')["steps"]
    5
    >>> parse(b'{"v": 1, "pid": 3, "steps": -1, "step_time_s": 0.1, "ts": 1700000000.0}')
    Traceback (most recent call last):
    ...
    ValueError: steps: not a count: -1
    """
    try:
        m = json.loads(payload)
    except ValueError:
        raise ValueError("not a JSON object") from None
    if not isinstance(m, dict):
        raise ValueError("not a JSON object")
    if m.get("v") != VERSION:
        raise ValueError(f"v: version {m.get('v')!r}, this collector reads {VERSION}")
    for key in ("pid", "steps"):
        value = m.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{key}: not a count: {value!r}")
    for key in ("step_time_s", "ts"):
        value = m.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{key}: not a non-negative number: {value!r}")
    if not TS_MIN_S <= m["ts"] <= TS_MAX_S:
        raise ValueError(f"ts: {m['ts']!r} is not a time in Unix seconds")
    for key in ("pod_uid", "job_id", "job_type"):
        if key in m and not isinstance(m[key], str):
            raise ValueError(f"{key}: not a string")
    return m


@dataclass
class _Job:
    """A job's progress as the collector follows it: one process at a time."""

    reporter: JobReporter
    pid: int
    seen_s: float
    base_steps: int = 0
    pid_steps: int = 0


class StepCollector:
    """Receives step datagrams on a unix socket and publishes them as progress ``JobEvent``s.

    ``publish(topic, record)`` is the JobReporter publisher path (``Publisher.publish``); ``host`` names the
    events' host (the GPU samples' key).  :meth:`poll` handles what has arrived; :meth:`start` runs it on a
    thread until :meth:`close`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        resolve: Resolve,
        publish: Callable[[str, Any], None],
        *,
        host: str | None = None,
        handover_s: float = 3 * MIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        socket_mode: int = 0o666,
    ) -> None:
        self.path = Path(path)
        self.resolve = resolve
        self.publish = publish
        self.host = host or socket.gethostname()
        self.handover_s = handover_s
        self.clock = clock
        self.socket_mode = socket_mode
        self.jobs: dict[str, _Job] = {}
        self.counters: Counter[str] = Counter()
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()

    def open(self) -> StepCollector:
        """Bind the socket (a stale socket file left by a collector that died is replaced)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if stat.S_ISSOCK(self.path.lstat().st_mode):
                self.path.unlink()
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(str(self.path))
            os.chmod(self.path, self.socket_mode)  # training processes may run as any user
            if _PASSCRED is not None:
                sock.setsockopt(socket.SOL_SOCKET, _PASSCRED, 1)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        return self

    def __enter__(self) -> StepCollector:
        return self.open() if self._sock is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fileno(self) -> int:
        assert self._sock is not None, "open() first"
        return self._sock.fileno()

    def poll(self, timeout_s: float = 0.0) -> int:
        """Wait up to ``timeout_s`` for datagrams, handle every one that has arrived; return the events published."""
        sock = self._sock
        assert sock is not None, "open() first"
        if timeout_s > 0:
            try:
                ready, _, _ = select.select([sock], [], [], timeout_s)
            except InterruptedError:
                return 0
            if not ready:
                return 0
        published = 0
        while True:
            try:
                payload, ancillary, _, _ = sock.recvmsg(MAX_DATAGRAM_BYTES + 1, socket.CMSG_SPACE(_CREDS.size))
            except (BlockingIOError, InterruptedError):
                return published
            published += self.handle(payload, _sender_pid(ancillary))

    def handle(self, payload: bytes, sender_pid: int | None = None) -> int:
        """One datagram; return 1 when it became a progress event, else 0 (counted by why)."""
        self.counters["datagrams"] += 1
        try:
            message = parse(payload)
        except ValueError as exc:
            self._drop("invalid", f"a step datagram was dropped: {exc}")
            return 0
        message["sender_pid"] = sender_pid
        try:
            found = self.resolve(message)
        except Exception as exc:  # a lookup that fails drops the message, never the collector
            self._drop("resolve_failed", f"resolving a step datagram failed: {type(exc).__name__}: {exc}")
            return 0
        if found is None:
            self.counters["unresolved"] += 1
            return 0
        target = StepTarget(*found)
        pid = sender_pid if sender_pid is not None else message["pid"]
        now = self.clock()
        job = self.jobs.get(target.job_id)
        if job is None:
            try:
                reporter = self._reporter(target, pid)
            except ValueError as exc:  # e.g. no GPU UUID for the job
                self._drop("rejected", f"a step datagram's job cannot be reported: {exc}")
                return 0
            job = self.jobs[target.job_id] = _Job(reporter, pid, now)
        elif job.pid != pid:
            if now - job.seen_s < self.handover_s:
                self.counters["other_pid"] += 1
                return 0
            job.base_steps += job.pid_steps
            job.pid, job.pid_steps = pid, 0
            job.reporter.pid = pid
        elif message["steps"] < job.pid_steps:
            self.counters["steps_backwards"] += 1
            return 0
        try:
            job.reporter.progress(job.base_steps + message["steps"], float(message["step_time_s"]), ts=float(message["ts"]))
        except (ValueError, OSError) as exc:  # a record that does not validate, a spool that cannot be written
            self._drop("rejected", f"a step report could not be published: {exc}")
            return 0
        job.seen_s = now
        job.pid_steps = message["steps"]
        self.counters["progress"] += 1
        return 1

    def steps(self, job_id: str) -> int | None:
        """The steps counted for a job so far (None when none reported)."""
        job = self.jobs.get(job_id)
        return None if job is None else job.reporter.steps

    def forget(self, job_id: str) -> None:
        """Drop a finished job's state."""
        self.jobs.pop(job_id, None)

    def start(self, interval_s: float = 0.2) -> StepCollector:
        """Poll on a daemon thread until :meth:`close` (``publish`` must then be thread-safe: a Publisher is)."""
        if self._sock is None:
            self.open()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), name="aip-step-collector", daemon=True)
        self._thread.start()
        return self

    def _loop(self, interval_s: float) -> None:
        while not self._stop.is_set():
            try:
                self.poll(interval_s)
            except Exception:  # keep collecting: a publish that failed once may work next time
                log.exception("step collector: handling datagrams failed")
                self._stop.wait(interval_s)

    def close(self) -> None:
        """Stop the thread (if any), close and remove the socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            try:
                self.path.unlink()
            except OSError:
                pass

    def _reporter(self, target: StepTarget, pid: int) -> JobReporter:
        return JobReporter(
            target.job_type,
            job_id=target.job_id,
            gpu_uuid=target.gpu_uuid,
            batch_size=target.batch_size,
            publish=self.publish,
            host=self.host,
            pid=pid,
            wrapped=True,
        )

    def _drop(self, why: str, line: str) -> None:
        self.counters[why] += 1
        if why not in self._warned:  # one line per kind of problem, the counters count the rest
            self._warned.add(why)
            log.warning("%s (further ones are only counted)", line)


def _sender_pid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == _CREDENTIALS and len(data) >= _CREDS.size:
            pid = _CREDS.unpack_from(data)[0]
            return int(pid) if pid > 0 else None
    return None


def one_job(job_id: str, job_type: str, gpu_uuid: str, batch_size: int | None = None) -> Resolve:
    """``resolve`` for one wrapped job (``aip run-job``): every message is this job's."""
    target = StepTarget(job_id, job_type, gpu_uuid, batch_size)
    return lambda message: target

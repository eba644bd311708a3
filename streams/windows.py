"""Event-time tumbling windows and the job timeline of one GPU.

Everything here is pure, and a GPU's state is msgspec Structs (:class:`GpuState`, :class:`Job`), encoded as they
are, so the same state can live in a checkpoint, a changelog record, a test, or a benchmark.  Windows close on
event time only: a window ``[start, end)`` closes once both input streams of the GPU have passed ``end + lateness``.
How far metrics alone may run ahead of the lifecycle stream depends on what that stream is known to carry
(:func:`lifecycle_wait_s`): while its partition has records not applied yet, up to ``backlog_hold_s``; while a running
job reports progress, the stream is live, up to ``progress_hold_s`` (bounded memory); otherwise (black-box jobs, an
idle GPU) ``hold_s``.  Replaying at any speed, with any interleaving of the two topics within those bounds, closes the
same windows with the same contents.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from streams.features import FIELDS, KEYS

NKEYS = len(KEYS)
ACC_LEN = 1 + 2 * NKEYS  # [n, sums..., counts...]
RETIRED_JOBS = 16  # finished jobs remembered per GPU after pruning, to recognise their resent events


def window_index(ts: float, window_s: float) -> int:
    """Index of the tumbling window holding ``ts``: windows are ``[k*w, (k+1)*w)``.

    >>> window_index(25.0, 10.0), window_index(30.0, 10.0)
    (2, 3)
    """
    return math.floor(ts / window_s)


def new_acc() -> list[float]:
    return [0.0] * ACC_LEN


_fields_of = operator.attrgetter(*FIELDS)


def add_sample(acc: list[float], sample: Any) -> None:
    """Add one MetricSample's fields to a window accumulator (null fields are skipped)."""
    acc[0] += 1
    i = 1
    for v in _fields_of(sample):
        if v is not None:
            acc[i] += v
            acc[i + NKEYS] += 1
        i += 1


def add_extras(extras: dict[int, dict[str, list[float]]], k: int, sample: Any) -> None:
    """Add a sample's GPM DRAM bandwidth and per-process utilisation to window ``k``'s extra sums.

    Keys: ``D`` DRAM bandwidth utilisation, ``s<pid>`` / ``m<pid>`` a process's SM / memory
    utilisation; each ``[sum, count]`` over the samples that had it (nulls skipped).

    >>> from events import GpuProcess, MetricSample
    >>> ext = {}
    >>> add_extras(ext, 3, MetricSample(ts=1e9, host="h", gpu_uuid="G", gpu_index=0, gpu_model="m", seq=0,
    ...            dram_bw_util_pct=40.0, processes=[GpuProcess(pid=7, sm_util_pct=30.0)]))
    >>> ext
    {3: {'D': [40.0, 1.0], 's7': [30.0, 1.0]}}
    """
    dram = sample.dram_bw_util_pct
    procs = sample.processes
    if dram is None and not procs:
        return
    w = extras.get(k)
    if w is None:
        w = extras[k] = {}
    if dram is not None:
        _sum(w, "D", dram)
    for p in procs or ():
        if p.sm_util_pct is not None:
            _sum(w, f"s{p.pid}", p.sm_util_pct)
        if p.mem_util_pct is not None:
            _sum(w, f"m{p.pid}", p.mem_util_pct)


def _sum(w: dict[str, list[float]], key: str, value: float) -> None:
    acc = w.get(key)
    if acc is None:
        w[key] = [float(value), 1.0]
    else:
        acc[0] += value
        acc[1] += 1


def extra_mean(w: Mapping[str, list[float]], key: str) -> float | None:
    """Mean of one extra sum (None when no sample had it)."""
    acc = w.get(key)
    return acc[0] / acc[1] if acc and acc[1] else None


def job_utilisation(
    job_ids: list[str], jobs: Mapping[str, Job], w: Mapping[str, list[float]]
) -> dict[str, tuple[float | None, float | None, float | None]]:
    """Each job's own (SM %, memory %, share of the jobs' summed SM %) in a window, from its pid.

    A job without a pid, or sharing its pid with another job of the window, has none; the share
    needs every job's SM utilisation and a non-zero sum.

    >>> jobs = {"a": Job("x", pid=7), "b": Job("y", pid=8)}
    >>> job_utilisation(["a", "b"], jobs, {"s7": [120.0, 2.0], "s8": [40.0, 2.0], "m7": [10.0, 2.0]})
    {'a': (60.0, 5.0, 75.0), 'b': (20.0, None, 25.0)}
    """
    pids = [jobs[j].pid for j in job_ids]
    own: dict[str, tuple[float | None, float | None]] = {}
    for j, pid in zip(job_ids, pids, strict=True):
        if pid is None or pids.count(pid) > 1:
            own[j] = (None, None)
        else:
            own[j] = (extra_mean(w, f"s{pid}"), extra_mean(w, f"m{pid}"))
    sms = [sm for sm, _ in own.values()]
    total = sum(v for v in sms if v is not None) if all(v is not None for v in sms) else 0.0
    return {j: (sm, mem, sm / total * 100.0 if total and sm is not None else None) for j, (sm, mem) in own.items()}


def watermark(metrics_wm: float, lifecycle_wm: float | None, hold_s: float) -> float:
    """Event time up to which both streams of a GPU are complete.

    The slower of the two streams, but metrics never wait more than ``hold_s``
    for a silent lifecycle stream (an idle GPU, a job that reports no progress).

    >>> watermark(100.0, 90.0, 60.0), watermark(100.0, None, 60.0), watermark(100.0, 10.0, 60.0)
    (90.0, 40.0, 40.0)
    """
    lw = -math.inf if lifecycle_wm is None else lifecycle_wm
    return max(min(metrics_wm, lw), metrics_wm - hold_s)


def lifecycle_wait_s(
    lifecycle_pending: bool, awaits_progress: bool, hold_s: float, progress_hold_s: float, backlog_hold_s: float
) -> float:
    """How far (event time) a GPU's metrics may run ahead of its lifecycle stream before its windows close without it.

    ``lifecycle_pending``: the GPU's lifecycle partition has records not applied yet (the worker reads a backlog):
    they are in the broker, so windows wait for them up to ``backlog_hold_s``, however the consumer interleaves the
    two topics (faust handed over all 1,800 s of a backlog's metrics with its lifecycle partition 57 % read).
    ``awaits_progress``: a job running on the GPU (started, not finished) has reported progress, so more lifecycle
    events are due: up to ``progress_hold_s`` (bounded memory when a reporter dies without ``finished``).
    Otherwise the lifecycle stream may be silent for good: ``hold_s``.

    >>> lifecycle_wait_s(True, False, 120.0, 600.0, 3600.0), lifecycle_wait_s(False, True, 120.0, 600.0, 3600.0)
    (3600.0, 600.0)
    >>> lifecycle_wait_s(False, False, 120.0, 600.0, 3600.0)  # black-box or idle: short hold
    120.0
    """
    if lifecycle_pending:
        return max(hold_s, progress_hold_s, backlog_hold_s)
    return max(hold_s, progress_hold_s) if awaits_progress else hold_s


def close_limit(metrics_wm: float, lifecycle_wm: float | None, wait_s: float, lateness_s: float) -> float:
    """Event time before which windows of a GPU may close: both streams passed it, or metrics passed it by ``wait_s``
    (:func:`lifecycle_wait_s`).  A pure function of the two watermarks and the wait: any interleaving of the topics
    within the wait closes the same windows.

    >>> close_limit(1000.0, 500.0, 600.0, 5.0)  # progress due: wait for lifecycle
    495.0
    >>> close_limit(1000.0, 500.0, 120.0, 5.0)  # black-box or idle: short hold
    875.0
    >>> close_limit(1000.0, 100.0, 600.0, 5.0)  # reporter silent beyond the cap
    395.0
    """
    return watermark(metrics_wm, lifecycle_wm, wait_s) - lateness_s


class Job(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """What the lifecycle stream told us about one job on one GPU."""

    job_type: str
    start: float | None = None
    end: float | None = None
    progress: list[list[float | None]] = msgspec.field(default_factory=list)  # [ts, steps, step_time_s], by ts
    pid: int | None = None  # from its lifecycle events: the process whose per-process utilisation is the job's

    def add_progress(self, ts: float, steps: int | None, step_time_s: float | None) -> None:
        entry: list[float | None] = [ts, None if steps is None else float(steps), step_time_s]
        if not self.progress or self.progress[-1][0] <= ts:  # type: ignore[operator]
            self.progress.append(entry)
        else:
            bisect.insort(self.progress, entry, key=lambda e: e[0])  # type: ignore[arg-type,return-value]

    def full(self, start: float, end: float) -> bool:
        """Ran for the whole window."""
        return self.start is not None and self.start <= start and (self.end is None or self.end >= end)

    def overlaps(self, start: float, end: float) -> bool:
        return self.start is not None and self.start < end and (self.end is None or self.end > start)

    def rate_reports(self, start: float, end: float, since: float) -> list[tuple[float | None, float | None]]:
        """Progress reports in ``(start, end]`` whose period began at or after ``since``.

        Each is ``(steps done since the previous report, step_time_s)``; reports whose
        previous report is unknown or predates ``since`` (the last change of the job
        set) are left out, so a window's rate never mixes solo and co-located time.
        """
        out: list[tuple[float | None, float | None]] = []
        p = self.progress
        lo = bisect.bisect_right(p, start, key=lambda e: e[0])  # type: ignore[arg-type,return-value]
        for i in range(max(lo, 1), len(p)):
            ts, steps, step_time = p[i]
            if ts > end:  # type: ignore[operator]
                break
            prev_ts, prev_steps, _ = p[i - 1]
            if prev_ts < since:  # type: ignore[operator]
                continue
            done = None if steps is None or prev_steps is None else steps - prev_steps
            out.append((done, step_time))
        return out

    def prune(self, before: float) -> None:
        """Drop progress reports older than ``before``, keeping the last one before it."""
        p = self.progress
        i = bisect.bisect_left(p, before, key=lambda e: e[0])  # type: ignore[arg-type,return-value]
        if i > 1:
            del p[: i - 1]


class GpuState(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """Open windows, stream watermarks and job timeline of one GPU: what the checkpoint and the changelog hold of it
    (``msgspec.json.encode`` / ``msgspec.json.decode(..., type=GpuState)``; fields at their defaults left out).

    >>> st = GpuState("v100", windows={3: [1.0, 2.0]}, jobs={"j": Job("resnet", start=5.0)})
    >>> msgspec.json.encode(st)
    b'{"environment":"v100","windows":{"3":[1.0,2.0]},"jobs":{"j":{"job_type":"resnet","start":5.0}}}'
    >>> msgspec.json.decode(msgspec.json.encode(st), type=GpuState) == st
    True
    """

    environment: str | None = None
    windows: dict[int, list[float]] = msgspec.field(default_factory=dict)
    closed: int | None = None  # windows with a smaller index are closed
    metrics_wm: float | None = None
    lifecycle_wm: float | None = None
    jobs: dict[str, Job] = msgspec.field(default_factory=dict)
    seqs: dict[str, list[float]] = msgspec.field(default_factory=dict)  # producer_id -> [last seq, latest ts]
    retired: dict[str, float] = msgspec.field(default_factory=dict)  # recently pruned job -> its end (resends are duplicates)
    progress_end: float | None = None  # when the last job that reported progress finished
    extras: dict[int, dict[str, list[float]]] = msgspec.field(default_factory=dict)  # window -> add_extras sums
    raised: list[str] = msgspec.field(default_factory=list)  # jobs with a raised alert (serving sharded: streams.serving)

    def duplicate_sample(self, producer_id: str | None, seq: int, ts: float) -> bool:
        """True for a sample already seen (a resend after a crash or reconnect); else remember it.

        A sample is a duplicate when both its ``seq`` and its ``ts`` are not beyond
        the last one of its producer; a restarted producer (seq from 0, later ts) is not.

        >>> st = GpuState()
        >>> st.duplicate_sample("p", 5, 10.0), st.duplicate_sample("p", 5, 10.0), st.duplicate_sample("p", 0, 11.0)
        (False, True, False)
        """
        last = self.seqs.get(producer_id or "")
        if last is None:
            self.seqs[producer_id or ""] = [float(seq), ts]
            return False
        if seq <= last[0] and ts <= last[1]:
            return True
        last[0] = float(seq)  # in place: one sample, no new list
        if ts > last[1]:
            last[1] = ts
        return False

    def awaits_progress(self, metrics_wm: float | None = None, progress_hold_s: float = 0.0) -> bool:
        """More lifecycle events are due: a running job (started, not finished) has reported progress,
        or one that did finished less than ``progress_hold_s`` before ``metrics_wm`` (its successor's
        ``started`` is likely on its way: reading a backlog, it must not come too late)."""
        if any(job.end is None and job.progress for job in self.jobs.values()):
            return True
        return self.progress_end is not None and metrics_wm is not None and metrics_wm - self.progress_end < progress_hold_s

    def finished(self, job: Job) -> None:
        """Note that ``job`` finished (call after setting ``job.end``)."""
        if job.progress and job.end is not None:
            self.progress_end = job.end if self.progress_end is None else max(self.progress_end, job.end)

    def closable(
        self,
        window_s: float,
        lateness_s: float,
        hold_s: float,
        progress_hold_s: float = 0.0,
        lifecycle_pending: bool = False,
        backlog_hold_s: float = 0.0,
    ) -> int | None:
        """Index of the first window that may not close yet (None: nothing known).

        ``lifecycle_pending``: the GPU's lifecycle input has records not yet applied (its
        partition is behind, or not read at all yet), so windows wait for them up to ``backlog_hold_s``
        (:func:`lifecycle_wait_s`)."""
        if self.metrics_wm is None:
            return None
        due = lifecycle_pending or self.awaits_progress(self.metrics_wm, progress_hold_s)
        wait_s = lifecycle_wait_s(lifecycle_pending, due, hold_s, progress_hold_s, backlog_hold_s)
        return math.floor(close_limit(self.metrics_wm, self.lifecycle_wm, wait_s, lateness_s) / window_s)

    def classify(self, start: float, end: float) -> tuple[list[str], bool]:
        """(ids of jobs that ran the whole window, whether the job set changed inside it)."""
        full = []
        changed = False
        for job_id, job in self.jobs.items():
            if job.full(start, end):
                full.append(job_id)
            elif job.overlaps(start, end):
                changed = True
        return sorted(full), changed

    def set_since(self, start: float) -> float:
        """Event time of the last change of the job set at or before ``start``."""
        since = -math.inf
        for job in self.jobs.values():
            if job.start is not None and job.start <= start:
                since = max(since, job.start)
            if job.end is not None and job.end <= start:
                since = max(since, job.end)
        return since

    def prune(self, before: float) -> None:
        """Forget jobs that finished before ``before`` and progress reports no open window needs."""
        for job_id in [j for j, job in self.jobs.items() if job.end is not None and job.end < before]:
            self.retired[job_id] = self.jobs.pop(job_id).end  # type: ignore[assignment]
        while len(self.retired) > RETIRED_JOBS:
            del self.retired[next(iter(self.retired))]
        for job in self.jobs.values():
            job.prune(before)


def sorted_indices(windows: Iterable[int], below: int) -> list[int]:
    return sorted(k for k in windows if k < below)

"""Stage 1, without Kafka: per-GPU windows and job sets in, observations out.

:class:`Stage1` is fed decoded records of ``gpu.metrics`` and ``jobs.lifecycle``
(in any interleaving of the two topics) and returns the observations of the
windows each record lets close.  The stage-1 loop of :mod:`streams.inputs` is a
thin loop around it.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from events import JobEvent, MetricSample, Observation, SoloProfile
from events.records import Occupancy, RwSource
from streams.features import KEYS, interference_rate, means, percent_change, throughput
from streams.profiles import LOCAL, SoloProfiles
from streams.windows import NKEYS, GpuState, Job, add_extras, add_sample, extra_mean, job_utilisation, new_acc

if TYPE_CHECKING:
    from config import Settings


class LateEvent(Exception):
    """An event arrived after its window closed (beyond the allowed lateness)."""


@dataclass(frozen=True)
class IdleWindow:
    """A window in which a GPU ran no job (it had metric samples)."""

    gpu_uuid: str
    environment: str
    window_start: float
    window_end: float


def _seen(job: Job, event: JobEvent) -> bool:
    """The event is a resend of one already applied (same kind at the same event time)."""
    if event.kind == "started":
        return job.start == event.ts
    if event.kind == "finished":
        return job.end == event.ts
    p = job.progress  # sorted by ts
    if not p or p[-1][0] < event.ts:  # type: ignore[operator]
        return False  # the usual case: later than every report
    i = bisect.bisect_left(p, event.ts, key=lambda e: e[0])  # type: ignore[arg-type,return-value]
    return i < len(p) and p[i][0] == event.ts


class HeldWindow(msgspec.Struct, frozen=True):
    """A co-located job-window waiting for its job type's first solo profile in its environment.

    It travels in the local checkpoint (:class:`SavedStage1`) and in the stage-1 changelog as it is.
    """

    window_start: float
    window_end: float
    gpu_uuid: str
    environment: str
    job_id: str
    job_type: str
    co_job_types: list[str]
    co_job_ids: list[str]
    window_means: dict[str, float | None]
    throughput_steps_per_s: float | None
    samples: int
    proc_sm_util_pct: float | None = None
    proc_mem_util_pct: float | None = None
    sm_share_pct: float | None = None
    rw_source: RwSource | None = None

    @property
    def key(self) -> tuple[str, str]:
        """(environment, job type): the solo profile it waits for."""
        return self.environment, self.job_type


WINDOW_FIELDS = tuple(f for f in HeldWindow.__struct_fields__ if f not in ("co_job_types", "co_job_ids", "window_means"))
"""The fields an observation takes from its job-window as they are."""


class SavedStage1(msgspec.Struct):
    """Everything :class:`Stage1` needs to continue after a restart (:meth:`Stage1.to_state`, :meth:`Stage1.restore`)."""

    window_s: float
    gpus: dict[str, GpuState]
    profiles: dict[str, dict[str, list[Any]]]
    """:meth:`streams.profiles.SoloProfiles.to_dict`."""
    held: list[HeldWindow]


class Stage1:
    """Per-GPU event-time windows, solo profiles and observations.

    ``loader(gpu_uuid)`` returns a saved :class:`streams.windows.GpuState` the first time a GPU is seen;
    :meth:`to_state` / :meth:`restore` save and restore everything (GPU states,
    solo profiles, held job-windows) for a local checkpoint; ``counters`` counts
    windows by kind, late events and observations.

    A co-located job-window whose job type has no solo profile yet in its
    environment is held (at most ``max_held`` per environment and job type, the
    oldest dropped and counted) and becomes an observation when the first solo
    window of that type closes.  Profiles are shared by the GPUs of an
    environment, so the profile can come from a GPU read later, from another
    partition: after a restart a worker reads its backlog with skew across partitions.

    ``every_window``: also tell stage 2 about windows that are not co-located, so that every GPU
    answers the scheduler's question: a solo window becomes an :class:`Observation` with ``occupancy``
    ``solo`` among the ones returned (no co-runners, no ``interference_pct``: never a training row), an
    idle window an :class:`IdleWindow` in ``idle`` (the caller takes them with :meth:`take_idle`).  Off
    by default: readers of the returned observations as training rows (datasets, benches) get only
    co-located ones.
    """

    def __init__(
        self,
        window_s: float = 10.0,
        lateness_s: float = 5.0,
        hold_s: float = 120.0,
        *,
        profiles: SoloProfiles | None = None,
        loader: Callable[[str], GpuState | None] | None = None,
        min_samples: int = 1,
        progress_hold_s: float = 600.0,
        backlog_hold_s: float = 3600.0,
        max_held: int = 1000,
        source_of: Callable[[str], str] | None = None,
        every_window: bool = False,
    ) -> None:
        self.window_s = window_s
        self.every_window = every_window
        self.idle: list[IdleWindow] = []
        self.lateness_s = lateness_s
        self.hold_s = max(hold_s, lateness_s)
        self.progress_hold_s = max(progress_hold_s, self.hold_s)
        self.backlog_hold_s = max(backlog_hold_s, self.progress_hold_s)
        self.profiles = profiles if profiles is not None else SoloProfiles()
        self.loader = loader
        self.min_samples = min_samples
        self.max_held = max_held
        self.source_of = source_of  # gpu_uuid -> the input partition it is read from (the share of solo profiles it feeds)
        # (environment, job type) -> job-windows waiting for that type's first solo profile
        self.held: dict[tuple[str, str], deque[HeldWindow]] = {}
        self.gpus: dict[str, GpuState] = {}
        self.counters: Counter[str] = Counter()
        self.dirty: set[str] = set()  # GPUs whose windows closed since the last checkpoint
        # environment -> where R/W come from (RW_SOURCES), set by its first window: a window from the
        # other source gets no R/W (counted), so one profile never mixes DRAM % with PCIe KB/s
        self.rw_sources: dict[str, str] = {}

    @classmethod
    def from_settings(cls, settings: Settings, **kw: Any) -> Stage1:
        """Stage 1 with the window and hold settings of ``settings`` (:class:`config.Settings`), as the worker runs it."""
        s = settings
        return cls(
            s.window_s, s.lateness_s, s.lifecycle_hold_s, progress_hold_s=s.progress_hold_s, backlog_hold_s=s.backlog_hold_s, **kw
        )

    # ------------------------------------------------------------------ state
    def to_state(self) -> SavedStage1:
        """Everything needed to continue after a restart: per-GPU states, solo profiles, held job-windows."""
        held = [w for windows in self.held.values() for w in windows]
        return SavedStage1(self.window_s, dict(self.gpus), self.profiles.to_dict(), held)

    def restore(self, state: SavedStage1) -> None:
        """Continue from :meth:`to_state` (GPU states only when the window length is unchanged)."""
        self.profiles = SoloProfiles.from_dict(state.profiles)
        self.held = {}
        if state.window_s == self.window_s:
            self.gpus = dict(state.gpus)
            for w in state.held:
                self._hold(w)
        self.dirty.clear()

    def forget(self, gpus: Iterable[str]) -> None:
        """Drop the state of GPUs this worker no longer owns (their windows start afresh elsewhere)."""
        for gpu in list(gpus):
            self.gpus.pop(gpu, None)
            self.dirty.discard(gpu)

    # ------------------------------------------------------------------ input
    def state(self, gpu_uuid: str) -> GpuState:
        st = self.gpus.get(gpu_uuid)
        if st is None:
            saved = self.loader(gpu_uuid) if self.loader is not None else None
            st = saved if saved is not None else GpuState()
            self.gpus[gpu_uuid] = st
        return st

    def on_metric(self, sample: MetricSample, lifecycle_pending: bool = False) -> list[Observation]:
        """Add a sample to its window; return the observations of windows that close.

        ``lifecycle_pending``: lifecycle records of this GPU are known to be unread (the
        caller knows its input positions): windows then wait for them up to ``backlog_hold_s``
        instead of ``hold_s``, so that reading a backlog with metrics far ahead does not close
        windows without their job set.

        The hot path (every GPU sample): each field and attribute is read once."""
        gpu = sample.gpu_uuid
        st = self.gpus.get(gpu) or self.state(gpu)
        ts = sample.ts
        if st.duplicate_sample(sample.producer_id, sample.seq, ts):
            self.counters["duplicate_metrics"] += 1
            return []
        window_s = self.window_s
        k = math.floor(ts / window_s)  # window_index
        closed = st.closed
        if closed is not None and k < closed:
            self.counters["late_metrics"] += 1
            raise LateEvent(self._late_reason(st, ts))
        st.environment = sample.gpu_model
        acc = st.windows.get(k)
        if acc is None:
            acc = st.windows[k] = new_acc()
        add_sample(acc, sample)
        if sample.dram_bw_util_pct is not None or sample.processes:
            add_extras(st.extras, k, sample)
        wm = st.metrics_wm
        if wm is not None and ts <= wm:
            return []
        st.metrics_wm = ts
        if closed is not None and math.floor((ts - self.lateness_s) / window_s) <= closed:
            return []  # no window can close (as in _advance)
        return self._advance(gpu, st, lifecycle_pending)

    def on_job(self, event: JobEvent, lifecycle_pending: bool = False) -> list[Observation]:
        """Apply a lifecycle event; return the observations of windows that close
        (``lifecycle_pending`` as for :meth:`on_metric`).

        A late ``started`` or ``finished`` still updates the job set of the
        windows to come before :class:`LateEvent` is raised; late progress is dropped.
        """
        gpu = event.gpu_uuid
        st = self.gpus.get(gpu) or self.state(gpu)
        ts = event.ts
        late = st.closed is not None and ts < st.closed * self.window_s
        job = st.jobs.get(event.job_id)
        if (job is not None and _seen(job, event)) or (
            job is None and event.job_id in st.retired and ts <= st.retired[event.job_id]
        ):
            self.counters["duplicate_lifecycle"] += 1
            return []
        if job is None:
            job = st.jobs[event.job_id] = Job(event.job_type)
        if event.pid is not None:
            job.pid = event.pid
        if event.kind == "started":
            job.start = ts if job.start is None else min(job.start, ts)
        elif event.kind == "finished":
            job.end = ts
            if job.start is None:
                job.start = ts
            st.finished(job)
        elif not late:
            if job.start is None:
                job.start = ts
            job.add_progress(ts, event.steps, event.step_time_s)
        if late:
            self.counters["late_lifecycle"] += 1
            raise LateEvent(self._late_reason(st, ts))
        if st.lifecycle_wm is None or ts > st.lifecycle_wm:
            st.lifecycle_wm = ts
            return self._advance(gpu, st, lifecycle_pending)
        return []

    def flush(self, gpus: Iterable[str] | None = None) -> list[Observation]:
        """Close every open window (end of a finite replay)."""
        out: list[Observation] = []
        for gpu in list(gpus if gpus is not None else self.gpus):
            st = self.gpus[gpu]
            for k in sorted(st.windows):
                out.extend(self._close(gpu, st, k))
            if st.windows or st.closed is not None:
                st.closed = max([st.closed or 0, *(k + 1 for k in st.windows)])
            st.windows.clear()
            st.extras.clear()
        return out

    def _late_reason(self, st: GpuState, ts: float) -> str:
        assert st.closed is not None
        behind = st.closed * self.window_s - ts
        return f"late: event time {ts:.3f} is {behind:.3f} s before the first open window (lateness {self.lateness_s:g} s)"

    # ---------------------------------------------------------------- windows
    def _advance(self, gpu: str, st: GpuState, lifecycle_pending: bool = False) -> list[Observation]:
        if (
            st.closed is not None
            and st.metrics_wm is not None
            and math.floor((st.metrics_wm - self.lateness_s) / self.window_s) <= st.closed  # window_index
        ):
            return []  # no window can close: the limit is never past the metrics watermark less the lateness
        limit = st.closable(
            self.window_s, self.lateness_s, self.hold_s, self.progress_hold_s, lifecycle_pending, self.backlog_hold_s
        )
        if limit is None or (st.closed is not None and limit <= st.closed):
            return []
        out: list[Observation] = []
        for k in sorted(k for k in st.windows if k < limit):
            out.extend(self._close(gpu, st, k))
        st.closed = limit
        st.prune(limit * self.window_s)
        self.dirty.add(gpu)
        return out

    def _close(self, gpu: str, st: GpuState, k: int) -> list[Observation]:
        acc = st.windows.pop(k)
        ext = st.extras.pop(k, None) or {}
        if acc[0] < self.min_samples or st.environment is None:
            self.counters["windows_empty"] += 1
            return []
        start = k * self.window_s
        end = start + self.window_s
        full, changed = st.classify(start, end)
        if changed:
            self.counters["windows_transition"] += 1
            return []
        if not full:
            self.counters["windows_idle"] += 1
            if self.every_window:
                self.idle.append(IdleWindow(gpu, st.environment, start, end))
            return []
        env = st.environment
        window_means = means(acc[1 : 1 + NKEYS], [int(c) for c in acc[1 + NKEYS :]])
        rw_source = self._rw(env, window_means, extra_mean(ext, "D"))
        since = st.set_since(start)
        rates = {j: throughput(st.jobs[j].rate_reports(start, end, since)) for j in full}
        if len(full) == 1:
            job_id = full[0]
            self.counters["windows_solo"] += 1
            job_type = st.jobs[job_id].job_type
            source = self.source_of(gpu) if self.source_of is not None else LOCAL
            self.profiles.add(env, job_type, {**window_means, "throughput": rates[job_id]}, source=source, ts=end)
            released = self._release(env, job_type)
            if self.every_window:
                solo = self._observation(
                    HeldWindow(start, end, gpu, env, job_id, job_type, [], [], window_means, rates[job_id], int(acc[0]),
                               rw_source=rw_source),
                    occupancy="solo",
                )  # fmt: skip
                if solo is not None:
                    released.append(solo)
                    self.counters["observations_solo"] += 1
                    self.counters["observations"] += 1
            return released
        self.counters["windows_colocated"] += 1
        util = job_utilisation(full, st.jobs, ext)
        out = []
        for job_id in full:
            others = [j for j in full if j != job_id]
            window = HeldWindow(
                window_start=start,
                window_end=end,
                gpu_uuid=gpu,
                environment=env,
                job_id=job_id,
                job_type=st.jobs[job_id].job_type,
                co_job_types=[st.jobs[j].job_type for j in others],
                co_job_ids=others,
                window_means=window_means,
                throughput_steps_per_s=rates[job_id],
                samples=int(acc[0]),
                proc_sm_util_pct=util[job_id][0],
                proc_mem_util_pct=util[job_id][1],
                sm_share_pct=util[job_id][2],
                rw_source=rw_source,
            )
            obs = self._observation(window)
            if obs is None:
                self.counters["no_solo_profile"] += 1
                self._hold(window)
            else:
                out.append(obs)
        self.counters["observations"] += len(out)
        return out

    def _rw(self, env: str, window_means: dict[str, float | None], dram: float | None) -> RwSource | None:
        """Set the window's R and W from GPM DRAM bandwidth where its samples had it (else the PCIe
        counters stay); return the source used, None when there is none or it is not the environment's."""
        if dram is not None:
            source: RwSource | None = "dram_bw_util_pct"
            window_means["R"] = window_means["W"] = dram
        else:
            source = "pcie_kbps" if window_means["R"] is not None or window_means["W"] is not None else None
        if source is None:
            return None
        if self.rw_sources.setdefault(env, source) != source:
            self.counters["rw_source_mismatch"] += 1
            window_means["R"] = window_means["W"] = None
            return None
        return source

    # ------------------------------------------------------- held job-windows
    def _observation(self, w: HeldWindow, occupancy: Occupancy | None = None) -> Observation | None:
        """The observation of a job-window (co-located, or ``occupancy`` solo: never labelled), or None while its
        job type has no solo profile."""
        solo = self.profiles.get(w.environment, w.job_type)
        if solo is None:
            return None
        wm = w.window_means
        pct = {p: percent_change(wm[p], solo[p]) for p in KEYS[:6]}
        return Observation(
            **{name: getattr(w, name) for name in WINDOW_FIELDS},
            **{f"{p}_pct": pct[p] for p in KEYS[:6]},
            co_job_types=list(w.co_job_types),
            co_job_ids=list(w.co_job_ids),
            window_means=dict(wm),
            solo=solo,
            co_solo=[self.profiles.get(w.environment, t) or {} for t in w.co_job_types],
            interference_pct=None if occupancy == "solo" else interference_rate(solo["throughput"], w.throughput_steps_per_s),
            occupancy=occupancy,
        )

    def _hold(self, window: HeldWindow) -> None:
        held = self.held.get(window.key)
        if held is None:
            held = self.held[window.key] = deque()
        if len(held) >= self.max_held:
            held.popleft()
            self.counters["held_dropped"] += 1
        held.append(window)

    def _release(self, environment: str, job_type: str) -> list[Observation]:
        """The held job-windows of a type that just got its solo profile, as observations."""
        held = self.held.pop((environment, job_type), None)
        if not held:
            return []
        out = [o for o in map(self._observation, held) if o is not None]
        self.counters["held_released"] += len(out)
        self.counters["observations"] += len(out)
        return out

    def merge_profile(self, record: SoloProfile) -> list[Observation]:
        """Merge a solo profile read from ``interference.profiles`` (another worker's shares);
        return the held job-windows of its type that it lets through."""
        if not self.profiles.merge(record):
            return []
        return self._release(record.environment, record.job_type)

    def held_by_gpu(self, gpus: Iterable[str]) -> dict[str, list[HeldWindow]]:
        """The held job-windows of these GPUs (they move with the GPU's partition)."""
        wanted = set(gpus)
        out: dict[str, list[HeldWindow]] = {}
        for windows in self.held.values():
            for w in windows:
                if w.gpu_uuid in wanted:
                    out.setdefault(w.gpu_uuid, []).append(w)
        return out

    def adopt_held(self, windows: Iterable[HeldWindow]) -> list[Observation]:
        """Hold job-windows another worker held for GPUs now read here; return those whose profile is already known."""
        keys = set()
        for w in windows:
            self._hold(w)
            keys.add(w.key)
        out: list[Observation] = []
        for env, jt in sorted(keys):
            if self.profiles.get(env, jt) is not None:
                out.extend(self._release(env, jt))
        return out

    def drop_held(self, gpus: Iterable[str]) -> None:
        """Drop the held job-windows of GPUs now read elsewhere (their new owner holds them)."""
        gone = set(gpus)
        for key in list(self.held):
            kept = deque(w for w in self.held[key] if w.gpu_uuid not in gone)
            if kept:
                self.held[key] = kept
            else:
                del self.held[key]

    def take_idle(self) -> list[IdleWindow]:
        """The idle windows closed since the last call (``every_window``)."""
        idle, self.idle = self.idle, []
        return idle

    def held_count(self) -> int:
        """Job-windows waiting for a solo profile."""
        return sum(len(h) for h in self.held.values())

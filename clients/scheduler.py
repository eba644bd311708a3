"""A light scheduler client: where should the next job go?

:class:`SchedulerClient` keeps, per GPU, the latest what-if entries published on
``interference.predictions`` (and, optionally, which jobs run where, from
``jobs.lifecycle``, and which host each GPU is on, from ``gpu.metrics``) and answers :meth:`SchedulerClient.best_gpu`: the candidate
GPU where the newcomer's predicted slowdown plus the slowdown it causes to the
jobs already there is smallest.  Every GPU that runs jobs answers every window
(a lone job's prediction has ``occupancy`` ``solo``); an idle GPU's prediction
(``occupancy`` ``idle``) makes it cost 0 until a job is seen starting there.

Feed it from Kafka (:meth:`start` runs a background thread, :meth:`poll_once`
polls in the caller's thread) or directly with :meth:`update` and
:meth:`on_job_event`.  Only ``events`` and kafka-python are needed: no faust,
no models.

>>> from events import Prediction, WhatIf
>>> client = SchedulerClient(clock=lambda: 1e9)
>>> client.update(Prediction(ts=1e9, gpu_uuid="GPU-a", environment="v100", job_id="j1", job_type="A3C",
...     job_set=["A3C", "LM"], mode="placement", interference_pct=30.0, model="knn", category="all",
...     what_if=[WhatIf(job_type="LM", newcomer_pct=40.0, existing_pct=25.0)]))
True
>>> client.cost_pct("GPU-a", "LM")
65.0
>>> client.best_gpu("LM", ["GPU-a", "GPU-b"])  # GPU-b is unknown: a known cost is preferred
'GPU-a'
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from events import JobEvent, MetricSample, Prediction, WhatIf

log = logging.getLogger(__name__)


@dataclass
class GpuView:
    """What the client knows about one GPU.

    The job set comes from ``jobs.lifecycle`` when the client has seen the GPU's whole
    history (``complete``), else from the predictions themselves: a client that joins
    mid-stream takes the latest prediction's ``job_set`` (as of its ``window_end``),
    applies the lifecycle events it saw after that, and from then on knows the set.
    """

    what_if: dict[str, tuple[float, float]] = field(default_factory=dict)
    """job type -> (newcomer_pct, existing_pct) from the latest prediction that carried what-if entries."""
    upper: dict[str, float] = field(default_factory=dict)
    """job type -> the upper end of the newcomer's 90 % interval, for the entries of that prediction that carry one."""
    meta: dict[str, EntryMeta] = field(default_factory=dict)
    """job type -> the entry's regime and interval width (:class:`EntryMeta`): what the ranking rules read."""
    job_set: tuple[str, ...] = ()
    """The (sorted) job types running when those entries were computed."""
    ts: float = 0.0
    """Timestamp of that prediction (epoch s)."""
    as_of: float = 0.0
    """Event time its job set describes: the prediction's ``window_end`` (else its ``ts``)."""
    running: dict[str, str] = field(default_factory=dict)
    """job_id -> job_type of jobs seen starting (or reporting progress) on ``jobs.lifecycle`` and not seen finishing."""
    unnamed: dict[str, int] = field(default_factory=dict)
    """job type -> count of jobs known to run from a prediction's job set, whose start the client never saw."""
    complete: bool = False
    """True when ``running`` plus ``unnamed`` is the GPU's whole job set (history seen, inferred, or :meth:`SchedulerClient.mark_idle`)."""
    changes: list[tuple[float, str, str, str]] = field(default_factory=list)
    """(ts, kind, job_id, job_type) of started/finished events after ``as_of`` (bounded)."""
    seen_since: float | None = None
    """Event time from which every lifecycle event of this GPU was seen (None: none seen yet)."""
    last_event_ts: float = float("-inf")
    """Event time of the newest lifecycle event seen (progress included)."""
    host: str | None = None
    """The node the GPU is on, from its lifecycle events (every kind carries ``host``)."""
    idle_reported: bool = False
    """The latest prediction with what-if entries said the GPU ran nothing (``occupancy`` ``idle``)."""
    full: bool = False
    """The latest placement prediction said the GPU takes no other job (``full``: no what-if entries)."""

    def job_types(self) -> Counter[str]:
        """The multiset of job types known to run (exact when ``complete``)."""
        return Counter(self.running.values()) + Counter(self.unnamed)

    @property
    def idle(self) -> bool:
        """Known to run nothing (and no newer prediction says otherwise), or said idle by its latest prediction
        with nothing seen starting since."""
        if not self.complete:
            return self.idle_reported and self.what_if_valid()
        if self.running or any(self.unnamed.values()):
            return False
        return not (self.job_set and self.as_of > self.last_event_ts)

    def what_if_valid(self) -> bool:
        """The what-if entries (or the word that the GPU is full) still describe the GPU's current job set."""
        if not self.what_if and not self.full:
            return False
        if self.complete:
            return tuple(sorted(self.job_types().elements())) == self.job_set
        # history incomplete: nothing changed since the prediction, and the jobs seen running are in its set
        return not self.changes and not (Counter(self.running.values()) - Counter(self.job_set))


@dataclass(frozen=True)
class EntryMeta:
    """What the ranking rules need of a what-if entry besides its costs."""

    regime: str | None = None
    """``seen``, ``new``, ``novel`` (a job type never measured here), or None (not said)."""
    width_pct: float | None = None
    """Width of the newcomer's 90 % interval (None: no interval)."""

    @property
    def unmeasured(self) -> bool:
        """Placing the job there would measure a job set never measured (regime ``new`` or ``novel``)."""
        return self.regime in ("new", "novel")


NOVEL_RISKS = ("upper", "expected", "withhold")
"""How a ``novel`` entry is costed (the ``novel_risk`` setting): its interval's upper end, as any other, or not at all
(``withhold``: the GPU's cost is unknown for that job type, ranked by load, as before novel types were predicted)."""


WORST_PCT = 1000.0
"""The worst known case of a slowdown: the bound of every published value (the ``prediction_max_pct`` setting's
default).  An unbounded upper end (a what-if interval ``[lo, null]``) is ranked that far above the expected
slowdown: every such entry at the same margin, so that among them the expected cost still orders the GPUs (an upper
end fixed at the bound would favour the GPU where the newcomer is predicted worst, its margin the smallest)."""


def finite_upper_pct(newcomer_pct: float, upper_pct: float | None, worst_pct: float) -> float | None:
    """An upper end a ranking can cost: an unbounded one (``math.inf``) as the worst known case, ``worst_pct`` above
    the expected slowdown (every unbounded entry at the same margin); others as they are."""
    return newcomer_pct + worst_pct if upper_pct is not None and math.isinf(upper_pct) else upper_pct


def ranking_newcomer_pct(
    newcomer_pct: float, upper_pct: float | None, regime: str | None, risk: str, novel_risk: str, worst_pct: float = WORST_PCT
) -> float:
    """The newcomer's slowdown a ranking uses: its upper end where ``risk`` is ``upper``, or where the entry is for
    a job type never measured here (``novel``) and ``novel_risk`` is ``upper``; else the expected slowdown.  An
    unbounded upper end (``math.inf``: the interval ``[lo, null]``) is the worst known case, ``worst_pct`` above the
    expected slowdown.

    >>> ranking_newcomer_pct(20.0, 80.0, "novel", "expected", "upper"), ranking_newcomer_pct(20.0, 80.0, "new", "expected", "upper")
    (80.0, 20.0)
    >>> ranking_newcomer_pct(20.0, 80.0, "novel", "expected", "expected"), ranking_newcomer_pct(20.0, None, "novel", "expected", "upper")
    (20.0, 20.0)
    >>> ranking_newcomer_pct(20.0, math.inf, "novel", "expected", "upper", worst_pct=1000.0)
    1020.0
    """
    upper_pct = finite_upper_pct(newcomer_pct, upper_pct, worst_pct)
    pessimistic = risk == "upper" or (regime == "novel" and novel_risk == "upper")
    return max(newcomer_pct, upper_pct) if pessimistic and upper_pct is not None else newcomer_pct


def ranking_entry_pct(
    newcomer_pct: float, existing_pct: float, upper_pct: float | None, regime: str | None, risk: str = "expected",
    novel_risk: str = "upper", running_jobs: int = 0, worst_pct: float = WORST_PCT,
) -> tuple[float, float] | None:  # fmt: skip
    """The (newcomer %, existing %) a ranking costs a what-if entry at; None where the entry is withheld (``novel``
    and ``novel_risk`` ``withhold``: the GPU is ranked by load).  The one rule of
    :meth:`SchedulerClient.ranking_entry`, the extender and ``aip bench accuracy``.

    The newcomer's slowdown is :func:`ranking_newcomer_pct`'s.  A ``novel`` entry ranked at its upper end
    (``novel_risk`` ``upper``) costs each of the ``running_jobs`` already there at the same margin above its expected
    slowdown too: a type never measured here says as little of what it does to them as of what they do to it, and
    the margin is counted once per job it would slow.  (Costing the newcomer alone at its upper end let the GPU
    running the most jobs win where a novel prediction fell to -100 %: its upper end was the lowest.)

    >>> ranking_entry_pct(20.0, 5.0, 80.0, "novel"), ranking_entry_pct(20.0, 5.0, 80.0, "novel", novel_risk="withhold")
    ((80.0, 5.0), None)
    >>> ranking_entry_pct(20.0, 5.0, 80.0, "novel", running_jobs=2), ranking_entry_pct(20.0, 5.0, 80.0, "new", running_jobs=2)
    ((80.0, 125.0), (20.0, 5.0))
    >>> ranking_entry_pct(20.0, 5.0, math.inf, "novel", running_jobs=1, worst_pct=1000.0)  # unbounded: the worst case
    (1020.0, 1005.0)
    """
    if regime == "novel" and novel_risk == "withhold":
        return None
    upper_pct = finite_upper_pct(newcomer_pct, upper_pct, worst_pct)
    newcomer = ranking_newcomer_pct(newcomer_pct, upper_pct, regime, risk, novel_risk, worst_pct)
    if regime == "novel" and novel_risk == "upper" and upper_pct is not None:
        existing_pct += running_jobs * max(0.0, upper_pct - newcomer_pct)
    return (newcomer, existing_pct)


def exploration_bonus_pct(cost_pct: float, best_pct: float, meta: EntryMeta, margin_pct: float, width_share: float) -> float:
    """Points taken off a GPU's cost to prefer measuring a job set never measured: ``width_share`` of its interval's
    width, at most ``margin_pct``, and only within ``margin_pct`` of the best cost; 0 when the margin is 0 (off).

    >>> m = EntryMeta("new", 60.0)
    >>> exploration_bonus_pct(52.0, 50.0, m, 5.0, 0.1), exploration_bonus_pct(56.0, 50.0, m, 5.0, 0.1)
    (5.0, 0.0)
    >>> exploration_bonus_pct(52.0, 50.0, EntryMeta("seen", 60.0), 5.0, 0.1), exploration_bonus_pct(52.0, 50.0, m, 0.0, 0.1)
    (0.0, 0.0)
    """
    if margin_pct <= 0 or not meta.unmeasured or meta.width_pct is None or cost_pct > best_pct + margin_pct:
        return 0.0
    return min(margin_pct, width_share * meta.width_pct)


MAX_CHANGES = 256
"""Lifecycle changes kept per GPU while waiting for a prediction newer than them."""


RISKS = ("expected", "upper")
"""How :meth:`SchedulerClient.best_gpu` costs a placement: the expected slowdown, or its 90 % upper bound."""


def _setting(value: Any, settings: Any, name: str, default: Any) -> Any:
    """An explicit argument, else the settings object's field, else the default."""
    if value is not None:
        return value
    return getattr(settings, name, default) if settings is not None else default


def placement_cost_pct(newcomer_pct: float, existing_pct: float) -> float:
    """The cost of a placement: the newcomer's slowdown plus the summed slowdown it causes.

    Negative predictions (speed-ups are noise here) count as 0.

    >>> placement_cost_pct(40.0, 25.0), placement_cost_pct(-3.0, 10.0)
    (65.0, 10.0)
    """
    return max(0.0, newcomer_pct) + max(0.0, existing_pct)


def rank_key(cost_pct: float | None, running_jobs: int | None) -> tuple[int, float]:
    """Sort key of a candidate: known costs first (smallest first), then unknown GPUs with the fewest known jobs.

    >>> sorted([(None, 1), (12.0, 2), (0.0, 0), (None, None)], key=lambda c: rank_key(*c))
    [(0.0, 0), (12.0, 2), (None, None), (None, 1)]
    """
    if cost_pct is not None:
        return (0, cost_pct)
    return (1, float(running_jobs or 0))


def upper_end(w: WhatIf) -> float | None:
    """The upper end of an entry's interval: None without one, ``math.inf`` where unbounded (``[lo, null]``)."""
    if w.interval_pct is None:
        return None
    hi = w.interval_pct[1]
    return math.inf if hi is None else float(hi)


def _meta(w: WhatIf) -> EntryMeta:
    hi = upper_end(w)
    width = None if hi is None or w.interval_pct is None or w.interval_pct[0] is None else float(hi - w.interval_pct[0])
    return EntryMeta(w.regime, width)


def _net_change(changes: list[tuple[float, str, str, str]]) -> int:
    return sum(1 if kind == "started" else -1 for _, kind, _, _ in changes)


def _infer(view: GpuView) -> None:
    """Without the whole history, learn the job set from the prediction once it can be trusted.

    It can when the client has seen every lifecycle event of the GPU after the
    prediction's ``as_of`` (it saw one at or before it: ``seen_since <= as_of``) and
    the lifecycle stream has reached ``as_of`` (``last_event_ts >= as_of``). Then the
    set is the prediction's job set plus the changes seen after it.
    """
    if view.complete or not (view.job_set or view.idle_reported) or view.seen_since is None:
        return
    if not view.seen_since <= view.as_of <= view.last_event_ts:
        return
    types = Counter(view.job_set)
    for _, kind, _, job_type in view.changes:
        if kind == "started":
            types[job_type] += 1
        elif types[job_type] > 0:
            types[job_type] -= 1
        else:
            return  # a job finished that the set did not hold: it cannot be trusted
    named = Counter(view.running.values())
    if named - types:
        return  # a job seen running that the set does not hold
    view.unnamed = dict(types - named)
    view.complete = True


class SchedulerClient:
    """The latest what-if predictions per GPU, and the best GPU for a newcomer.

    It reads ``interference.predictions`` and, with ``track_lifecycle`` (default), ``jobs.lifecycle`` (which jobs
    run where) and ``gpu.metrics`` (which host each GPU is on, idle ones included), in every record form the
    producers send: host batches (:class:`~events.HostJobEvents`, :class:`~events.HostMetrics`) and single records.

    ``max_age_s``: entries older than this (by the prediction's ``ts``) are
    ignored, since the job set may have changed without a new prediction.
    ``unknown_cost_pct``: the cost assumed for a busy GPU without usable entries;
    None (default) ranks such GPUs after every GPU whose cost is known.
    ``history_complete``: the lifecycle the client reads holds every job of every GPU
    (default: when it reads ``jobs.lifecycle`` from the beginning). Otherwise, as when
    it subscribes mid-stream, a GPU's job set comes from its predictions, and a GPU is
    reported idle only once that set is known to have emptied.
    ``novel_risk`` (default: the ``novel_risk`` setting, ``upper``): an entry for a job type never measured here
    (regime ``novel``) is costed at its interval's upper end, unless ``expected``.  ``explore_margin_pct`` and
    ``explore_width_share`` (settings of the same names; margin 0, off, by default): among GPUs within the margin of
    the best cost, one whose entry is a job set never measured gets :func:`exploration_bonus_pct` off its cost.
    ``max_jobs_per_gpu`` (default: the setting, 3; 0: no limit): a GPU whose latest prediction says it is ``full``
    (while its job set stands) or known to run that many jobs is never ranked, so never chosen.  ``worst_pct``
    (default: the ``prediction_max_pct`` setting): the cost of an unbounded upper end (:func:`ranking_entry_pct`).
    ``clock`` (epoch seconds) is injectable for tests.
    """

    def __init__(
        self,
        settings: Any = None,
        *,
        track_lifecycle: bool = True,
        from_beginning: bool = False,
        history_complete: bool | None = None,
        max_age_s: float = 300.0,
        unknown_cost_pct: float | None = None,
        novel_risk: str | None = None,
        explore_margin_pct: float | None = None,
        explore_width_share: float | None = None,
        max_jobs_per_gpu: int | None = None,
        worst_pct: float | None = None,
        clock: Callable[[], float] = time.time,
        consumer: Any = None,
    ) -> None:
        self.settings = settings
        self.track_lifecycle = track_lifecycle
        self.from_beginning = from_beginning
        self.history_complete = track_lifecycle and from_beginning if history_complete is None else history_complete
        self.max_age_s = max_age_s
        self.unknown_cost_pct = unknown_cost_pct
        self.novel_risk = _setting(novel_risk, settings, "novel_risk", "upper")
        if self.novel_risk not in NOVEL_RISKS:
            raise ValueError(f"novel_risk must be one of {', '.join(NOVEL_RISKS)}, not {self.novel_risk!r}")
        self.explore_margin_pct = float(_setting(explore_margin_pct, settings, "explore_margin_pct", 0.0))
        self.explore_width_share = float(_setting(explore_width_share, settings, "explore_width_share", 0.1))
        self.max_jobs_per_gpu = int(_setting(max_jobs_per_gpu, settings, "max_jobs_per_gpu", 3))
        self.worst_pct = float(_setting(worst_pct, settings, "prediction_max_pct", WORST_PCT))
        self.clock = clock
        self._consumer = consumer
        self._gpus: dict[str, GpuView] = {}
        self._version = 0
        """Bumped by every change of what the client knows (the key of :meth:`explored_entry`'s cache)."""
        self._best_cache: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.received = 0
        self.undecodable = 0

    # ------------------------------------------------------------------ feeding
    def _view(self, gpu_uuid: str) -> GpuView:
        view = self._gpus.get(gpu_uuid)
        if view is None:
            view = self._gpus[gpu_uuid] = GpuView()
            if self.history_complete:  # reading the lifecycle from its beginning: it holds every job
                view.complete, view.seen_since = True, float("-inf")
        return view

    def update(self, prediction: Prediction) -> bool:
        """Take one prediction; return True when it replaced the GPU's what-if entries.

        Predictions without what-if entries (observed mode) and predictions older
        than the GPU's current entries change nothing, except a placement prediction that says the GPU is ``full``:
        it replaces them with none.
        """
        full = bool(prediction.full) and prediction.mode == "placement"
        if not prediction.what_if and not full:
            return False
        as_of = prediction.window_end if prediction.window_end is not None else prediction.ts
        with self._lock:
            view = self._view(prediction.gpu_uuid)
            if prediction.ts < view.ts or (view.what_if and as_of < view.as_of):
                return False
            view.what_if = {w.job_type: (w.newcomer_pct, w.existing_pct) for w in prediction.what_if}
            view.full = full
            view.upper = {w.job_type: hi for w in prediction.what_if if (hi := upper_end(w)) is not None}
            view.meta = {w.job_type: _meta(w) for w in prediction.what_if}
            self._version += 1
            view.job_set = tuple(sorted(prediction.job_set))
            view.idle_reported = prediction.occupancy == "idle"
            view.ts = prediction.ts
            view.as_of = as_of
            view.changes = [c for c in view.changes if c[0] > as_of]
            _infer(view)
            return True

    def on_job_event(self, event: JobEvent) -> None:
        """Track which jobs run on each GPU (and on which host); a change of job set invalidates the GPU's what-if entries."""
        with self._lock:
            self._version += 1
            view = self._view(event.gpu_uuid)
            view.host = event.host
            if view.seen_since is None:
                view.seen_since = event.ts
            view.last_event_ts = max(view.last_event_ts, event.ts)
            if event.kind == "started":
                if event.ts <= view.as_of and view.unnamed.get(event.job_type):
                    view.unnamed[event.job_type] -= 1  # a job of the prediction's set, now with its id
                view.running[event.job_id] = event.job_type
            elif event.kind == "progress" and event.job_id not in view.running:  # a running job the client had not named
                if view.unnamed.get(event.job_type):
                    view.unnamed[event.job_type] -= 1
                elif view.complete:
                    view.complete = False  # a job the client never knew of: its history was not whole after all
                view.running[event.job_id] = event.job_type
            elif event.kind == "finished":
                if event.job_id in view.running:
                    del view.running[event.job_id]
                elif view.unnamed.get(event.job_type):
                    view.unnamed[event.job_type] -= 1
                elif view.complete:  # a job the client never knew of: its history was not whole after all
                    view.complete = False
            if event.kind != "progress" and event.ts > view.as_of:
                view.changes = [*view.changes, (event.ts, event.kind, event.job_id, event.job_type)][-MAX_CHANGES:]
            _infer(view)

    def on_sample(self, sample: MetricSample) -> None:
        """Learn a GPU's host from its metrics: a GPU that runs nothing has no job events to tell it."""
        view = self._gpus.get(sample.gpu_uuid)
        if view is not None and view.host == sample.host:
            return  # the common case, one dict look-up per sample
        with self._lock:
            self._version += 1
            self._view(sample.gpu_uuid).host = sample.host

    def mark_idle(self, *gpu_uuids: str) -> None:
        """Tell the client these GPUs run nothing (the scheduler knows): they cost 0 until a job starts."""
        with self._lock:
            self._version += 1
            for gpu in gpu_uuids:
                host = self._gpus[gpu].host if gpu in self._gpus else None
                self._gpus[gpu] = GpuView(complete=True, seen_since=float("-inf"), host=host)

    def forget(self, gpu_uuid: str) -> None:
        """Drop everything known about a GPU (for example when it leaves the fleet)."""
        with self._lock:
            self._version += 1
            self._gpus.pop(gpu_uuid, None)

    # ------------------------------------------------------------------ answers
    def what_if(self, gpu_uuid: str, job_type: str) -> tuple[float, float] | None:
        """(newcomer_pct, existing_pct) of putting ``job_type`` on the GPU: (0, 0) when it is known to be idle,
        None when unknown (no usable entry: none for this type, too old, or the job set changed since)."""
        with self._lock:
            view = self._gpus.get(gpu_uuid)
            if view is None:
                return None
            if view.idle:
                return (0.0, 0.0)
            entry = view.what_if.get(job_type)
            if entry is None or self.clock() - view.ts > self.max_age_s or not view.what_if_valid():
                return None
            return entry

    def cost_pct(self, gpu_uuid: str, job_type: str, risk: str = "expected") -> float | None:
        """Predicted cost of putting ``job_type`` on the GPU: 0 when it is known to be idle, None when unknown.

        ``risk="upper"`` costs the newcomer at the upper end of its 90 % interval (where the entry carries one;
        else at its expected slowdown), plus the expected slowdown it causes: a pessimistic scheduler's cost."""
        if risk not in RISKS:
            raise ValueError(f"risk must be one of {', '.join(RISKS)}, not {risk!r}")
        entry = self.ranking_entry(gpu_uuid, job_type, risk)
        return self.unknown_cost_pct if entry is None else placement_cost_pct(*entry)

    def ranking_entry(self, gpu_uuid: str, job_type: str, risk: str = "expected") -> tuple[float, float] | None:
        """:meth:`what_if` with the ranking rules applied (:func:`ranking_entry_pct`: ``risk`` and ``novel_risk``);
        None when unknown."""
        entry = self.what_if(gpu_uuid, job_type)
        if entry is None or entry == (0.0, 0.0):
            return entry
        with self._lock:
            view = self._gpus.get(gpu_uuid)
            hi = None if view is None else view.upper.get(job_type)
            meta = EntryMeta() if view is None else view.meta.get(job_type, EntryMeta())
            running = 0 if view is None else len(view.job_set)  # the entry's job set: what_if() checked it still runs
        return ranking_entry_pct(entry[0], entry[1], hi, meta.regime, risk, self.novel_risk, running, self.worst_pct)

    def entry_meta(self, gpu_uuid: str, job_type: str) -> EntryMeta:
        """The regime and interval width of the GPU's entry for ``job_type`` (empty when none)."""
        with self._lock:
            view = self._gpus.get(gpu_uuid)
            return EntryMeta() if view is None else view.meta.get(job_type, EntryMeta())

    def explored_entry(self, gpu_uuid: str, job_type: str) -> tuple[float, float] | None:
        """:meth:`ranking_entry` with the exploration bonus taken off the newcomer's slowdown, the best cost being
        the smallest over every GPU the client holds an entry of ``job_type`` for (the extender's rule: a node
        sees its own GPUs, the bonus needs the fleet's best)."""
        entry = self.ranking_entry(gpu_uuid, job_type)
        if entry is None or self.explore_margin_pct <= 0:
            return entry
        with self._lock:
            gpus = list(self._gpus)
            key = (job_type, self._version)
            best = self._best_cache.get(key)
        if best is None:
            known = [c for c in (self.cost_pct(g, job_type) for g in gpus) if c is not None]
            best = min(known) if known else math.inf
            with self._lock:
                self._best_cache = {key: best}
        bonus = exploration_bonus_pct(
            placement_cost_pct(*entry), best, self.entry_meta(gpu_uuid, job_type), self.explore_margin_pct, self.explore_width_share
        )  # fmt: skip
        return (entry[0] - bonus, entry[1])

    def explored(self, job_type: str, costs: Sequence[tuple[str, float | None]]) -> list[tuple[str, float | None]]:
        """``costs`` (GPU, cost) with :func:`exploration_bonus_pct` taken off the known costs near the best (off:
        unchanged)."""
        known = [c for _, c in costs if c is not None]
        if self.explore_margin_pct <= 0 or not known:
            return list(costs)
        best = min(known)
        return [
            (g, c if c is None else c - exploration_bonus_pct(c, best, self.entry_meta(g, job_type), self.explore_margin_pct, self.explore_width_share))
            for g, c in costs
        ]  # fmt: skip

    def running_jobs(self, gpu_uuid: str) -> int | None:
        """How many jobs run on the GPU: exact once its job set is known, else an estimate
        (the last prediction's set and the changes since, or the jobs seen); None when nothing is known."""
        with self._lock:
            view = self._gpus.get(gpu_uuid)
            if view is None:
                return None
            if view.complete:
                return sum(view.job_types().values())
            if view.what_if:
                return max(len(view.running), len(view.job_set) + _net_change(view.changes))
            return len(view.running) or None

    def is_full(self, gpu_uuid: str) -> bool:
        """Takes no other job: its latest prediction said so and its job set has not changed since, or it is known to
        run ``max_jobs_per_gpu`` jobs (0: no limit): its whole job set known, else the jobs seen running by id (never
        :meth:`running_jobs`' estimate, which may count a job twice)."""
        with self._lock:
            view = self._gpus.get(gpu_uuid)
            if view is None:
                return False
            if view.full and view.what_if_valid():
                return True
            known = sum(view.job_types().values()) if view.complete else len(view.running)
        return self.max_jobs_per_gpu > 0 and known >= self.max_jobs_per_gpu

    def is_idle(self, gpu_uuid: str) -> bool:
        """Known to run nothing."""
        with self._lock:
            view = self._gpus.get(gpu_uuid)
            return view is not None and view.idle

    def job_types(self) -> set[str]:
        """Every job type some GPU holds a fresh what-if entry for."""
        now = self.clock()
        with self._lock:
            return {t for v in self._gpus.values() if now - v.ts <= self.max_age_s for t in v.what_if}

    def gpus_by_host(self) -> dict[str, list[str]]:
        """host -> its GPUs (those seen on ``jobs.lifecycle`` or ``gpu.metrics``), in the order first seen."""
        with self._lock:
            out: dict[str, list[str]] = {}
            for gpu, view in self._gpus.items():
                if view.host is not None:
                    out.setdefault(view.host, []).append(gpu)
            return out

    def ranked(self, job_type: str, candidates: Iterable[str], risk: str = "expected") -> list[tuple[str, float | None]]:
        """Every candidate that is not full (:meth:`is_full`) with its cost (None: unknown; ``risk`` as in
        :meth:`cost_pct`), best first; ties keep the candidates' order."""
        gpus = [g for g in dict.fromkeys(candidates) if not self.is_full(g)]
        costs = [(gpu, self.cost_pct(gpu, job_type, risk)) for gpu in gpus]
        order = {g: c for g, c in self.explored(job_type, costs)}  # ranked with the exploration bonus, if on
        scored = [(gpu, cost, self.running_jobs(gpu)) for gpu, cost in costs]
        scored.sort(key=lambda c: rank_key(order[c[0]], c[2]))
        return [(gpu, cost) for gpu, cost, _ in scored]

    def best_gpu(
        self, job_type: str, candidates: Sequence[str], *, max_cost_pct: float | None = None, risk: str = "expected"
    ) -> str | None:
        """The candidate with the smallest predicted cost, never a full one; None when there is no candidate,
        or when ``max_cost_pct`` is given and every candidate's known cost exceeds it
        (unknown GPUs are never excluded by ``max_cost_pct``).  ``risk="upper"`` ranks by the upper end of the
        newcomer's 90 % interval (:meth:`cost_pct`): a GPU whose prediction is uncertain loses to a sure one."""
        for gpu, cost in self.ranked(job_type, candidates, risk):
            if max_cost_pct is None or cost is None or cost <= max_cost_pct:
                return gpu
        return None

    def snapshot(self) -> dict[str, GpuView]:
        with self._lock:
            return {
                g: dataclasses.replace(
                    v, what_if=dict(v.what_if), upper=dict(v.upper), meta=dict(v.meta), running=dict(v.running),
                    unnamed=dict(v.unnamed),
                )
                for g, v in self._gpus.items()
            }

    # ------------------------------------------------------------------ Kafka
    def _topics(self) -> list[str]:
        from events.topics import LIFECYCLE, METRICS, PREDICTIONS

        return [PREDICTIONS, LIFECYCLE, METRICS] if self.track_lifecycle else [PREDICTIONS]

    def connect(self) -> SchedulerClient:
        """Subscribe (direct assignment of every partition, nothing committed)."""
        if self._consumer is None:
            from events import Topics
            from transport import RecordConsumer, ensure_topics

            if self.settings is None:
                from config import Settings

                self.settings = Settings.from_env()
            names = Topics(self.settings.topic_prefix)
            ensure_topics(self.settings, [names.name(t) for t in self._topics()])
            self._consumer = RecordConsumer(self.settings, self._topics(), from_beginning=self.from_beginning)
        return self

    def poll_once(self, timeout_s: float = 0.5) -> int:
        """Poll the topics once and apply what arrived; return the number of records applied."""
        self.connect()
        applied = 0
        for item in self._consumer.poll(timeout_s=timeout_s):
            if item.error is not None:
                self.undecodable += 1
                continue
            self.received += 1
            record = item.record  # one record: the consumer reads a host's batch as its records
            if isinstance(record, Prediction):
                self.update(record)
            elif isinstance(record, JobEvent):
                self.on_job_event(record)
            elif isinstance(record, MetricSample):
                self.on_sample(record)
            applied += 1
        return applied

    def catch_up(self, timeout_s: float = 10.0, idle_s: float = 1.0) -> int:
        """Poll until nothing new arrives for ``idle_s`` (or ``timeout_s`` passes); return the records applied."""
        deadline = time.monotonic() + timeout_s
        applied = quiet = 0.0
        while time.monotonic() < deadline and quiet < idle_s:
            n = self.poll_once(timeout_s=0.25)
            applied += n
            quiet = 0.0 if n else quiet + 0.25
        return int(applied)

    def start(self) -> SchedulerClient:
        """Keep the state current from a daemon thread until :meth:`close`."""
        self.connect()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="aip-scheduler-client", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once(timeout_s=0.5)
            except Exception as exc:  # keep serving the last known state; log and retry
                log.warning("scheduler client: %s", exc)
                self._stop.wait(1.0)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __enter__(self) -> SchedulerClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

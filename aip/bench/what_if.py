"""The scheduler's question, scored: every published what-if entry against the truth of its hypothetical job set.

An entry of a GPU's prediction says what ``job_type`` would do there, joining the jobs of the prediction's
``job_set``: the newcomer's slowdown (``newcomer_pct``) and the summed slowdown of the jobs already there
(``existing_pct``).  The truth is the simulator's steady state for that job set (:func:`aip.bench.truth.what_if_truth`).
Everything here is arithmetic on records read back from the topics (never the models):

* :func:`entries_of`: one :class:`Entry` per (GPU, window, job type) of the second half, with its truth, its
  regime (the entry's own, else whether its job set was measured before) and how many job sets holding the
  newcomer's type had been measured before (:class:`MeasuredHistory`);
* :func:`errors`: MAE of both figures, the median newcomer error, the newcomer intervals' coverage;
* :func:`regret`: per (window, job type) question over the GPUs that answered it, the true cost of the GPU
  the scheduler client would choose (its ranking rule, :func:`clients.scheduler.ranking_entry_pct`, with a
  ``novel_risk``) minus the truly cheapest, against a uniformly random choice's expected regret;
* :func:`score`: all of it, by jobs already running (1, 2, 3) and regime, and by how often the type was measured.

An idle GPU's entries (its ``occupancy`` ``idle``: a newcomer runs alone there) take part in the regret only.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aip.bench.truth import what_if_truth
from clients.scheduler import NOVEL_RISKS, placement_cost_pct, rank_key, ranking_entry_pct

MEASURED_BINS = ((0, 0, "0"), (1, 2, "1-2"), (3, 5, "3-5"), (6, 10, "6-10"))
"""(lowest, highest, label) of the bins of :func:`measured_bin`; beyond the last: ``more``."""


def measured_bin(count: int) -> str:
    """The bin of a number of measured job sets.

    >>> [measured_bin(n) for n in (0, 1, 2, 3, 6, 10, 11)]
    ['0', '1-2', '1-2', '3-5', '6-10', '6-10', 'more']
    """
    for lo, hi, label in MEASURED_BINS:
        if lo <= count <= hi:
            return label
    return "more"


class MeasuredHistory:
    """When each job set was first measured (a labelled, co-located observation), from the observations topic."""

    def __init__(self, observations: Iterable[Any]) -> None:
        first: dict[tuple[str, ...], float] = {}
        for o in observations:
            if o.interference_pct is None or getattr(o, "occupancy", None) not in (None, "colocated"):
                continue
            key = tuple(sorted([o.job_type, *o.co_job_types]))
            first[key] = min(o.window_end, first.get(key, o.window_end))
        self.first = first
        by_type: dict[str, list[float]] = defaultdict(list)
        for job_set, ts in first.items():
            for t in set(job_set):
                by_type[t].append(ts)
        self.by_type = {t: sorted(v) for t, v in by_type.items()}

    def job_sets_with(self, job_type: str, before_ts: float) -> int:
        """How many distinct job sets holding ``job_type`` had been measured in windows ending before ``before_ts``."""
        return bisect.bisect_left(self.by_type.get(job_type, []), before_ts)

    def measured(self, job_set: Sequence[str], before_ts: float) -> bool:
        ts = self.first.get(tuple(sorted(job_set)))
        return ts is not None and ts < before_ts


@dataclass(frozen=True)
class Entry:
    """One published what-if entry with its truth."""

    gpu_uuid: str
    window_end: float
    job_type: str
    running: tuple[str, ...]
    newcomer_pct: float
    existing_pct: float
    interval_pct: tuple[float, float | None] | None
    """``hi`` None: unbounded (the published ``[lo, null]``)."""
    regime: str
    measured_job_sets: int
    true_newcomer_pct: float
    true_existing_pct: float
    idle: bool = False

    def ranking_cost_pct(self, novel_risk: str) -> float | None:
        """The cost the scheduler client ranks this entry by (:func:`clients.scheduler.ranking_entry_pct`, expected
        risk); None where it withholds it.  An idle GPU's entry as published (the client costs it 0)."""
        upper = None if self.interval_pct is None else self.interval_pct[1]
        if self.interval_pct is not None and upper is None:
            upper = math.inf  # unbounded: ranked at the worst known case
        regime = None if self.idle else self.regime
        entry = ranking_entry_pct(
            self.newcomer_pct, self.existing_pct, upper, regime, novel_risk=novel_risk, running_jobs=len(self.running)
        )
        return None if entry is None else placement_cost_pct(*entry)

    @property
    def true_cost_pct(self) -> float:
        return placement_cost_pct(self.true_newcomer_pct, self.true_existing_pct)


TruthOf = Callable[[Sequence[str], str], "tuple[float, float] | None"]


def entries_of(
    predictions: Iterable[Any], history: MeasuredHistory, truth_of: TruthOf, *, since_ts: float
) -> tuple[list[Entry], int]:
    """(the entries of predictions whose window ended at or after ``since_ts``, one per GPU, window and job type;
    how many were left out because the truth has no value for their job set).

    ``truth_of(running, newcomer)`` is the true (newcomer %, existing %), None where the simulator could not
    co-run that set (:func:`aip.bench.truth.what_if_truth` with the simulator's table)."""
    out: list[Entry] = []
    seen: set[tuple[str, float, str]] = set()
    no_truth = 0
    for p in predictions:
        if not p.what_if or p.window_end is None or p.window_end < since_ts:
            continue
        idle = getattr(p, "occupancy", None) == "idle"
        running = () if idle else tuple(sorted(p.job_set))
        for w in p.what_if:
            key = (p.gpu_uuid, p.window_end, w.job_type)
            if key in seen:  # every job of a co-located window carries the window's entries
                continue
            seen.add(key)
            truth = (0.0, 0.0) if idle else truth_of(running, w.job_type)
            if truth is None:
                no_truth += 1
                continue
            regime = getattr(w, "regime", None) or ("seen" if history.measured([*running, w.job_type], p.window_end) else "new")
            out.append(
                Entry(
                    p.gpu_uuid, p.window_end, w.job_type, running, w.newcomer_pct, w.existing_pct,
                    None if w.interval_pct is None else (w.interval_pct[0], w.interval_pct[1]),
                    "idle" if idle else regime, history.job_sets_with(w.job_type, p.window_end), truth[0], truth[1], idle,
                )
            )  # fmt: skip
    return out, no_truth


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.mean(values), 3) if values else None


def errors(entries: Sequence[Entry]) -> dict[str, Any]:
    """MAE of ``newcomer_pct`` and ``existing_pct``, the median newcomer error, and the share of bounded newcomer
    intervals holding the truth (entries without an interval, or with an unbounded one, left out; ``intervals``
    counts the others); ``unbounded``: how many intervals were ``[lo, null]``, ``unbounded_share`` of those with
    an interval, ``unbounded_coverage``: the share of them whose lower end is below the truth."""
    newcomer = [abs(e.newcomer_pct - e.true_newcomer_pct) for e in entries]
    bounded = [e for e in entries if e.interval_pct is not None and e.interval_pct[1] is not None]
    inside = [
        float(e.interval_pct[0] <= e.true_newcomer_pct <= e.interval_pct[1])
        for e in bounded
        if e.interval_pct and e.interval_pct[1] is not None
    ]
    unbounded = [e for e in entries if e.interval_pct is not None and e.interval_pct[1] is None]
    with_interval = len(bounded) + len(unbounded)
    return {
        "entries": len(entries),
        "newcomer_mae": _mean(newcomer),
        "newcomer_median_abs_error": round(statistics.median(newcomer), 3) if newcomer else None,
        "existing_mae": _mean([abs(e.existing_pct - e.true_existing_pct) for e in entries]),
        "interval_coverage": _mean(inside),
        "intervals": len(inside),
        "unbounded": len(unbounded),
        "unbounded_share": round(len(unbounded) / with_interval, 4) if with_interval else None,
        "unbounded_coverage": _mean([float(e.interval_pct[0] <= e.true_newcomer_pct) for e in unbounded if e.interval_pct]),
    }


def regret(entries: Iterable[Entry], novel_risk: str = "upper") -> dict[str, Any]:
    """Per (window, job type) question answered by two GPUs or more: the true cost of the GPU the scheduler client
    would choose minus the least true cost; and a random choice's expected regret (the mean true cost of the GPUs
    that answered, minus the least).  Means over the questions, in points of cost.

    The choice is the client's (:meth:`clients.scheduler.SchedulerClient.ranked`): least
    :meth:`Entry.ranking_cost_pct` under ``novel_risk`` (a novel entry at its interval's upper end by default), the
    withheld entries after the others by fewest jobs running (:func:`clients.scheduler.rank_key`); ties: the first
    GPU by uuid."""
    questions: dict[tuple[float, str], list[Entry]] = defaultdict(list)
    for e in entries:
        questions[(e.window_end, e.job_type)].append(e)
    chosen, random_ = [], []
    for answers in questions.values():
        if len(answers) < 2:
            continue
        best = min(e.true_cost_pct for e in answers)
        pick = min(answers, key=lambda e: (rank_key(e.ranking_cost_pct(novel_risk), len(e.running)), e.gpu_uuid))
        chosen.append(pick.true_cost_pct - best)
        random_.append(statistics.mean(e.true_cost_pct for e in answers) - best)
    ratio = statistics.mean(chosen) / statistics.mean(random_) if random_ and statistics.mean(random_) > 0 else None
    return {
        "questions": len(chosen),
        "regret_pts": _mean(chosen),
        "random_regret_pts": _mean(random_),
        "regret_ratio": None if ratio is None else round(ratio, 4),
    }


def out_of_bound(entries: Iterable[Entry], max_pct: float) -> int:
    """Entries with a published value (``newcomer_pct``, ``existing_pct``, an interval end) outside ``[-100, max_pct]``.

    >>> e = Entry("g", 0.0, "a", ("b",), 1200.0, 0.0, (0.0, None), "novel", 0, 0.0, 0.0)
    >>> out_of_bound([e], 1000.0), out_of_bound([e], 2000.0)
    (1, 0)
    """
    n = 0
    for e in entries:
        values = [e.newcomer_pct, e.existing_pct, *(v for v in (e.interval_pct or ()) if v is not None)]
        n += any(not -100.0 <= v <= max_pct for v in values)
    return n


def score(
    entries: Sequence[Entry],
    no_truth: int = 0,
    placeable: Callable[[Sequence[str]], bool] | None = None,
    novel_risk: str = "upper",
    max_jobs_per_gpu: int = 0,
    max_pct: float | None = None,
) -> dict[str, Any]:
    """``accuracy.what_if``: the errors overall, by jobs already running and regime, by regime, and by how often the
    newcomer's type had been measured (job sets holding it); the placement regret over every answer, idle GPUs' too,
    and over the answers of GPUs running two jobs or more (``regret_without_lone_gpus``: the stream before every GPU
    answered); the regret is the scheduler client's choice under ``novel_risk`` (its setting), and under each rule
    in ``regret_by_novel_risk`` (``upper``, ``expected``: every entry by its expected cost, ``withhold``).

    Reported besides, not part of any floor: ``known_types``, the errors of the entries whose every type was measured
    here (all but ``novel``); with ``placeable`` (whether a fleet would run a job set), ``new_by_placeable``: the
    ``new`` entries by jobs running, apart for job sets a fleet would place and those it never runs.

    ``max_jobs_per_gpu`` (0: no limit): the entries of a GPU already running that many jobs, where no job can go,
    are scored apart (``on_full_gpus``), in nothing else; ``max_pct``: ``out_of_bound`` counts the entries with a
    value outside ``[-100, max_pct]`` (:func:`out_of_bound`)."""
    full = [e for e in entries if max_jobs_per_gpu > 0 and len(e.running) >= max_jobs_per_gpu]
    entries = [e for e in entries if not (max_jobs_per_gpu > 0 and len(e.running) >= max_jobs_per_gpu)]
    scored = [e for e in entries if not e.idle]
    by_running: dict[str, dict[str, Any]] = {}
    for n in sorted({len(e.running) for e in scored}):
        cell = [e for e in scored if len(e.running) == n]
        by_running[str(n)] = {"all": errors(cell)} | {
            g: errors([e for e in cell if e.regime == g]) for g in sorted({e.regime for e in cell})
        }
    bins = [label for *_, label in MEASURED_BINS] + ["more"]
    by_measured = {b: errors([e for e in scored if measured_bin(e.measured_job_sets) == b]) for b in bins}
    return (
        {
            "mode": "placement",
            **errors(scored),
            "no_truth": no_truth,
            "idle_entries": len(entries) - len(scored),
            "novel_risk": novel_risk,
            **regret(entries, novel_risk),
            "regret_without_lone_gpus": regret((e for e in entries if len(e.running) >= 2), novel_risk),
            "regret_by_novel_risk": {rule: regret(entries, rule) for rule in NOVEL_RISKS},
            "by_regime": {g: errors([e for e in scored if e.regime == g]) for g in sorted({e.regime for e in scored})},
            "by_running": by_running,
            "by_measured_job_sets": by_measured,
            "known_types": errors([e for e in scored if e.regime != "novel"]),
            "max_jobs_per_gpu": max_jobs_per_gpu,
            "on_full_gpus": errors([e for e in full if not e.idle]),
        }
        | ({} if max_pct is None else {"out_of_bound": out_of_bound([*entries, *full], max_pct)})
        | ({} if placeable is None else {"new_by_placeable": _by_placeable([e for e in scored if e.regime == "new"], placeable)})
    )


def _by_placeable(entries: Sequence[Entry], placeable: Callable[[Sequence[str]], bool]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for n in sorted({len(e.running) for e in entries}):
        cell = [e for e in entries if len(e.running) == n]
        fits = [placeable([*e.running, e.job_type]) for e in cell]
        out[str(n)] = {
            "placeable": errors([e for e, f in zip(cell, fits, strict=True) if f]),
            "never_placed": errors([e for e, f in zip(cell, fits, strict=True) if not f]),
        }
    return out


def truth_from_table(table: dict[str, Any]) -> TruthOf:
    """``truth_of`` for :func:`entries_of` from a simulator's Gavel table (cached per question)."""
    cache: dict[tuple[tuple[str, ...], str], tuple[float, float] | None] = {}

    def truth_of(running: Sequence[str], newcomer: str) -> tuple[float, float] | None:
        key = (tuple(running), newcomer)
        if key not in cache:
            cache[key] = what_if_truth(table, running, newcomer)
        return cache[key]

    return truth_of

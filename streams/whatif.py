"""What-if entries: for each known job type as a newcomer to a GPU's running set, its predicted slowdown and the
summed slowdown of the jobs already there (:func:`what_if_entries`), served from a cache per state of the models
(:class:`WhatIfCache`).  The one computation of both serving settings (:class:`streams.serving.Serving`)."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from events import WhatIf
from models.compose import PairKey
from models.environment import EnvironmentModels, PlacementAsk
from models.prediction import PredictionResult

Profile = Mapping[str, float | None]


def bounded(value: float | None, max_pct: float) -> tuple[float | None, bool]:
    """``value`` within ``[-100, max_pct]`` (None stays None: an unbounded end), and whether it was outside.

    >>> bounded(1500.0, 1000.0), bounded(-120.0, 1000.0), bounded(None, 1000.0), bounded(20.0, 1000.0)
    ((1000.0, True), (-100.0, True), (None, False), (20.0, False))
    """
    if value is None:
        return None, False
    out = min(max(value, -100.0), max_pct)
    return out, out != value


def open_interval(interval: Sequence[float]) -> list[float | None]:
    """A model's interval as a what-if entry publishes it: an unbounded upper end (``math.inf``) as null.

    >>> open_interval((10.0, math.inf)), open_interval((10.0, 40.0))
    ([10.0, None], [10.0, 40.0])
    """
    lo, hi = interval
    return [float(lo), None if math.isinf(hi) else float(hi)]


def bounded_entry(entry: WhatIf, max_pct: float) -> tuple[WhatIf, bool]:
    """``entry`` with ``newcomer_pct``, ``existing_pct`` and its interval's ends within ``[-100, max_pct]`` (an
    unbounded upper end stays null), and whether anything was outside: what a composition of pairs says beyond the
    bound is counted, never published.

    >>> e, clipped = bounded_entry(WhatIf(job_type="a", newcomer_pct=1331.0, existing_pct=2400.0, interval_pct=[900.0, 2000.0]), 1000.0)
    >>> (e.newcomer_pct, e.existing_pct, e.interval_pct, clipped)
    (1000.0, 1000.0, [900.0, 1000.0], True)
    """
    newcomer, a = bounded(entry.newcomer_pct, max_pct)
    existing, b = bounded(entry.existing_pct, max_pct)
    interval, c = entry.interval_pct, False
    if interval is not None:
        (lo, c_lo), (hi, c_hi) = bounded(interval[0], max_pct), bounded(interval[1], max_pct)
        interval, c = [lo, hi], c_lo or c_hi
    if not (a or b or c):
        return entry, False
    return WhatIf(
        job_type=entry.job_type, newcomer_pct=float(newcomer or 0.0), existing_pct=float(existing or 0.0),
        interval_pct=interval, regime=entry.regime,
    ), True  # fmt: skip


def what_if_entries(
    models: EnvironmentModels,
    known: Mapping[str, Profile],
    running_types: Sequence[str],
    running_solos: Sequence[Profile],
    counters: Counter[str] | None = None,
    pairs: Mapping[PairKey, PredictionResult | None] | None = None,
    answers: dict[tuple[str, tuple[str, ...]], PredictionResult | None] | None = None,
) -> list[WhatIf]:
    """For each known job type (sorted) as a newcomer: its predicted slowdown and the summed slowdown of the jobs
    already there, every value within ``[-100, models.config.max_pct]`` (:func:`bounded_entry`; the entries bounded
    are counted in ``counters``, ``what_if_clipped``).  Every question of the window is asked in one
    :meth:`EnvironmentModels.predict_placements` (``pairs``: its pair table, see there), a job's co-runners in the
    order of their types.  ``answers``: the questions these models answered before, by (job type, co-runners'
    types), only for solo profiles that the types decide (a snapshot's known profiles); those not in it are asked,
    then added (a job set's question "b next to a and c" is also one of the sets a + b and b + c)."""
    asks: list[PlacementAsk] = []
    for jt in sorted(known):
        asks.append((jt, known[jt], list(running_types), list(running_solos)))
        for i, (rt, rs) in enumerate(zip(running_types, running_solos, strict=True)):
            co = sorted(
                [*(r for j, r in enumerate(zip(running_types, running_solos, strict=True)) if j != i), (jt, known[jt])],
                key=lambda r: r[0],
            )
            asks.append((rt, rs, [t for t, _ in co], [p for _, p in co]))
    results = iter(answer(models, asks, pairs, answers))
    entries = []
    for jt in sorted(known):
        newcomer = next(results)
        existing = sum(float(r.interference_pct) for r in itertools.islice(results, len(running_types)) if r is not None)
        if newcomer is not None:
            interval = None if newcomer.interval_pct is None else open_interval(newcomer.interval_pct)
            entry, clipped = bounded_entry(
                WhatIf(
                    job_type=jt, newcomer_pct=float(newcomer.interference_pct), existing_pct=existing,
                    interval_pct=interval, regime=newcomer.regime,
                ),
                models.config.max_pct,
            )  # fmt: skip
            if clipped and counters is not None:
                counters["what_if_clipped"] += 1
            entries.append(entry)
    return entries


def answer(
    models: EnvironmentModels,
    asks: Sequence[PlacementAsk],
    pairs: Mapping[PairKey, PredictionResult | None] | None,
    answers: dict[tuple[str, tuple[str, ...]], PredictionResult | None] | None,
) -> list[PredictionResult | None]:
    """:meth:`EnvironmentModels.predict_placements` of ``asks``, those in ``answers`` taken from there, the others
    asked once and added (see :func:`what_if_entries`)."""
    if answers is None:
        return models.predict_placements(asks, pairs=pairs)
    keys = [(jt, tuple(co)) for jt, _, co, _ in asks]
    new = {k: a for k, a in zip(keys, asks, strict=True) if k not in answers}
    if new:
        answers.update(zip(new, models.predict_placements(list(new.values()), pairs=pairs), strict=True))
    return [answers[k] for k in keys]


class Mark(NamedTuple):
    """Where the models were when the entries served now were first computed."""

    refits: int
    measured_types: int
    observations: int
    event_ts: float


def mark_of(models: EnvironmentModels, event_ts: float) -> Mark:
    return Mark(models.refits, len(models.measurements.types), models.observations, event_ts)


class WhatIfCache:
    """What-if entries by (environment, running job types, known job types), per state of the models.

    An entry of a set of running job types is computed once per state, and served to every window of that set (any
    GPU, any job of it) until the models move on (:meth:`stale`): at a refit, when a job type is measured for the
    first time, and once the models have learned ``every`` more observations (1, 2, 4, ... while they are younger
    than that) and, past that age, ``min_s`` more seconds of event time have gone by; or when they are replaced
    (:meth:`forget`: a new snapshot).  The models change a little with every observation; the entries served
    are at most that old.  The count bounds a small fleet's staleness, the time a large one's cost: 10,000 GPUs
    learn 256 observations in about a second, while every distinct job set of an environment asks its own
    entries.  Without the cache every window paid its own (docs/BENCHMARKS.md, "Stage 2 per observation")."""

    def __init__(
        self,
        every: int = 256,
        min_s: float = 60.0,
        capacity: int = 50_000,
        counters: Counter[str] | None = None,
        *,
        pair_tables: bool = False,
    ) -> None:
        self.counters = counters
        """Where :func:`what_if_entries` counts the entries it bounds (``what_if_clipped``, once per computation)."""
        self.pair_tables = pair_tables
        """Compose job sets of three from one :meth:`EnvironmentModels.pair_table` per state of the models (the
        known types' every pair, predicted once), not from the pairs each window's entries ask: for models that
        change only when replaced (a snapshot served), where each state serves many windows."""
        self.pairs: dict[str, dict[PairKey, PredictionResult | None]] = {}
        self.answers: dict[str, dict[tuple[str, tuple[str, ...]], PredictionResult | None]] = {}
        """With ``pair_tables``: per environment, every question the entries computed for this state of the models
        asked (:func:`answer`), so that job sets sharing a question ask it once."""
        self.every = max(1, every)
        self.min_s = min_s
        self.capacity = capacity
        self.entries_by_key: dict[tuple[Any, ...], list[WhatIf]] = {}
        self.marks: dict[str, Mark] = {}
        self.hits = 0
        self.misses = 0

    def stale(self, m: Mark, models: EnvironmentModels, event_ts: float) -> bool:
        """Whether entries computed at ``m`` are no longer served by ``models`` at ``event_ts``.

        >>> from models.environment import EnvironmentModels
        >>> em, c = EnvironmentModels("v100"), WhatIfCache(every=256, min_s=60.0)
        >>> em.observations = 300
        >>> c.stale(Mark(0, 0, 100, 0.0), em, 10.0), c.stale(Mark(0, 0, 256, 0.0), em, 10.0)
        (True, False)
        >>> em.observations = 600; c.stale(Mark(0, 0, 256, 0.0), em, 10.0), c.stale(Mark(0, 0, 256, 0.0), em, 70.0)
        (False, True)
        """
        if m.refits != models.refits or m.measured_types != len(models.measurements.types):
            return True
        learned = models.observations - m.observations
        if m.observations < self.every:  # young models: again after as many as they had
            return learned >= max(1, m.observations)
        return learned >= self.every and event_ts - m.event_ts >= self.min_s

    def entries(
        self,
        models: EnvironmentModels,
        known: Mapping[str, Profile],
        running_types: Sequence[str],
        running_solos: Sequence[Profile],
        event_ts: float = 0.0,
    ) -> list[WhatIf]:
        """The entries of ``running_types`` (``event_ts``: the window's end, event time)."""
        env = models.environment
        m = self.marks.get(env)
        if m is None or self.stale(m, models, event_ts):  # entries of older models are never served again
            self.forget(env)
            self.marks[env] = mark_of(models, event_ts)
        key = (env, tuple(sorted(running_types)), tuple(sorted(known)))
        hit = self.entries_by_key.get(key)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        if len(self.entries_by_key) >= self.capacity:
            self.entries_by_key.clear()
            self.answers.clear()
        pairs = answers = None
        if self.pair_tables:
            pairs = self.pairs.get(env)
            if pairs is None:
                pairs = self.pairs[env] = models.pair_table(known)
            answers = self.answers.setdefault(env, {})
        entries = self.entries_by_key[key] = what_if_entries(
            models, known, running_types, running_solos, self.counters, pairs, answers
        )
        return entries

    def forget(self, environment: str) -> None:
        """Drop the entries of ``environment`` (its models were replaced: a new snapshot, see :mod:`streams.serving`)."""
        self.marks.pop(environment, None)
        self.pairs.pop(environment, None)
        self.answers.pop(environment, None)
        self.entries_by_key = {k: e for k, e in self.entries_by_key.items() if k[0] != environment}

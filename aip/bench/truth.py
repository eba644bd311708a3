"""What a prediction should have said: the simulator's true interference of one job in one window.

A window ``[start, end)`` of a job's life is scored against the slowdown the job really had in it: its
steps in the window at the true co-located speeds (``solo x fraction`` in each co-location of the ground
truth, ``solo`` elsewhere) against its solo speed, over the part of the window in which it ran.  That is
the quantity stage 1 measures from progress reports, so a perfect prediction and a perfect measurement
both score 0.

:func:`what_if_truth` is the truth of a scheduler's question instead: the steady-state slowdowns of a
hypothetical job set, from the same contention model as the simulator (:mod:`producers.calibration`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _Span:
    start: float
    end: float
    fraction: float  # co-located speed / solo speed


class Truth:
    """Index of a simulated fleet's ground truth by job: co-location spans and life span."""

    def __init__(self, rows: Iterable[Mapping[str, Any]], jobs: Iterable[Mapping[str, Any]]) -> None:
        self.spans: dict[str, list[_Span]] = {}
        self.slots: dict[str, list[tuple[float, float, str]]] = {}
        for r in rows:
            frac = 1.0 / (1.0 + float(r["interference_pct"]) / 100.0)
            self.spans.setdefault(r["job_id"], []).append(_Span(float(r["start_ts"]), float(r["end_ts"]), frac))
        for spans in self.spans.values():
            spans.sort(key=lambda s: s.start)
        self._starts = {job: [s.start for s in spans] for job, spans in self.spans.items()}
        self.life = {j["job_id"]: (float(j["start_ts"]), float(j["end_ts"])) for j in jobs}

    def interference_pct(self, job_id: str, start: float, end: float) -> float | None:
        """True slowdown (%) of ``job_id`` over ``[start, end)``; None when the job did not run in it."""
        life = self.life.get(job_id)
        lo, hi = (start, end) if life is None else (max(start, life[0]), min(end, life[1]))
        if hi <= lo:
            return None
        steps = hi - lo  # in units of solo steps: 1 per second while alone
        spans = self.spans.get(job_id, [])
        i = max(0, bisect.bisect_right(self._starts.get(job_id, []), lo) - 1)
        for s in spans[i:]:
            if s.start >= hi:
                break
            overlap = min(hi, s.end) - max(lo, s.start)
            if overlap > 0:
                steps -= overlap * (1.0 - s.fraction)
        if steps <= 0:
            return None
        return ((hi - lo) / steps - 1.0) * 100.0


def what_if_truth(table: dict[str, Any], running: Sequence[str], newcomer: str) -> tuple[float, float] | None:
    """(the newcomer's true slowdown %, the summed true slowdown % of the jobs already ``running``) once ``newcomer``
    joins them, in steady state; None when Gavel could not co-run some pair of the set (no truth).

    >>> t = {"a": {"solo": 10.0, "pairs": {"b": [5.0, 8.0]}}, "b": {"solo": 10.0, "pairs": {"a": [8.0, 5.0]}}}
    >>> what_if_truth(t, ["a"], "b")  # b keeps 8 of its 10 steps/s (25 %), a keeps 5 of 10 (100 %)
    (25.0, 100.0)
    >>> what_if_truth(t, [], "a"), what_if_truth(t, ["b", "b"], "c")
    ((0.0, 0.0), None)
    """
    from producers.calibration import interference_pct, speed_fraction

    if newcomer not in table or any(r not in table for r in running):
        return None
    frac = speed_fraction(table, newcomer, list(running))
    if frac is None or frac <= 0:
        return None
    existing = 0.0
    for i, job in enumerate(running):
        f = speed_fraction(table, job, [*running[:i], *running[i + 1 :], newcomer])
        if f is None or f <= 0:
            return None
        existing += interference_pct(1.0, f)
    return interference_pct(1.0, frac), existing


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 1]).

    >>> percentile([1.0, 2.0, 3.0, 4.0], 0.5)
    3.0
    """
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

"""Pieces of the live selection that are plain arithmetic: bounds, errors, and the two baselines.

* :func:`clip_pct`: a slowdown below -100 % cannot happen (it would mean a job ran faster than alone by more
  than its whole step time); above a configured maximum it is a model blowing up, not a measurement.
* :class:`Ewm`: an exponentially weighted mean absolute error with its count (per job set: one float and an
  int per candidate, where a rolling window would keep 50).
* :class:`Baselines`: what a scheduler would do without any model -- the last measured interference of this
  exact job set (an exponentially weighted mean of its measurements, per job and co-runners), and the
  median of recent measurements.  Both are candidates in the selection: a model that cannot beat them is
  not served.

No Kafka, no faust, no live state beyond what is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

LAST_MEASURED = "baseline.last_measured"
MEDIAN = "baseline.median"
BASELINES = (LAST_MEASURED, MEDIAN)

SLOWDOWN_MIN_PCT = -100.0
"""No job runs faster than alone by more than its whole step time."""


def clip_pct(value: float, max_pct: float) -> tuple[float, bool]:
    """``value`` bounded to ``[-100, max_pct]`` (NaN becomes 0), and whether it was changed.

    >>> clip_pct(-250.0, 1000.0), clip_pct(42.0, 1000.0), clip_pct(5e6, 1000.0)
    ((-100.0, True), (42.0, False), (1000.0, True))
    """
    if not math.isfinite(value):
        return (max_pct if value > 0 else (SLOWDOWN_MIN_PCT if value < 0 else 0.0)), True
    if value < SLOWDOWN_MIN_PCT:
        return SLOWDOWN_MIN_PCT, True
    if value > max_pct:
        return max_pct, True
    return value, False


def slot(job_type: str, co_job_types: Sequence[str]) -> str:
    """The exact thing predicted: this job's slowdown next to these co-runners (order of co-runners ignored).

    >>> slot("A", ["C", "B"]) == slot("A", ["B", "C"]) != slot("B", ["A", "C"])
    True
    """
    return f"{job_type} | {' + '.join(sorted(co_job_types))}"


class Ewm:
    """Exponentially weighted mean (``alpha`` = 2 / (span + 1)) and the number of values seen.

    >>> e = Ewm()
    >>> for v in (4.0, 4.0, 4.0): e.update(v, 0.5)
    >>> e.mean, e.n
    (4.0, 3)
    """

    __slots__ = ("mean", "n")

    def __init__(self, mean: float = 0.0, n: int = 0) -> None:
        self.mean = mean
        self.n = n

    def update(self, value: float, alpha: float) -> None:
        self.mean = value if self.n == 0 else self.mean + alpha * (value - self.mean)
        self.n += 1


class Baselines:
    """Last measured interference per slot (EWM of its measurements) and the rolling median of all of them."""

    def __init__(self, span: int = 3, median_window: int = 1000, max_slots: int = 20_000) -> None:
        from river import stats

        self.alpha = 2.0 / (span + 1.0)
        self.median_window = median_window
        self.max_slots = max_slots
        self.last: dict[str, Ewm] = {}
        self._median = stats.RollingQuantile(q=0.5, window_size=median_window)
        self._recent: list[float] = []  # the median's window, for persistence
        self.labels = 0
        self.lo = math.inf
        self.hi = -math.inf
        """The smallest and largest measurement so far: a new job set predicted outside them is extrapolation."""
        self.types: dict[str, int] = {}
        """Measurements per job type, as the job or a co-runner (at most ``max_slots`` types)."""

    def measured(self, key: str) -> int:
        """How many measurements of this slot the baselines hold (0: a job set never measured)."""
        e = self.last.get(key)
        return 0 if e is None else e.n

    def novel(self, job_types: Iterable[str]) -> bool:
        """Whether one of ``job_types`` was never measured here, as a job or a co-runner.

        >>> b = Baselines()
        >>> b.update(slot("A", ["B"]), 40.0, ["A", "B"])
        >>> b.novel(["B", "A"]), b.novel(["A", "C"])
        (False, True)
        """
        return any(t not in self.types for t in job_types)

    def predict(self, name: str, key: str) -> float | None:
        if name == LAST_MEASURED:
            e = self.last.get(key)
            return None if e is None else e.mean
        return None if self.labels == 0 else float(self._median.get())

    def update(self, key: str, y: float, job_types: Sequence[str] = ()) -> None:
        """Learn measurement ``y`` of slot ``key``, whose job and co-runners are ``job_types``."""
        for t in job_types:
            if t in self.types or len(self.types) < self.max_slots:
                self.types[t] = self.types.get(t, 0) + 1
        e = self.last.get(key)
        if e is None:
            if len(self.last) >= self.max_slots:  # forget the oldest slot (dicts keep insertion order)
                self.last.pop(next(iter(self.last)))
            e = self.last[key] = Ewm()
        e.update(y, self.alpha)
        self.lo, self.hi = min(self.lo, y), max(self.hi, y)
        self._median.update(y)
        self._recent.append(y)
        if len(self._recent) > 2 * self.median_window:
            del self._recent[: -self.median_window]
        self.labels += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "last": {k: [e.mean, e.n] for k, e in self.last.items()},
            "recent": self._recent[-self.median_window :],
            "labels": self.labels,
            "range": [self.lo, self.hi] if self.labels else None,
            "types": self.types,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], median_window: int = 1000, max_slots: int = 20_000) -> Baselines:
        self = cls(median_window=median_window, max_slots=max_slots)
        self.alpha = float(d["alpha"])
        self.last = {k: Ewm(float(m), int(n)) for k, (m, n) in d["last"].items()}
        for y in d["recent"]:
            self._median.update(float(y))
            self._recent.append(float(y))
        self.labels = int(d["labels"])
        if d.get("range"):
            self.lo, self.hi = (float(v) for v in d["range"])
        if "types" in d:
            self.types = {str(t): int(n) for t, n in d["types"].items()}
        else:  # saved before types were counted: the slots' job types, each counted as measured
            for key, e in self.last.items():
                job, _, co = key.partition(" | ")
                for t in (job, *(c for c in co.split(" + ") if c)):
                    self.types[t] = self.types.get(t, 0) + e.n
        return self


def median_cv_mae(targets: Sequence[float], folds: Sequence[tuple[Any, Any]]) -> float:
    """Grouped-CV MAE of the median baseline: each test fold predicted by its training fold's median.

    >>> import numpy as np
    >>> median_cv_mae([0.0, 0.0, 10.0, 10.0], [(np.array([0, 1]), np.array([2, 3])), (np.array([2, 3]), np.array([0, 1]))])
    10.0
    """
    import numpy as np

    y = np.asarray(targets, dtype=float)
    errors = np.zeros(len(y))
    for tr, te in folds:
        errors[te] = np.abs(y[te] - float(np.median(y[tr])))
    return float(errors.mean()) if len(y) else math.nan

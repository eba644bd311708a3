"""Pieces of the live selection that are plain arithmetic: bounds, what was measured, and the two baselines.

* :func:`clip_pct`: a slowdown below -100 % cannot happen (it would mean a job ran faster than alone by more
  than its whole step time); above a configured maximum it is a model blowing up, not a measurement.
* :class:`Measurements`: what an environment has measured: per slot (job and co-runners) how often, per job
  type how often, and the range of the slowdowns.  It decides a prediction's regime (``seen`` or ``new``) and
  whether a job type is novel.
* The baselines, regressors with river's ``learn_one`` / ``predict_one`` (like ``dummy.StatisticRegressor``):
  what a scheduler would do without any model.  :class:`LastMeasured` answers the last measured interference
  of this exact slot (an exponentially weighted mean of its measurements; its input is the slot), and
  :class:`models.rolling.RollingMedian` the median of recent measurements (its input is ignored).  Both are candidates of
  the selection like any model: a model that cannot beat them is not served.

No Kafka, no faust, no live state beyond what is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from models.rolling import Ewm, EwmState

LAST_MEASURED = "baseline.last_measured"
MEDIAN = "baseline.median"
BASELINES = (LAST_MEASURED, MEDIAN)

SLOWDOWN_MIN_PCT = -100.0
"""No job runs faster than alone by more than its whole step time."""

MAX_SLOTS = 20_000
"""Slots (and job types) remembered; beyond, the oldest slot is forgotten."""


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



def _remember(slots: dict[str, Any], key: str, make: Any, max_slots: int) -> Any:
    """``slots[key]``, made when missing; the oldest slot is forgotten beyond ``max_slots`` (dicts keep order)."""
    v = slots.get(key)
    if v is None:
        if len(slots) >= max_slots:
            slots.pop(next(iter(slots)))
        v = slots[key] = make()
    return v


class MeasurementsState(msgspec.Struct):
    slots: dict[str, int]
    types: dict[str, int]
    labels: int
    range: tuple[float, float] | None = None


class Measurements:
    """Per slot and per job type, how many measurements this environment holds; the range of their slowdowns.

    >>> m = Measurements()
    >>> m.update(slot("A", ["B"]), 40.0, ["A", "B"])
    >>> m.measured(slot("A", ["B"])), m.novel(["B", "A"]), m.novel(["A", "C"])
    (1, False, True)
    """

    def __init__(self, max_slots: int = MAX_SLOTS) -> None:
        self.max_slots = max_slots
        self.slots: dict[str, int] = {}
        self.labels = 0
        self.lo = math.inf
        self.hi = -math.inf
        """The smallest and largest measurement so far: a new job set predicted outside them is extrapolation."""
        self.types: dict[str, int] = {}
        """Measurements per job type, as the job or a co-runner (at most ``max_slots`` types)."""

    def measured(self, key: str) -> int:
        """How many measurements of this slot there are (0: a job set never measured)."""
        return self.slots.get(key, 0)

    def novel(self, job_types: Iterable[str]) -> bool:
        """Whether one of ``job_types`` was never measured here, as a job or a co-runner."""
        return any(t not in self.types for t in job_types)

    def update(self, key: str, y: float, job_types: Sequence[str] = ()) -> None:
        """Count measurement ``y`` of slot ``key``, whose job and co-runners are ``job_types``."""
        for t in job_types:
            if t in self.types or len(self.types) < self.max_slots:
                self.types[t] = self.types.get(t, 0) + 1
        if key not in self.slots and len(self.slots) >= self.max_slots:
            self.slots.pop(next(iter(self.slots)))
        self.slots[key] = self.slots.get(key, 0) + 1
        self.lo, self.hi = min(self.lo, y), max(self.hi, y)
        self.labels += 1

    def state(self) -> MeasurementsState:
        return MeasurementsState(dict(self.slots), dict(self.types), self.labels, (self.lo, self.hi) if self.labels else None)

    @classmethod
    def restore(cls, s: MeasurementsState, max_slots: int = MAX_SLOTS) -> Measurements:
        self = cls(max_slots)
        self.slots, self.types, self.labels = dict(s.slots), dict(s.types), s.labels
        if s.range is not None:
            self.lo, self.hi = s.range
        return self


class LastMeasuredState(msgspec.Struct, tag="last_measured"):
    fading_factor: float
    slots: dict[str, EwmState]


class LastMeasured:
    """The last measured interference of the slot it is given (an EWM of the slot's measurements, ``span``
    measurements long); None for a slot never measured.

    >>> b = LastMeasured(span=1)
    >>> b.predict_one("x") is None
    True
    >>> for y in (10.0, 20.0): b.learn_one("x", y)
    >>> b.predict_one("x")
    20.0
    """

    def __init__(self, span: int = 3, max_slots: int = MAX_SLOTS) -> None:
        self.fading_factor = 2.0 / (span + 1.0)
        self.max_slots = max_slots
        self.slots: dict[str, Ewm] = {}

    def learn_one(self, x: str, y: float) -> None:
        _remember(self.slots, x, lambda: Ewm(self.fading_factor), self.max_slots).update(y)

    def predict_one(self, x: str) -> float | None:
        e = self.slots.get(x)
        return None if e is None else e.get()

    def state(self) -> LastMeasuredState:
        return LastMeasuredState(self.fading_factor, {k: e.state() for k, e in self.slots.items()})

    @classmethod
    def restore(cls, s: LastMeasuredState, max_slots: int = MAX_SLOTS) -> LastMeasured:
        self = cls(max_slots=max_slots)
        self.fading_factor = s.fading_factor
        self.slots = {k: Ewm(s.fading_factor, e) for k, e in s.slots.items()}
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

"""Rolling statistics, each with its saved state (a msgspec Struct): what the selection and the baselines keep.

* :class:`RollingMean`: the mean of the last ``window`` values (a candidate's prequential rolling MAE);
* :class:`Ewm`: an exponentially weighted mean (a slot's error, the last-measured baseline);
* :class:`RollingMedian`: the median of the last ``window`` values (the median baseline);
* :class:`ResidualWindow`: the last ``window`` residuals and their conformal offsets (online intervals).

Pure arithmetic: no Kafka, no faust.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from models.intervals import COVERAGE, conformal_offsets


class MeanState(msgspec.Struct, array_like=True):
    """A saved rolling mean: river's ``stats.Mean`` state and its window."""

    n: float
    mean: float
    values: list[float]


class RollingMean:
    """river's ``utils.Rolling(stats.Mean, window)`` with ``n`` and None when empty (the prequential rolling MAE): its
    arithmetic, the same floats (``stats.Mean``'s ``update`` and ``revert`` with weight 1.0, the oldest value
    reverted before the newest is added), without river's wrappers, a scored residual being the learner's commonest
    operation (each candidate, each observation).

    >>> r = RollingMean(2)
    >>> for v in (1.0, 2.0, 6.0): r.update(v)
    >>> r.n, r.get()
    (2, 4.0)
    """

    __slots__ = ("count", "mean", "values", "window")

    def __init__(self, window: int, state: MeanState | None = None) -> None:
        self.window = window
        self.values: deque[float] = deque(maxlen=window)
        self.count = 0.0
        """river's ``Mean.n``: the sum of the weights (1.0 each) in the window."""
        self.mean = 0.0
        if state is not None:  # exactly as saved (a fresh mean of the window would differ in the last bits)
            self.count, self.mean = float(state.n), float(state.mean)
            self.values.extend(state.values)

    def update(self, v: float) -> None:
        values = self.values
        if len(values) == self.window:  # river's Mean.revert of the oldest value
            count = self.count - 1.0
            self.count = count
            self.mean = 0.0 if count == 0 else self.mean - (1.0 / count) * (values[0] - self.mean)
        self.count += 1.0  # river's Mean.update
        self.mean += (1.0 / self.count) * (v - self.mean)
        values.append(v)

    @property
    def n(self) -> int:
        return len(self.values)

    def get(self) -> float | None:
        return float(self.mean) if self.values else None

    def state(self) -> MeanState:
        return MeanState(self.count, self.mean, list(self.values))


class EwmState(msgspec.Struct, array_like=True):
    """A saved :class:`Ewm`."""

    mean: float
    n: int


class Ewm:
    """river's ``stats.EWMean`` (``fading_factor`` = 2 / (span + 1)) and the number of values seen.

    >>> e = Ewm(0.5)
    >>> for v in (4.0, 2.0): e.update(v)
    >>> e.get(), e.n
    (3.0, 2)
    """

    __slots__ = ("_mean", "fading_factor", "n")

    def __init__(self, fading_factor: float, state: EwmState | None = None) -> None:
        from river import stats

        self.fading_factor = fading_factor
        self._mean = stats.EWMean(fading_factor=fading_factor)
        self.n = 0
        if state is not None and state.n:
            self._mean.update(state.mean)  # the first value becomes the mean exactly
            self.n = state.n

    def update(self, value: float) -> None:
        self._mean.update(value)
        self.n += 1

    def get(self) -> float:
        return float(self._mean.get())

    def state(self) -> EwmState:
        return EwmState(self.get(), self.n)


class RollingMedianState(msgspec.Struct, tag="median"):
    window: int
    recent: list[float]


class RollingMedian:
    """The median of the last ``window`` measurements, whatever the input (river's ``stats.RollingQuantile``);
    None before the first.

    >>> b = RollingMedian(window=3)
    >>> for y in (10.0, 20.0, 30.0, 100.0): b.learn_one(None, y)
    >>> b.predict_one(None)
    30.0
    """

    def __init__(self, window: int = 1000) -> None:
        from river import stats

        self.window = window
        self._median = stats.RollingQuantile(q=0.5, window_size=window)
        self._recent: list[float] = []  # the median's window, for persistence
        self.n = 0

    def learn_one(self, x: Any, y: float) -> None:
        self._median.update(y)
        self._recent.append(y)
        if len(self._recent) > 2 * self.window:
            del self._recent[: -self.window]
        self.n += 1

    def predict_one(self, x: Any) -> float | None:
        return None if self.n == 0 else float(self._median.get())

    def state(self) -> RollingMedianState:
        return RollingMedianState(self.window, self._recent[-self.window :])

    @classmethod
    def restore(cls, s: RollingMedianState) -> RollingMedian:
        self = cls(s.window)
        for y in s.recent:
            self.learn_one(None, y)
        return self


class ResidualWindow:
    """The last ``window`` prequential residuals of one candidate and their conformal offsets.

    >>> w = ResidualWindow(100)
    >>> for r in range(-50, 51): w.update(float(r))
    >>> w.n, w.offsets()
    (100, (-45.0, 46.0))
    """

    __slots__ = ("_offsets", "values")

    def __init__(self, window: int, values: Sequence[float] = ()) -> None:
        self.values: deque[float] = deque(values, maxlen=window)
        self._offsets: tuple[float, float] | bool | None = False
        """:meth:`offsets` at :data:`COVERAGE` since the last update (False: not made yet); a what-if asks those of
        one candidate for every entry it serves."""

    def update(self, residual: float) -> None:
        if math.isfinite(residual):
            self.values.append(residual)
            self._offsets = False

    @property
    def n(self) -> int:
        return len(self.values)

    def offsets(self, coverage: float = COVERAGE) -> tuple[float, float] | None:
        """None until the window holds enough residuals for a finite interval."""
        if coverage == COVERAGE and self._offsets is not False:
            return self._offsets  # type: ignore[return-value]
        lo, hi = conformal_offsets(np.fromiter(self.values, dtype=float, count=len(self.values)), coverage)
        got = (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None
        if coverage == COVERAGE:
            self._offsets = got
        return got

    def offsets_or_range(self, coverage: float = COVERAGE) -> tuple[float, float] | None:
        """:meth:`offsets`, else, with too few residuals for a finite ``coverage`` interval, their range (which
        holds a new exchangeable residual with probability ``(n - 1) / (n + 1)``); None below two residuals.

        >>> w = ResidualWindow(100, [-1.0, 0.5, 2.0])
        >>> w.offsets(), w.offsets_or_range()
        (None, (-1.0, 2.0))
        """
        got = self.offsets(coverage)
        if got is not None or self.n < 2:
            return got
        return min(self.values), max(self.values)

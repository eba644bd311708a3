"""A job set of three or more, never measured, composed from its pairs (pure functions and one small scorer).

The feature models are trained mostly on pairs: next to two co-runners they extrapolate, and a new job set's
prediction is bounded to the range of slowdowns measured, which pairs set.  A job next to several co-runners is
slowed by each of them; composing its pairwise slowdowns (each measured or predicted) multiplicatively,
``(1 + s_a)(1 + s_b) - 1``, is the independence assumption of Gavel-style space sharing: each co-runner takes its
share of the job's time regardless of the others.  The composition has no parameter; whether it is served is
decided by its prequential error against the feature model's on the first observations of job sets of 3+
(:class:`ComposeScore`), never by the simulator's formula.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def compose_pct(pair_pcts: Sequence[float]) -> float:
    """A job's slowdown (%) next to several co-runners from its slowdown next to each alone.

    >>> compose_pct([100.0, 50.0])  # half speed, then two thirds of that: a third of solo
    200.0
    >>> round(compose_pct([20.0]), 9)
    20.0
    """
    return (math.prod(max(0.0, 1.0 + p / 100.0) for p in pair_pcts) - 1.0) * 100.0


def compose_interval(pair_intervals: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The composed interval: the composition of the pairs' lower ends and of their upper ends.

    >>> tuple(round(v, 9) for v in compose_interval([(0.0, 100.0), (10.0, 50.0)]))
    (10.0, 200.0)
    """
    return compose_pct([lo for lo, _ in pair_intervals]), compose_pct([hi for _, hi in pair_intervals])


class ComposeScore:
    """Prequential absolute errors of the composed and the served prediction on job sets of 3+ never measured.

    >>> s = ComposeScore(min_samples=2)
    >>> s.serve_composed()  # no evidence yet: the composition (its physical prior)
    True
    >>> for _ in range(2): s.update(composed=10.0, served=30.0, y=12.0)
    >>> s.serve_composed(), s.n
    (True, 2)
    >>> for _ in range(4): s.update(composed=90.0, served=30.0, y=32.0)
    >>> s.serve_composed()
    False
    >>> t = ComposeScore(min_samples=2, margin=0.25)
    >>> for _ in range(2): t.update(composed=22.0, served=18.0, y=0.0)  # 22 > 18 but within 25 %
    >>> t.serve_composed()
    True
    """

    def __init__(self, min_samples: int = 10, margin: float = 0.0) -> None:
        self.min_samples = min_samples
        self.margin = margin
        """The composition stays served until its error exceeds the other's by this share: the rows scored are
        job sets a scheduler placed (they fit, within what was measured), the questions it is served for include
        job sets beyond every slowdown measured, where only the composition extrapolates."""
        self.n = 0
        self.composed_abs = 0.0
        self.served_abs = 0.0

    def update(self, *, composed: float, served: float, y: float) -> None:
        self.n += 1
        self.composed_abs += abs(composed - y)
        self.served_abs += abs(served - y)

    def serve_composed(self) -> bool:
        """The composition is served unless, on at least ``min_samples`` scored rows, it did worse by more than
        ``margin``."""
        return self.n < self.min_samples or self.composed_abs <= (1.0 + self.margin) * self.served_abs

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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from models.datasets import Sample
from models.live import clip_pct
from models.prediction import Composition, PredictionResult
from models.rolling import ResidualWindow
from models.views import Views

PredictMany = Callable[[Sequence[tuple[Views, str]], bool], list[PredictionResult | None]]
"""Each (views, mode) predicted by the candidate serving it; the bool: with intervals."""


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


PairKey = tuple[Any, ...]
"""A pair's key: (job type, co-runner's type, the job's solo profile items, the co-runner's), :func:`pair_key`."""


def profile_items(profile: Mapping[str, float | None]) -> tuple[Any, ...]:
    return tuple(sorted(profile.items()))


def pair_key(job_type: str, co_type: str, solo: Mapping[str, float | None], co_solo: Mapping[str, float | None]) -> PairKey:
    """The key of the pair ``job_type`` next to ``co_type`` with these solo profiles (what its prediction depends on).

    >>> pair_key("a", "b", {"S": 2.0, "M": 1.0}, {})
    ('a', 'b', (('M', 1.0), ('S', 2.0)), ())
    """
    return (job_type, co_type, profile_items(solo), profile_items(co_solo))


def compose_samples(
    samples: Sequence[Sample],
    predict_many: PredictMany,
    max_pct: float,
    *,
    intervals: bool = True,
    pairs: Mapping[PairKey, PredictionResult | None] | None = None,
) -> list[Composition | None]:
    """Each sample's slowdown composed from its job's predicted slowdown next to each co-runner alone
    (:func:`compose_pct`, the pairs predicted by ``predict_many(asks, intervals)``), bounded to ``-100`` and to what pairs each at ``max_pct`` compose to (a
    slowdown compounds past any one pair's bound: Gavel-style sharing, not a cap), with the composed interval and whether
    every pair was measured; None where a pair has no prediction.  ``intervals`` False: no composed interval
    (None), the pairs predicted without theirs.  ``pairs``: pairs already predicted (with their intervals), by
    :func:`pair_key`; only the others are predicted here."""
    # each distinct pair predicted once per call: a window's what-if asks the pairs of the jobs already there
    # once per newcomer (same types, same profiles, so the same prediction)
    keys: list[tuple[Any, ...]] = []
    unique: dict[tuple[Any, ...], Sample] = {}
    profiles: dict[int, tuple[Any, ...]] = {}  # id -> sorted items, of the profiles of this call (all alive)

    def items(p: Mapping[str, float | None]) -> tuple[Any, ...]:
        k = profiles.get(id(p))
        if k is None:
            k = profiles[id(p)] = profile_items(p)
        return k

    for s in samples:
        for co, cs in zip(s.co_job_types, s.co_solos, strict=True):
            key = (s.job_type, co, items(s.solo), items(cs))
            keys.append(key)
            if key not in unique and (pairs is None or key not in pairs):
                unique[key] = Sample(s.job_type, (co,), math.nan, "", s.environment, {}, dict(s.solo), (dict(cs),))
    by_key = dict(zip(unique, predict_many([(Views(p), "placement") for p in unique.values()], intervals), strict=True))
    if pairs is not None:
        by_key.update((k, pairs[k]) for k in keys if k not in by_key)
    preds = iter([by_key[k] for k in keys])
    out: list[Composition | None] = []
    for s in samples:
        rs = [next(preds) for _ in s.co_job_types]
        if any(r is None for r in rs):
            out.append(None)
            continue
        top = compose_pct([max_pct] * len(rs))  # what pairs each at the bound compose to
        value = clip_pct(compose_pct([r.interference_pct for r in rs if r is not None]), top)[0]
        ivs = [r.interval_pct for r in rs if r is not None]
        interval = None
        if intervals and all(iv is not None for iv in ivs):
            lo, hi = compose_interval([iv for iv in ivs if iv is not None])
            interval = (min(clip_pct(lo, top)[0], value), max(clip_pct(hi, top)[0], value))
        out.append((value, interval, all(r is not None and r.regime == "seen" for r in rs)))
    return out


def serve_composed(
    samples: Sequence[Sample],
    results: list[PredictionResult | None],
    *,
    compose: Callable[[Sequence[Sample], bool], list[Composition | None]],
    scores: Mapping[bool, ComposeScore],
    residuals: ResidualWindow,
    max_pct: float,
    what_if: bool,
    compositions: Mapping[int, Composition | None] | None = None,
) -> list[PredictionResult | None]:
    """``results`` with each job set of 3+ never measured composed from its pairs (``compose(samples, intervals)``, :func:`compose_samples`) where the
    composition scores no worse than what is served (its :class:`ComposeScore` in ``scores``), its interval at
    least as wide, multiplicatively, as what such job sets measured first were off by (``residuals``, log ratios).  A what-if's composed
    slowdown is bounded by what pairs each at ``max_pct`` compose to (a hypothetical job set may be one no
    scheduler would run: its slowdown compounds); a running job's prediction stays in ``[-100, max_pct]``.
    ``compositions``: ``compose`` of (at least) those samples, by index, already made."""
    many = [
        i
        for i, (s, r) in enumerate(zip(samples, results, strict=True))
        if r is not None and r.regime == "new" and len(s.co_job_types) >= 2
    ]
    if not many:
        return results
    offsets = residuals.offsets()
    made = [compositions[i] for i in many] if compositions is not None else compose([samples[i] for i in many], offsets is None)
    for i, composed in zip(many, made, strict=True):
        r = results[i]
        if r is None:
            continue
        value, interval, model = r.interference_pct, r.interval_pct, r.model
        top = compose_pct([max_pct] * len(samples[i].co_job_types)) if what_if else max_pct
        clipped = r.clipped
        if composed is not None and scores[composed[2]].serve_composed():
            (value, clipped), interval = clip_pct(composed[0], top), composed[1]
            if interval is not None:
                interval = (min(clip_pct(interval[0], top)[0], value), max(clip_pct(interval[1], top)[0], value))
            model = f"compose/{r.model}"
        if offsets is not None:
            # a composed value: the conformal interval of what job sets of 3+ measured first were off by (the
            # residuals of what was served, the composition where it was), multiplicative like it; the pairs'
            # composed interval besides made it over-cover (0.96-0.97 on the full bench).  Else at least that wide.
            lo, hi = ((1.0 + value / 100.0) * math.exp(o) * 100.0 - 100.0 for o in offsets)
            lo, hi = clip_pct(lo, top)[0], clip_pct(hi, top)[0]
            if interval is None or model.startswith("compose/"):
                interval = (min(lo, value), max(hi, value))
            else:
                interval = (min(lo, interval[0]), max(hi, interval[1]))
        results[i] = PredictionResult(
            value, model, r.category, r.mode, r.expected_error_pct, r.regime, clipped, interval
        )  # fmt: skip
    return results

"""What was measured of a job type, carried to its job sets never measured: a residual model over a feature model.

A feature model (placement mode: solo profiles, families, batch sizes) predicts a job's slowdown next to its
co-runners.  For a job type it has little or nothing of, its error is mostly the type's own: a sensitive victim
is under-predicted next to everyone, an aggressive co-runner slows everyone more than its profile says.  This
module learns that error from the type's first measurements, as the job (victim) and as a co-runner
(aggressor), and adds it to the feature model's prediction:

    residual(v | A) ~ bv[family(v)] + bv[v] + mean over a in A of (ba[family(a)] + ba[a]) + p_v . mean(q_a)

* per-role biases, at two levels: the family's (every batch size of ``ResNet-50`` shares it) and the type's on
  what the family's leaves;
* low-rank victim x aggressor factors ``p_v``, ``q_a`` (``rank``; 0: none) on what the biases leave;
* shrunk toward the feature model: a bias is the sum of its rows' partial residuals over ``count + prior``, so
  a type with few measurements keeps most of the feature model's prediction (``prior`` rows of zero residual),
  and the factors are ridge-regularised the same way.

Two ways to learn, one model: :meth:`Newcomer.learn_one` (online, O(rank x co-runners) per observation: running
sums for the biases, one SGD step for the factors) and :meth:`Newcomer.fit` (batch: backfitting sweeps of the
exact shrunk means, then alternating ridge least squares for the factors).  Pure Python plus numpy; no feature
model inside: callers pass residuals (the stream's candidate live).  :class:`NewcomerEstimator` puts the two
together: a feature model of the last refit plus a :class:`Newcomer` on its residuals in log-speed points.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.features import parse_job_type
from models.views import VIA, CandidateKey, Views


@dataclass(frozen=True)
class Role:
    """A job of a row: its type and family (the type without its batch size)."""

    job_type: str
    family: str = ""

    @staticmethod
    def of(job_type: str, family: str = "") -> Role:
        """``family`` defaults to :func:`models.features.parse_job_type`'s.

        >>> Role.of("ResNet-50 (batch size 64)").family
        'resnet-50'
        """
        return Role(job_type, family or parse_job_type(job_type)[0])


Row = tuple[Role, Sequence[Role], float]
"""(the job, its co-runners, the feature model's residual: measured minus predicted)."""


@dataclass
class _Bias:
    """A shrunk mean: ``total / (count + prior)`` (no rows: 0)."""

    total: float = 0.0
    count: int = 0

    def value(self, prior: float) -> float:
        return self.total / (self.count + prior) if self.count else 0.0


class Newcomer:
    """Per-role, per-level biases plus rank-``rank`` victim x aggressor factors over a feature model's residuals.

    >>> m = Newcomer(rank=0, prior=1.0)
    >>> rec, net = Role("rec (batch size 8)", "rec"), Role("net (batch size 8)", "net")
    >>> for _ in range(3):
    ...     m.learn_one(rec, [net], 30.0)
    >>> round(m.predict_one(rec, [net]), 1)  # the job set measured: nearly all of its residual
    29.9
    >>> round(m.predict_one(Role("rec (batch size 16)", "rec"), [net]), 1)  # a sibling batch size: family + aggressor
    21.9
    >>> round(m.predict_one(Role("other", "other"), [Role("x", "x")]), 1)  # nothing measured of either: no change
    0.0
    """

    def __init__(
        self, rank: int = 2, prior: float = 2.0, lr: float = 0.02, reg: float = 1.0, init_scale: float = 0.1, seed: int = 0,
        max_step: float = 25.0,
    ) -> None:  # fmt: skip
        """``prior``: pseudo-rows of zero residual behind every bias (with ``n`` measurements a bias keeps
        ``n / (n + prior)``); ``reg``: the ridge penalty of the factors (batch) and their weight decay (online, times
        ``lr``); ``max_step``: the online factors' SGD error is bounded to ``+-max_step`` (points)."""
        self.rank, self.prior, self.lr, self.reg, self.init_scale, self.seed = rank, prior, lr, reg, init_scale, seed
        self.max_step = max_step
        self.victim_family: dict[str, _Bias] = {}
        self.victim_type: dict[str, _Bias] = {}
        self.aggressor_family: dict[str, _Bias] = {}
        self.aggressor_type: dict[str, _Bias] = {}
        self.p: dict[str, np.ndarray] = {}
        self.q: dict[str, np.ndarray] = {}
        self.observations = 0
        self._rng = np.random.default_rng(seed)

    # ----------------------------------------------------------------------------------------- the parts
    def _victim(self, job: Role) -> float:
        vf, vt = self.victim_family.get(job.family), self.victim_type.get(job.job_type)
        return (vf.value(self.prior) if vf else 0.0) + (vt.value(self.prior) if vt else 0.0)

    def _aggressor_one(self, co: Role) -> float:
        af, at = self.aggressor_family.get(co.family), self.aggressor_type.get(co.job_type)
        return (af.value(self.prior) if af else 0.0) + (at.value(self.prior) if at else 0.0)

    def _aggressor(self, co: Sequence[Role]) -> float:
        return sum(self._aggressor_one(a) for a in co) / len(co) if co else 0.0

    def _interaction(self, job: Role, co: Sequence[Role]) -> float:
        pv = self.p.get(job.job_type)
        qs = [self.q[a.job_type] for a in co if a.job_type in self.q]
        if pv is None or not qs:
            return 0.0
        return float(pv @ (sum(qs) / len(co)))

    def predict_one(self, job: Role, co: Sequence[Role]) -> float:
        """The correction to add to the feature model's prediction for ``job`` next to ``co`` (points)."""
        return self._victim(job) + self._aggressor(co) + self._interaction(job, co)

    def measured(self, job_type: str) -> int:
        """How many rows this type was in, as the job or as a co-runner."""
        v, a = self.victim_type.get(job_type), self.aggressor_type.get(job_type)
        return (v.count if v else 0) + (a.count if a else 0)

    # ----------------------------------------------------------------------------------------- online
    def _factor(self, table: dict[str, np.ndarray], key: str) -> np.ndarray:
        if key not in table:
            table[key] = self._rng.normal(0.0, self.init_scale, self.rank)
        return table[key]

    def learn_one(self, job: Role, co: Sequence[Role], residual: float) -> None:
        """One labelled observation: each bias adds the residual less the other parts as they are now, then one
        SGD step of the factors on what is left."""
        if not np.isfinite(residual):
            raise ValueError(f"residual must be finite, not {residual!r}")
        self.observations += 1
        inter = self._interaction(job, co)
        agg = self._aggressor(co)
        vf = self.victim_family.setdefault(job.family, _Bias())
        vf.total += residual - agg - inter - self._part(self.victim_type, job.job_type)
        vf.count += 1
        vt = self.victim_type.setdefault(job.job_type, _Bias())
        vt.total += residual - agg - inter - vf.value(self.prior)
        vt.count += 1
        vic = self._victim(job)
        for a in co:
            others = (sum(self._aggressor_one(b) for b in co) - self._aggressor_one(a)) / len(co)
            af = self.aggressor_family.setdefault(a.family, _Bias())
            af.total += len(co) * (residual - vic - inter - others) - self._part(self.aggressor_type, a.job_type)
            af.count += 1
            at = self.aggressor_type.setdefault(a.job_type, _Bias())
            at.total += len(co) * (residual - vic - inter - others) - af.value(self.prior)
            at.count += 1
        if self.rank and co:
            # one SGD step on what the biases leave, the step's error bounded (a Huber step: a residual of hundreds
            # of points, early, does not throw the factors off)
            err = min(max(residual - self._victim(job) - self._aggressor(co) - inter, -self.max_step), self.max_step)
            pv = self._factor(self.p, job.job_type)
            qs = [self._factor(self.q, a.job_type) for a in co]
            qbar = sum(qs) / len(co)
            grad_p = err * qbar - self.reg * pv
            for qa in qs:
                qa += self.lr * (err * pv / len(co) - self.reg * qa)
            pv += self.lr * grad_p

    def _part(self, table: dict[str, _Bias], key: str) -> float:
        b = table.get(key)
        return b.value(self.prior) if b else 0.0

    # ----------------------------------------------------------------------------------------- batch
    def fit(self, rows: Iterable[Row], sweeps: int = 8) -> Newcomer:
        """Refit from scratch on ``rows``: backfitting of the shrunk biases (each in turn the shrunk mean of what
        the others leave), then alternating ridge least squares of the factors on what the biases leave."""
        data = [(job, tuple(co), float(r)) for job, co, r in rows]
        self.victim_family, self.victim_type, self.aggressor_family, self.aggressor_type = {}, {}, {}, {}
        self.p, self.q = {}, {}
        self.observations = len(data)
        if not data:
            return self
        for _ in range(sweeps):
            self._sweep_victim(data, family=True)
            self._sweep_victim(data, family=False)
            self._sweep_aggressor(data, family=True)
            self._sweep_aggressor(data, family=False)
        if self.rank:
            self._als(data, sweeps)
        return self

    def _sweep_victim(self, data: Sequence[tuple[Role, tuple[Role, ...], float]], *, family: bool) -> None:
        table: dict[str, _Bias] = {}
        for job, co, r in data:
            other = self._part(self.victim_type, job.job_type) if family else self._part(self.victim_family, job.family)
            b = table.setdefault(job.family if family else job.job_type, _Bias())
            b.total += r - other - self._aggressor(co)
            b.count += 1
        if family:
            self.victim_family = table
        else:
            self.victim_type = table

    def _sweep_aggressor(self, data: Sequence[tuple[Role, tuple[Role, ...], float]], *, family: bool) -> None:
        table: dict[str, _Bias] = {}
        for job, co, r in data:
            rest = r - self._victim(job)
            for a in co:
                others = (sum(self._aggressor_one(b) for b in co) - self._aggressor_one(a)) / len(co)
                own = self._part(self.aggressor_type, a.job_type) if family else self._part(self.aggressor_family, a.family)
                b = table.setdefault(a.family if family else a.job_type, _Bias())
                b.total += len(co) * (rest - others) - own
                b.count += 1
        if family:
            self.aggressor_family = table
        else:
            self.aggressor_type = table

    def _als(self, data: Sequence[tuple[Role, tuple[Role, ...], float]], sweeps: int) -> None:
        left = [(job, co, r - self._victim(job) - self._aggressor(co)) for job, co, r in data if co]
        for job, co, _ in left:
            self._factor(self.p, job.job_type)
            for a in co:
                self._factor(self.q, a.job_type)
        eye = self.reg * np.eye(self.rank)
        for _ in range(sweeps):
            for table, solve_for_victim in ((self.p, True), (self.q, False)):
                gram = {k: eye.copy() for k in table}
                rhs = {k: np.zeros(self.rank) for k in table}
                for job, co, r in left:
                    if solve_for_victim:
                        x = sum(self.q[a.job_type] for a in co) / len(co)
                        gram[job.job_type] += np.outer(x, x)
                        rhs[job.job_type] += r * x
                    else:
                        x = self.p[job.job_type] / len(co)
                        for a in co:
                            gram[a.job_type] += np.outer(x, x)
                            rhs[a.job_type] += r * x
                for k in table:
                    table[k] = np.linalg.solve(gram[k], rhs[k])


def roles(job_type: str, co_job_types: Sequence[str]) -> tuple[Role, tuple[Role, ...]]:
    """The job and its co-runners as :class:`Role` (families from the type names).

    >>> roles("LM (batch size 5)", ["A3C"])[1][0].family
    'a3c'
    """
    return Role.of(job_type), tuple(Role.of(t) for t in co_job_types)


def dump(model: Newcomer) -> dict[str, Any]:
    """``model``'s learned state as plain JSON-ready values (settings included); :func:`load` reads it back.

    >>> m = Newcomer(rank=1)
    >>> m.learn_one(*roles("a", ["b"]), 10.0)
    >>> load(dump(m)).predict_one(*roles("a", ["b"])) == m.predict_one(*roles("a", ["b"]))
    True
    """
    def biases(table: dict[str, _Bias]) -> dict[str, list[float]]:
        return {k: [b.total, float(b.count)] for k, b in table.items()}

    return {
        "settings": [model.rank, model.prior, model.lr, model.reg, model.init_scale, model.seed],
        "observations": model.observations,
        "victim_family": biases(model.victim_family), "victim_type": biases(model.victim_type),
        "aggressor_family": biases(model.aggressor_family), "aggressor_type": biases(model.aggressor_type),
        "p": {k: v.tolist() for k, v in model.p.items()}, "q": {k: v.tolist() for k, v in model.q.items()},
    }  # fmt: skip


def load(state: dict[str, Any]) -> Newcomer:
    """The :class:`Newcomer` :func:`dump` wrote."""
    settings: list[float] = list(state["settings"])
    m = Newcomer(int(settings[0]), float(settings[1]), float(settings[2]), float(settings[3]), float(settings[4]), int(settings[5]))
    m.observations = int(state["observations"])

    def biases(name: str) -> dict[str, _Bias]:
        return {k: _Bias(float(t), int(n)) for k, (t, n) in state[name].items()}

    m.victim_family, m.victim_type = biases("victim_family"), biases("victim_type")
    m.aggressor_family, m.aggressor_type = biases("aggressor_family"), biases("aggressor_type")
    m.p = {k: np.asarray(v, dtype=float) for k, v in state["p"].items()}
    m.q = {k: np.asarray(v, dtype=float) for k, v in state["q"].items()}
    return m


class NewcomerEstimator:
    """A feature model (``base``, a batch model of the last refit) plus :class:`models.newcomer.Newcomer` on its
    residuals in log-speed points (:func:`to_log_pct`): ``(1 + base(x)) * exp(correction(job, co-runners)) - 1``."""

    __slots__ = ("_last", "base", "base_key", "residuals")

    def __init__(self, residuals: Newcomer, base: Any = None, base_key: CandidateKey | None = None) -> None:
        self.residuals = residuals
        self.base = base
        self.base_key = base_key
        self._last: tuple[Views, Any, float] | None = None
        """The last :meth:`base_pct` (its views, the base model, the value): learning asks it right after the test."""

    def base_pct(self, views: Views) -> float:
        last = self._last
        if last is not None and last[0] is views and last[1] is self.base:
            return last[2]
        value = float(self.base.predict_rows([views.get(VIA, "all")])[0])
        self._last = (views, self.base, value)
        return value

    def predict(self, views: Views) -> float:
        return self.predict_with(views, self.base_pct(views))

    def predict_many(self, xs: Sequence[Views]) -> list[float]:
        """:meth:`predict` of each, the base model's in one ``predict_rows`` (what-if entries it serves)."""
        base = self.base.predict_rows([v.get(VIA, "all") for v in xs])
        return [self.predict_with(v, float(b)) for v, b in zip(xs, base, strict=True)]

    def base_many(self, xs: Sequence[Views]) -> list[float]:
        """The base model's prediction of each, in one ``predict_rows``."""
        return [float(b) for b in self.base.predict_rows([v.get(VIA, "all") for v in xs])]

    def predict_with(self, views: Views, base_pct: float) -> float:
        correction = self.residuals.predict_one(*roles(views.sample.job_type, views.sample.co_job_types))
        return from_log_pct(to_log_pct(base_pct) + correction)

    def learn(self, views: Views, y: float) -> None:
        self.learn_with(views, y, self.base_pct(views))

    def learn_with(self, views: Views, y: float, base_pct: float) -> None:
        residual = to_log_pct(y) - to_log_pct(base_pct)
        if np.isfinite(residual):
            self.residuals.learn_one(*roles(views.sample.job_type, views.sample.co_job_types), residual)


def to_log_pct(pct: float) -> float:
    """A slowdown in log-speed points, ``100 log(1 + pct / 100)`` (floored at a 99.9 % speed-up): where a job's
    co-runners' effects add (each takes its share of its time) and a residual of a sensitive type is one
    proportion whatever the feature model predicted.  Near 0 it is ``pct``.

    >>> round(to_log_pct(100.0), 2), round(from_log_pct(to_log_pct(250.0)), 9)
    (69.31, 250.0)
    """
    return 100.0 * math.log(max(1e-3, 1.0 + pct / 100.0))


def from_log_pct(log_pct: float) -> float:
    """The slowdown in percent of :func:`to_log_pct`'s log-speed points (the exponent bounded at 1e4 points)."""
    return (math.exp(min(log_pct, 1e4) / 100.0) - 1.0) * 100.0

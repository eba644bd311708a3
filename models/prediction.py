"""What a prediction of :class:`models.environment.EnvironmentModels` is (:class:`PredictionResult`), what serving an
observation keeps for learning it (:class:`Served`), how one will be served (:class:`Plan`), and the pure functions
around them: an observation as a sample, its deterministic draw, log ratios of slowdowns.  No Kafka, no faust.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from events import PARAMETERS, Observation
from models.candidates import Candidate
from models.datasets import Sample
from models.features import observed_features as _observed_features
from models.live import LAST_MEASURED, clip_pct
from models.rolling import ResidualWindow
from models.selector import Choice
from models.views import Views

Composition = tuple[float, tuple[float, float] | None, bool]
"""A job set's slowdown composed from its pairs, its interval, whether every pair was measured (:meth:`EnvironmentModels._compose`)."""

PlacementAsk = tuple[str, Mapping[str, float | None], Sequence[str], Sequence[Mapping[str, float | None]]]
"""A what-if: (job type, its solo profile, the co-runners' job types, their solo profiles)."""


@dataclass(frozen=True)
class PredictionResult:
    interference_pct: float
    model: str
    category: str
    mode: str
    expected_error_pct: float | None
    regime: str = "seen"
    """``seen``: this job set was measured before; ``new``: never, but each of its types was; ``novel``: one of its
    types was never measured here (placement mode, predicted from its solo profile)."""
    clipped: bool = False
    """The model's output was outside ``[-100, max_pct]`` and was bounded."""
    interval_pct: tuple[float, float] | None = None
    """90 % interval (bounded like the prediction): conformal from the last refit's out-of-fold residuals for a
    batch model or the median on a new job set, else from the candidate's rolling prequential residuals in this
    regime; None until there are enough residuals.  A novel type's (:func:`novel_interval`) may have the upper end
    ``math.inf``: unbounded, published as null in a what-if entry."""


@dataclass(frozen=True)
class Served:
    """An observation's predictions in both modes (:meth:`EnvironmentModels.serve`), kept for :meth:`learn
    <EnvironmentModels.learn>` of the same observation: its features and the uncomposed predictions its drift
    detectors judge, computed once for both (before, learning computed them again)."""

    observation_id: str
    generation: int
    """:attr:`EnvironmentModels.generation` when served: learning reuses it only if nothing changed since."""
    views: Views
    raw: tuple[PredictionResult | None, ...]
    """Per mode (:data:`events.MODES`), what the serving candidate predicts, before composition."""
    results: Mapping[str, PredictionResult | None]
    """Per mode, what :meth:`EnvironmentModels.predict` answers."""
    withheld: int
    """Of the two, how many were withheld because a job type is novel (:attr:`EnvironmentModels.withheld_novel`)."""


class Plan(NamedTuple):
    """How one prediction will be served."""

    regime: str
    choice: Choice
    candidate: Candidate
    x: Any
    """What the candidate's estimator takes; None: not made yet (a placement-mode feature model's features, never
    empty: made when it predicts, :meth:`features`)."""
    mode: str
    views: Views

    def features(self) -> Any:
        return self.candidate.features(self.views) if self.x is None else self.x


def profiled(sample: Sample, measured: Iterable[str]) -> bool:
    """Every type of ``sample`` not in ``measured`` comes with a solo profile (some finite value of it).

    >>> profiled(Sample("new", ("old",), 0.0, "", solo={"throughput": 3.0}, co_solos=({},)), {"old"})
    True
    >>> profiled(Sample("new", ("old",), 0.0, "", solo={"throughput": None}, co_solos=({},)), {"old"})
    False
    """
    known = measured if isinstance(measured, set | frozenset | dict) else set(measured)
    missing = {t for t in (sample.job_type, *sample.co_job_types) if t not in known}
    if not missing:
        return True
    profiles = ((sample.job_type, sample.solo), *zip(sample.co_job_types, sample.co_solos, strict=False))
    have = {t for t, p in profiles if t in missing and any(v is not None and math.isfinite(v) for v in p.values())}
    return missing <= have


def observed_features(obs: Observation, category: str = "all") -> dict[str, float]:
    """Percent changes of the category's parameters (missing ones left out)."""
    return _observed_features({p: obs.pct(p) for p in PARAMETERS}, category)


def sample_of(obs: Observation) -> Sample:
    """The observation as a :class:`models.datasets.Sample` (target NaN when unlabelled)."""
    y = math.nan if obs.interference_pct is None else float(obs.interference_pct)
    co = tuple(obs.co_job_types)
    return Sample(
        obs.job_type, co, y, " + ".join(sorted((obs.job_type, *co))), obs.environment,
        {p: obs.pct(p) for p in PARAMETERS}, dict(obs.solo), tuple(dict(s) for s in obs.co_solo),
    )  # fmt: skip


def draw(observation_id: str) -> int:
    """A deterministic draw of an observation (CRC-32 of its id): the same on every worker, in any order, after
    any restart, so a rebuild from the topic samples the same observations.

    >>> draw("GPU-a/j1/1700000000.0") == draw("GPU-a/j1/1700000000.0")
    True
    """
    return zlib.crc32(observation_id.encode())


def _log_ratio(actual_pct: float, predicted_pct: float) -> float:
    """``log((1 + actual) / (1 + predicted))`` of two slowdowns in percent (each floored at a 99.9 % speed-up).

    >>> round(_log_ratio(100.0, 0.0), 4)
    0.6931
    """
    return math.log(max(1e-3, 1.0 + actual_pct / 100.0) / max(1e-3, 1.0 + predicted_pct / 100.0))


def _times_exp(pct: float, log_ratio: float) -> float:
    """The slowdown whose ``1 + pct/100`` is ``pct``'s times ``exp(log_ratio)``.

    >>> round(_times_exp(100.0, math.log(1.5)), 6)
    200.0
    """
    return (1.0 + pct / 100.0) * math.exp(log_ratio) * 100.0 - 100.0


def steady_state_interval(r: PredictionResult, offsets: tuple[float, float] | None, max_pct: float) -> PredictionResult:
    """A what-if of a measured job set served by its last measurements: the interval of the job set's slowdown,
    not of one more window's measurement of it.  ``seen_residuals`` (:class:`models.environment.EnvironmentModels`'s) are a window's measurement against the
    last-measured estimate (an EWM of the job set's measurements): the estimate's error and the window's
    own, each about one window's noise ``sigma^2`` (``2 sigma^2`` together); the steady slowdown is off the
    estimate by the first alone, so the offsets are shrunk by ``sqrt(2)``.  Were window errors independent the EWM
    would average them further (``sqrt(a / 2)`` after many measurements, a half at the default span; after ``n``,
    from the EWM's weights): on the stream they are not (a window that straddles a change of job set, stage 1's
    measurement against the steady state, which no residual sees), and with those shrinks the live quick bench's
    measured job sets' intervals held the truth for 0.83 and 0.81 of the entries (docs/BENCHMARKS.md).  Log ratios: a job set
    slowed more, whose measurements spread more, gets a wider interval.  ``offsets``: ``seen_residuals``'
    conformal offsets.  Other what-ifs are unchanged."""
    if r.regime != "seen" or r.model != LAST_MEASURED or offsets is None:
        return r
    v = r.interference_pct
    lo, hi = (clip_pct(_times_exp(v, o / math.sqrt(2.0)), max_pct)[0] for o in offsets)
    return replace(r, interval_pct=(min(lo, v), max(hi, v)))


def novel_interval(
    value: float, prior: tuple[float, float] | None, firsts: ResidualWindow, max_pct: float
) -> tuple[float, float]:
    """A novel type's 90 % interval: what the environment learned about types at their first co-location, the
    split-conformal offsets of the log ratios of their first measurements to what was predicted for them
    (``firsts``: multiplicative, a type slowed more is off by more), at least as wide as ``prior`` (additive
    offsets: the spread of every slowdown measured here around their median, and the new job sets' offsets).
    Its upper end is ``math.inf`` (published null, unbounded) where nothing supports one: while too few types'
    first measurements were seen for a finite 90 % upper end (the lower end then from their range and the prior),
    or where it would pass ``max_pct`` (the bound of every published value: bounded there, the interval would say
    the truth lies below it, which nothing measured says).  Too few: both ends from the same ``n`` residuals, each
    tail ``0.05``, the upper end is the ``ceil(0.95 (n + 1))``-th smallest, finite from ``n = 19``.  A one-sided
    upper end alone (``ceil(0.9 (n + 1))``-th, finite from ``n = 9``) would need a lower end of -100 and is not
    used: on the simulated fleet the first measurements are of the types a scheduler co-located, and the types it
    never did (whose entries are most of the novel ones) are slowed far past such an end (docs/MODELS.md).

    >>> w = ResidualWindow(100, [0.01 * i - 0.5 for i in range(101)])  # log ratios -0.5 .. 0.5
    >>> lo, hi = novel_interval(100.0, (-20.0, 30.0), w, 1000.0); round(lo, 1), round(hi, 1)
    (27.5, 216.8)
    >>> novel_interval(100.0, (-20.0, 30.0), ResidualWindow(100, [0.0, 0.1]), 1000.0)  # thin history
    (80.0, inf)
    >>> novel_interval(600.0, None, w, 1000.0)[1]  # past the bound
    inf
    """
    ratio = firsts.offsets()
    los = [value] + ([value + prior[0]] if prior is not None else [])
    his = [value] + ([value + prior[1]] if prior is not None else [])
    if ratio is not None:
        los.append(_times_exp(value, ratio[0]))
        his.append(_times_exp(value, ratio[1]))
    else:
        seen = firsts.offsets_or_range()  # thin: the lower end from their range
        if seen is not None:
            los.append(_times_exp(value, seen[0]))
    lo = clip_pct(min(los), max_pct)[0]
    hi = max(his)
    if ratio is None or hi > max_pct:
        hi = math.inf
    return (lo, hi)


def plan_interval(
    plan: Plan, value: float, *, median: Candidate | None, novel: ResidualWindow, min_samples: int, max_pct: float
) -> tuple[float, float] | None:
    """``value``'s 90 % interval (see :attr:`PredictionResult.interval_pct`); a novel type's: :func:`novel_interval`,
    with the new-job-set interval widened to at least the spread of every slowdown measured here around their
    median (the median's offsets, ``median``'s) as its prior: what was measured of other types bounds nothing
    about this one."""
    offsets = plan.candidate.offsets("new" if plan.regime == "novel" else plan.regime, min_samples)
    if plan.regime == "novel":
        wide = None if median is None else median.offsets("new", min_samples)
        if wide is not None:
            offsets = wide if offsets is None else (min(offsets[0], wide[0]), max(offsets[1], wide[1]))
        return novel_interval(value, offsets, novel, max_pct)
    if offsets is None:
        return None
    lo, hi = clip_pct(value + offsets[0], max_pct)[0], clip_pct(value + offsets[1], max_pct)[0]
    return (min(lo, value), max(hi, value))


def average_name(members: Sequence[Candidate], mode: str | None = None) -> str:
    """The served name of a mean of candidates (``model:category`` of each, best first), as ``aip evaluate`` names an
    average; served in another ``mode`` than the members', prefixed with theirs (as :meth:`CandidateKey.name_in`).

    >>> from models.views import CandidateKey
    >>> class C: key = CandidateKey("placement", "all", "SVR-poly")
    >>> average_name([C()]), average_name([C()], "observed")
    ('Average[SVR-poly:all]', 'placement/Average[SVR-poly:all]')
    """
    name = "Average[" + ",".join(f"{c.key.model}:{c.key.category}" for c in members) + "]"
    src = members[0].key.mode
    return name if mode in (None, src) else f"{src}/{name}"


def average_members(
    plans: Sequence[Plan | None], raw: list[float | None], skip: Collection[int], members_of: Callable[[Plan], Sequence[Candidate]]
) -> dict[int, str]:
    """Each plan that several candidates serve (``members_of(plan)``, the plan's own first; an empty list: its own
    alone) predicted by each of them, its ``raw`` value made their mean (in place; members that do not answer, or
    have no features for it, left out).  Returns those plans' served names (:func:`average_name`), and those of
    the plans in ``skip`` that several candidates would serve (left unpredicted); plans with no value are left as
    they are."""
    names: dict[int, str] = {}
    asked: dict[Any, tuple[Candidate, list[int]]] = {}
    values: dict[int, list[float]] = {}
    for i, plan in enumerate(plans):
        v = raw[i]
        members = [] if plan is None or (v is None and i not in skip) else members_of(plan)
        if len(members) < 2:
            continue
        names[i] = average_name(members, plan.mode)  # type: ignore[union-attr]
        if i in skip:  # not predicted (its composition is served): named alike
            continue
        values[i] = [float(v)]  # type: ignore[arg-type]
        for c in members[1:]:
            asked.setdefault(c.key, (c, []))[1].append(i)
    for cand, idx in asked.values():
        rows = [(i, x) for i in idx if (x := cand.features(plans[i].views))]  # type: ignore[union-attr]
        for (i, _), v in zip(rows, cand.predict_many([x for _, x in rows]) if rows else [], strict=True):
            if v is not None and math.isfinite(v):
                values[i].append(float(v))
    for i, vs in values.items():
        raw[i] = math.fsum(vs) / len(vs)
    return names


def unpredicted(plan: Plan, name: str | None = None) -> PredictionResult:
    """What :func:`models.compose.serve_composed` keeps of a plan whose composition it serves (the value is replaced);
    ``name``: what serves it, if not its choice alone (:func:`average_members`)."""
    err = plan.choice.error
    return PredictionResult(
        math.nan, name or plan.choice.name, plan.choice.category, plan.mode, None if math.isnan(err) else float(err), plan.regime
    )  # fmt: skip

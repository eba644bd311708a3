"""The interface the stream hosts: all models of one environment (GPU model).

The stream calls, per environment:

* ``learn(obs)`` for every labelled observation (``interference_pct`` known);
* ``predict(obs, mode)`` for an observation of a running co-location, in
  ``observed`` mode (percent changes) or ``placement`` mode (solo profiles);
* ``predict_placement(...)`` for what-if questions about a hypothetical job set;
* ``refit_due()``, then ``task = refit_task()`` (a snapshot: a plain function
  the stream runs in an executor), then ``apply_refit(task())`` on the event loop;
* ``leaderboard()`` for the ``models.leaderboard`` record;
* ``to_state(key)`` / ``EnvironmentModels.from_state(state, key)``: everything as one value (estimators as bytes),
  which local persistence (``save(dir)`` / ``EnvironmentModels.load(dir)``) and serving snapshots
  (:mod:`models.snapshot`) both use.

:class:`EnvironmentModels` is a facade over the pieces, each in its module:

* the candidates (:mod:`models.candidates`): online learners (river) and the batch models of the last refit,
  per mode x category, and two baselines, the last measured interference of this exact job set and the
  median of recent measurements (:mod:`models.live`); each holds its estimator and its record;
* the selection (:mod:`models.selector`), test-then-train over the candidates: each labelled observation is
  first predicted by every candidate and only then learned.  Errors are kept per regime, ``seen`` (the job
  and its co-runners, a *slot*, were measured before: the prequential rolling MAE, and per slot,
  exponentially weighted, once the slot has ``jobset_min`` measurements) and ``new`` (a slot never measured:
  batch models and the median are judged by their grouped-CV error, online learners by their prequential
  error on first observations of a slot);
* refits (:mod:`models.refit`), a pure function of the recent history;
* the state (:mod:`models.state`), msgspec Structs: :meth:`EnvironmentModels.to_state` and :meth:`EnvironmentModels.from_state`.

A prediction is served by the candidate with the smallest error of its regime (a job set never measured, in
placement mode: the mean of the best few, or a pair derived from measured job sets of three, :mod:`models.derive`),
says which regime it was in, and is bounded to ``[-100, max_pct]``.  Observed mode's candidates include placement
mode's models (served as ``placement/<model>``): it knows the solo profiles too, so it is never served worse than
placement mode by the error both are judged by.  An ADWIN detector per mode on the served prediction's error
(computed before learning) requests a refit when it fires.

This module never imports kafka or faust.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

from events import MODES, REGIMES, Leaderboard, Observation, ServedModel
from models import persist
from models.candidates import KINDS, Candidate
from models.compose import ComposeScore, PairKey, compose_samples, pair_key, serve_composed
from models.datasets import Sample
from models.derive import ThreeIndex, derive_pairs
from models.drift import ServedErrorDrift
from models.live import LAST_MEASURED, MEDIAN, Measurements, clip_pct
from models.modelconfig import ModelConfig, thinning
from models.prediction import (
    Composition,
    PlacementAsk,
    Plan,
    PredictionResult,
    Served,
    _log_ratio,
    average_members,
    draw,
    observed_features,
    plan_interval,
    profiled,
    sample_of,
    steady_state_interval,
    unpredicted,
)
from models.refit import RefitResult, run_refit
from models.rolling import ResidualWindow
from models.selector import Selector
from models.state import FORMAT, CandidateState, ComposeState, EnvironmentState
from models.views import VIA, CandidateKey, Views

WINDOWS_COUNTED = 8
"""Window ends whose observations :class:`EnvironmentModels` counts (windows of several ends arrive interleaved)."""
STATE_FILE = "state.msgpack"
"""The file :meth:`EnvironmentModels.save` writes in its directory."""

__all__ = ["EnvironmentModels", "PlacementAsk", "PredictionResult", "Served", "draw", "observed_features", "sample_of"]

class EnvironmentModels:
    """The AIP selector of one environment: candidates, prequential scoring, selection, refits, drift, persistence."""

    def __init__(self, environment: str, *, seed: int = 0, config: ModelConfig | None = None) -> None:
        self.environment = environment
        self.seed = seed
        self.config = config or ModelConfig()
        self.observations = 0
        self.last_refit: float | None = None
        self.refit_seconds: float | None = None
        self.refits = 0
        self.clipped = 0
        """Served predictions that were bounded to ``[-100, max_pct]``."""
        self.withheld_novel = 0
        """Predictions not made because a job type of the slot was never measured here (see :meth:`predict`)."""
        self.history: deque[Sample] = deque(maxlen=self.config.history)
        self.generation = 0
        """Moves on whenever learning, scoring or a refit changes what the models serve (see :class:`Served`)."""
        self._tail: tuple[str | None, int] = (None, 0)
        """The job set of the newest sample of :attr:`history` and how many of the newest share it (what
        :meth:`refit_due` asks of the history in O(1): a scan of 10,000 samples' job sets per call was a third of
        stage 2's time, docs/BENCHMARKS.md)."""
        self.selector = Selector(self.config, seed)
        self._since_refit = 0
        self._refit_in_flight = False
        self.drift = ServedErrorDrift()
        self._three = ThreeIndex()  # the measured job sets of three a pair never measured is derived from
        self.compose_scores = {seen: ComposeScore(self.config.min_samples, self.config.compose_margin) for seen in (True, False)}
        """Composed vs served on first observations of job sets of 3+ (:mod:`models.compose`), apart where every
        pair of the job's was measured (True) and where one was not; in the state (:meth:`to_state`)."""
        self.many_residuals = ResidualWindow(self.config.history)
        """Log-ratio residuals ``log((1 + y) / (1 + served))`` of what is served on first observations of job sets of
        3+: the conformal interval of such a what-if, multiplicative like the composition; in the state (:meth:`to_state`)."""
        self.seen_residuals = ResidualWindow(self.config.history)
        """Log-ratio residuals of the last-measured baseline where placement mode served it for a measured job set (a
        window's measurement against the EWM of those before): the steady-state interval of a measured job set's
        what-if (:func:`models.prediction.steady_state_interval`); in the state (:meth:`to_state`)."""
        self.novel_residuals = ResidualWindow(self.config.history)
        """Log-ratio residuals of what placement mode served for observations holding a job type never measured
        before them (each type's first measurements, the ``novel`` regime's only honest test): the conformal interval
        of a novel type's prediction, multiplicative; in the state (:meth:`to_state`)."""
        self.window_counts: dict[float, int] = {}
        """Observations learned per window end, of the last :data:`WINDOWS_COUNTED` windows: how thin the online
        learners' sample is (:meth:`_thinning`); in the state (:meth:`to_state`)."""

    @property
    def measurements(self) -> Measurements:
        """What this environment has measured (slots, job types, the range of the slowdowns)."""
        return self.selector.measurements

    @property
    def candidates(self) -> Mapping[CandidateKey, Candidate]:
        return self.selector.candidates

    @property
    def selection_seconds(self) -> float | None:
        return self.selector.selection_seconds

    # ------------------------------------------------------------------ learning

    def learn(self, obs: Observation, served: Served | None = None) -> None:
        """Test-then-train: every candidate due predicts ``obs``, is scored, then learns it (the online learners on
        their sample, see ``ModelConfig.online_sample``).  No-op when unlabelled.  ``served``: :meth:`serve` of ``obs``,
        whose features and predictions are reused where nothing changed since (the same result, computed once)."""
        if obs.interference_pct is None or not math.isfinite(obs.interference_pct):
            return
        thin = self._thinning(obs.window_start, obs.window_end)
        if served is not None and served.observation_id == obs.observation_id and served.generation == self.generation:
            self._learn(served.views, draw(obs.observation_id), served.raw, thin)
        else:
            self._learn(Views(sample_of(obs)), draw(obs.observation_id), thin=thin)

    def _thinning(self, start: float, end: float) -> int:
        """Count an observation of the window ``[start, end)``; return the thinning of the online learners' sample
        that the window before it calls for (:func:`models.modelconfig.thinning`: 1 unless that window brought more
        than ``online_sample * online_max_per_s`` observations a second)."""
        counts = self.window_counts
        counts[end] = counts.get(end, 0) + 1
        if len(counts) > WINDOWS_COUNTED:
            del counts[min(counts)]
        return thinning(counts.get(start, 0), end - start, self.config)

    def learn_sample(self, sample: Sample, draw: int | None = None) -> None:
        """``draw``: the observation's :func:`draw`, which says whether the online learners take it; None: they
        all take it (the heavy ones on their stride of the observation count)."""
        self._learn(Views(sample), draw)

    def _learn(self, views: Views, draw: int | None, raw: Sequence[PredictionResult | None] | None = None, thin: int = 1) -> None:
        """``raw``: what :meth:`_predict_many` gives for ``views`` in each mode now (None: computed here).  ``thin``
        (:meth:`_thinning`): the served model's drift and residuals are tested on one observation in ``thin`` (by
        ``draw``), the online learners on one in ``online_sample * thin``."""
        sample = views.sample
        y = sample.target
        self.generation += 1
        tested = thin == 1 or draw is None or draw % thin == 0
        # drift: the error of what predict() serves for this sample, before anything learns it
        # (made here: without intervals, which nothing below reads)
        if not tested:
            raw = ()
        elif raw is None:
            raw = self._predict_many([(views, mode) for mode in MODES], intervals=False)
        for served in raw:
            if served is not None and served.mode == "placement" and served.regime == "seen" and served.model == LAST_MEASURED:
                self.seen_residuals.update(_log_ratio(y, served.interference_pct))
            if served is not None and served.mode == "placement" and served.regime == "novel":
                self.novel_residuals.update(_log_ratio(y, served.interference_pct))
            if served is not None and served.mode == "placement" and len(sample.co_job_types) >= 2 and served.regime == "new":
                composed = self._compose([sample], intervals=False)[0]
                final = served.interference_pct
                if composed is not None:
                    score = self.compose_scores[composed[2]]
                    final = composed[0] if score.serve_composed() else final
                    score.update(composed=composed[0], served=served.interference_pct, y=y)
                self.many_residuals.update(_log_ratio(y, final))
            if served is not None:
                self.drift.update(served.mode, abs(served.interference_pct - y))
        self.selector.learn_one(views, y, self.observations, draw, thin)
        self.observations += 1
        self._since_refit += 1
        self._append(sample)

    def _append(self, sample: Sample) -> None:
        self.history.append(sample)
        job_set, run = self._tail
        js = sample.job_set
        self._tail = (js, run + 1 if js == job_set else 1)

    def score_pending(self) -> int:
        """Score the batch candidates on the observations that arrived since the last pass; return how many."""
        self.generation += 1
        return self.selector.score_pending()

    # ------------------------------------------------------------------ serving

    def _plan(self, views: Views, mode: str) -> Plan | None:
        """How ``views`` is served in ``mode``; None: nothing to serve."""
        if self.observations == 0 or mode not in MODES or not views.has(mode):
            return None
        sample = views.sample
        novel = self.measurements.novel((sample.job_type, *sample.co_job_types))
        if novel and not (self.config.predict_novel and mode == "placement" and profiled(sample, self.measurements.types)):
            return None  # a job type never measured here, and no solo profile of it: nothing carries over (docs/MODELS.md)
        choice = self.selector.choice(mode, views.slot)
        if choice is None:
            return None
        regime, chosen = choice
        regime = "novel" if novel else regime  # served by new job sets' choice, and says it is novel
        cand = self.selector.candidate(mode, chosen)
        if mode == VIA and cand.key.mode == VIA and cand.kind != "baseline":
            # its features (placement_features: never empty, n_co is always there) are made only if it predicts
            return Plan(regime, chosen, cand, None, mode, views)
        x = cand.features(views)
        return Plan(regime, chosen, cand, x, mode, views) if x else None

    def _predict_many(self, asks: Sequence[tuple[Views, str]], *, intervals: bool = True) -> list[PredictionResult | None]:
        """Each (views, mode) predicted by the candidate serving it, in one ``predict_many`` per candidate (for a
        batch candidate one matrix and one ``predict``: the what-if entries of a GPU window)."""
        return self._results([self._plan(*ask) for ask in asks], intervals=intervals)

    def _results(
        self, plans: Sequence[Plan | None], composed: Iterable[int] = (), *, intervals: bool = True
    ) -> list[PredictionResult | None]:
        """Each plan's prediction; those in ``composed`` (what-ifs whose composition from pairs is served, by a
        candidate that always answers) are not predicted: :func:`models.prediction.unpredicted` stands for them.  ``intervals``
        False: none (pairs whose composed interval is not used)."""
        skip = set(composed)
        raw: list[float | None] = [None] * len(plans)
        rows: dict[CandidateKey, list[tuple[int, Plan]]] = {}
        for i, plan in enumerate(plans):
            if plan is not None and i not in skip:
                rows.setdefault(plan.candidate.key, []).append((i, plan))
        for items in rows.values():
            preds = items[0][1].candidate.predict_many([p.features() for _, p in items])
            for (i, _), v in zip(items, preds, strict=True):
                raw[i] = v
        sel, lm = self.selector, self.candidates.get(CandidateKey("placement", "all", LAST_MEASURED))  # job sets never measured:
        names = average_members(plans, raw, skip, lambda p: [sel.candidate(p.mode, c) for c in sel.members(p.mode, p.choice, p.regime)])
        if lm is not None and self.compose_scores[True].serve_composed():  # a pair, from job sets of three measured
            names.update(derive_pairs(plans, raw, skip, self._three.of(lm.estimator.slots), lm.estimator.predict_one))
        return [
            None if p is None else unpredicted(p, names.get(i)) if i in skip else None if r is None else self._result(p, r, intervals, names.get(i))
            for i, (p, r) in enumerate(zip(plans, raw, strict=True))
        ]

    def _result(self, plan: Plan, raw: float, interval: bool = True, name: str | None = None) -> PredictionResult:
        m = self.measurements
        value, extrapolated = float(raw), False
        if plan.regime in ("new", "novel") and m.labels and not m.lo <= value <= m.hi:
            # a job set never measured (or with a type never measured), predicted outside every slowdown measured
            # here: extrapolation (a novel type's profile once gave -100 % next to two jobs whose truth was 10^6 %)
            value, extrapolated = min(max(value, m.lo), m.hi), True
        value, clipped = clip_pct(value, self.config.max_pct)
        err = plan.choice.error
        return PredictionResult(
            value, name or plan.choice.name, plan.choice.category, plan.mode, None if math.isnan(err) else float(err),
            plan.regime, clipped or extrapolated, self._interval(plan, value) if interval else None,
        )  # fmt: skip

    def _interval(self, plan: Plan, value: float) -> tuple[float, float] | None:
        median = self.candidates.get(CandidateKey(plan.mode, "all", MEDIAN))
        c = self.config
        return plan_interval(plan, value, median=median, novel=self.novel_residuals, min_samples=c.min_samples, max_pct=c.max_pct)

    def predict_samples(
        self,
        asks: Sequence[tuple[Sample, str]],
        *,
        compose: bool = True,
        what_if: bool = False,
        pairs: Mapping[PairKey, PredictionResult | None] | None = None,
    ) -> list[PredictionResult | None]:
        """Each (sample, mode) as :meth:`predict` answers it; ``compose=False``: a job set of 3+ never measured as the
        serving candidate predicts it, not composed from its pairs (:meth:`_serve_composed`).  ``what_if``: the
        questions of :meth:`predict_placements` (a composed slowdown may pass ``max_pct``).  ``pairs``: a
        :meth:`pair_table` that the placement-mode pairs asked, and the compositions' pairs, come from where it has
        them."""
        samples = [s for s, _ in asks]
        tabled = {} if pairs is None else self._tabled(asks, pairs)
        plans = [None if i in tabled else self._plan(Views(s), mode) for i, (s, mode) in enumerate(asks)]

        def results(served: Collection[int] = ()) -> list[PredictionResult | None]:
            out = self._results(plans, served)
            for i, r in tabled.items():
                out[i] = r
            return out

        if not compose:
            return self._finish(samples, results(), compose=False, what_if=what_if)
        # compositions first: a job set of 3+ whose composition is served needs no prediction of its own
        many = [
            i
            for i, (s, p) in enumerate(zip(samples, plans, strict=True))
            if p is not None and p.regime == "new" and len(s.co_job_types) >= 2
        ]
        # the pairs' composed interval is used only where job sets of 3+ have no interval of their own yet
        pair_intervals = self.many_residuals.offsets() is None
        made = self._compose([samples[i] for i in many], intervals=pair_intervals, pairs=pairs) if many else []
        compositions = dict(zip(many, made, strict=True))
        served = [
            i for i, c in compositions.items()
            if c is not None and self.compose_scores[c[2]].serve_composed() and plans[i] is not None and plans[i].candidate.answers  # type: ignore[union-attr]
        ]  # fmt: skip
        return self._finish(samples, results(served), compose=True, what_if=what_if, compositions=compositions)

    @staticmethod
    def _tabled(
        asks: Sequence[tuple[Sample, str]], pairs: Mapping[PairKey, PredictionResult | None]
    ) -> dict[int, PredictionResult | None]:
        """The asks of :meth:`predict_samples` that ``pairs`` answers (placement-mode pairs in it), by index."""
        out = {}
        for i, (s, mode) in enumerate(asks):
            if mode == "placement" and len(s.co_job_types) == 1:
                key = pair_key(s.job_type, s.co_job_types[0], s.solo, s.co_solos[0])
                if key in pairs:
                    out[i] = pairs[key]
        return out

    def serve(self, obs: Observation) -> Served:
        """:meth:`predict` of ``obs`` in both modes, its features computed once, kept for :meth:`learn`."""
        return self.serve_many([obs])[0]

    def serve_many(self, observations: Sequence[Observation]) -> list[Served]:
        """:meth:`serve` of each observation, with one ``predict_many`` per candidate for all of them (and one for
        the pairs their compositions ask): what each gets is what :meth:`serve` alone gives it, every candidate's
        prediction of a row being the same whatever other rows its call has (``tests/unit/test_serve_many.py``).
        Only for models that learn nothing between the observations (a snapshot served): :meth:`learn` of one would
        change what the next is served."""
        views = [Views(sample_of(o)) for o in observations]
        asks = [(v, mode) for v in views for mode in MODES]
        raw = self._predict_many(asks)
        samples = [v.sample for v, _ in asks]
        results = self._finish(samples, list(raw), compose=True, what_if=False)
        withheld = self._withheld(samples, results)
        n = len(MODES)
        return [
            Served(o.observation_id, self.generation, v, tuple(raw[k : k + n]), dict(zip(MODES, results[k : k + n], strict=True)), sum(withheld[k : k + n]))
            for o, v, k in zip(observations, views, range(0, len(asks), n), strict=True)
        ]  # fmt: skip

    def _withheld(self, samples: Sequence[Sample], results: Sequence[PredictionResult | None]) -> list[bool]:
        """Per result, whether it was withheld because a job type of its sample is novel (none before any
        observation: nothing is served then)."""
        if not self.observations:
            return [False] * len(results)
        return [r is None and self.measurements.novel((s.job_type, *s.co_job_types)) for r, s in zip(results, samples, strict=True)]

    def _finish(
        self,
        samples: Sequence[Sample],
        results: list[PredictionResult | None],
        *,
        compose: bool,
        what_if: bool,
        compositions: Mapping[int, Composition | None] | None = None,
    ) -> list[PredictionResult | None]:
        """:meth:`predict_samples` after :meth:`_results` (``results`` changed in place)."""
        if compose:
            results = self._serve_composed(samples, results, what_if=what_if, compositions=compositions)
        if what_if and any(r is not None and r.regime == "seen" and r.model == LAST_MEASURED for r in results):
            offsets = self.seen_residuals.offsets()  # remembered until it learns more
            results = [None if r is None else steady_state_interval(r, offsets, self.config.max_pct) for r in results]
        self.clipped += sum(1 for r in results if r is not None and r.clipped)
        self.withheld_novel += sum(self._withheld(samples, results))
        return results

    def predict_sample(self, sample: Sample, mode: str, *, compose: bool = True) -> PredictionResult | None:
        return self.predict_samples([(sample, mode)], compose=compose)[0]

    def predict(self, obs: Observation, mode: str) -> PredictionResult | None:
        """The selected model's prediction for ``obs``.  None before any labelled observation, and where the job
        or a co-runner is of a type never measured in this environment (a *novel* type: its solo profile may be
        known, but no candidate has seen it share a GPU; a scheduler ranks such GPUs by load instead)."""
        return self.predict_sample(sample_of(obs), mode)

    def predict_placement(
        self,
        job_type: str,
        job_solo: Mapping[str, float | None],
        co_job_types: Sequence[str],
        co_solos: Sequence[Mapping[str, float | None]],
    ) -> PredictionResult | None:
        """What-if: the slowdown of ``job_type`` if co-located with ``co_job_types``."""
        return self.predict_placements([(job_type, job_solo, co_job_types, co_solos)])[0]

    def predict_placements(
        self, asks: Sequence[PlacementAsk], *, pairs: Mapping[PairKey, PredictionResult | None] | None = None
    ) -> list[PredictionResult | None]:
        """:meth:`predict_placement` of each (job type, solo profile, co-runners' types, their solo profiles), in
        one ``predict`` per batch candidate; ``pairs``: see :meth:`predict_samples`."""
        samples = [
            Sample(jt, tuple(co), math.nan, "", self.environment, {}, solo, tuple(co_solos))
            for jt, solo, co, co_solos in asks
        ]  # fmt: skip
        return self.predict_samples([(s, "placement") for s in samples], what_if=True, pairs=pairs)

    def pair_table(self, profiles: Mapping[str, Mapping[str, float | None]]) -> dict[PairKey, PredictionResult | None]:
        """Every pair of ``profiles``' job types (each next to each, itself included) predicted as the compositions
        of :meth:`predict_samples` predict their pairs, with intervals, in one :meth:`_predict_many` in sorted
        order: each pair of a state of the models is predicted once (and as it would be alone: a served row never
        depends on the rows asked with it, :attr:`models.zoo.scikit.Spec.served`)."""
        types = sorted(profiles)
        keys = [pair_key(a, b, profiles[a], profiles[b]) for a in types for b in types]
        asks = [
            (Views(Sample(a, (b,), math.nan, "", self.environment, {}, dict(profiles[a]), (dict(profiles[b]),))), "placement")
            for a in types for b in types
        ]  # fmt: skip
        return dict(zip(keys, self._predict_many(asks), strict=True))

    def _compose(
        self,
        samples: Sequence[Sample],
        *,
        intervals: bool = True,
        pairs: Mapping[PairKey, PredictionResult | None] | None = None,
    ) -> list[Composition | None]:
        """:func:`models.compose.compose_samples` of ``samples`` by the candidates serving their pairs."""
        return compose_samples(
            samples, lambda asks, iv: self._predict_many(asks, intervals=iv), self.config.max_pct, intervals=intervals, pairs=pairs
        )  # fmt: skip

    def _serve_composed(
        self,
        samples: Sequence[Sample],
        results: list[PredictionResult | None],
        *,
        what_if: bool,
        compositions: Mapping[int, Composition | None] | None = None,
    ) -> list[PredictionResult | None]:
        """:func:`models.compose.serve_composed` with this environment's scores, residuals and bound."""
        return serve_composed(
            samples, results, compose=lambda s, iv: self._compose(s, intervals=iv), scores=self.compose_scores,
            residuals=self.many_residuals, max_pct=self.config.max_pct, what_if=what_if, compositions=compositions,
        )  # fmt: skip

    # ------------------------------------------------------------------ refits

    @property
    def refit_in_flight(self) -> bool:
        """A refit task was taken (:meth:`refit_task`) and its result not yet applied."""
        return self._refit_in_flight

    def refit_due(self) -> bool:
        if self._refit_in_flight or len(self.history) < self.config.refit_min_rows:
            return False
        if not (self.drift.detected or self.last_refit is None or self._since_refit >= self.config.refit_every):
            return False
        # two job sets or more among the last refit_rows samples: the newest ones sharing one are fewer than those
        return self._tail[1] < min(len(self.history), self.config.refit_rows)

    def refit_task(self) -> Callable[[], RefitResult]:
        """A snapshot of the recent history; the returned function touches no live state."""
        rows = list(self.history)[-self.config.refit_rows :]
        config, seed = self.config, self.seed
        self._refit_in_flight = True
        return lambda: run_refit(rows, config, seed)

    def apply_refit(self, result: RefitResult | None) -> None:
        self._refit_in_flight = False
        self.generation += 1
        if result is None:
            return
        self.selector.apply(result)
        self.last_refit, self.refit_seconds, self.refits, self._since_refit = result.finished_at, result.seconds, self.refits + 1, 0
        self.drift.reset()

    def refit_now(self) -> RefitResult:
        """Refit synchronously (offline use and tests)."""
        result = self.refit_task()()
        self.apply_refit(result)
        return result

    # ------------------------------------------------------------------ reporting

    def served(self) -> list[ServedModel]:
        """What each mode serves, per regime, with the error it is judged by."""
        return self.selector.served_models()

    def selected(self) -> dict[str, str]:
        """``"<mode>:<category>"`` -> the candidate with the smallest error on measured job sets."""
        return self.selector.selected_names()

    def leaderboard(self) -> Leaderboard:
        return Leaderboard(
            ts=time.time(), environment=self.environment, entries=self.selector.leaderboard_entries(),
            selected=self.selected(), observations=self.observations, last_refit=self.last_refit,
            selection_seconds=self.selection_seconds, served=self.served(),
        )  # fmt: skip

    # ------------------------------------------------------------------ state

    def to_state(self, key: bytes, *, serving: bool = False) -> EnvironmentState:
        """Everything as one value, estimators as bytes (river's pickles signed with ``key``): what
        :meth:`from_state` reads back.  ``serving``: only what serving needs (the candidates a prediction or what-if
        can be served by now, :meth:`models.selector.Selector.served_keys`; no history), a snapshot's."""
        self.score_pending()  # what the batch candidates were judged on so far
        sel = self.selector
        keep = sel.served_keys() if serving else None
        candidates = [
            CandidateState((c.key.mode, c.key.category, c.key.model), c.kind, c.record.state(), c.estimator_state(key))
            for c in sel.candidates.values()
            if keep is None or c.key in keep
        ]  # fmt: skip
        history = [] if serving else list(self.history)[-self.config.refit_rows :]
        compose = {str(seen).lower(): ComposeState(s.n, float(s.composed_abs), float(s.served_abs)) for seen, s in self.compose_scores.items()}
        return EnvironmentState(
            FORMAT, self.environment, self.seed, self.config, self.observations, self.last_refit, self.refit_seconds,
            self.refits, 0 if serving else self._since_refit, self.clipped, self.measurements.state(), sorted(sel.own_slots),
            candidates, history, compose, list(self.many_residuals.values), list(self.seen_residuals.values),
            list(self.novel_residuals.values), serving, [] if serving else sorted(self.window_counts.items()),
        )  # fmt: skip

    @classmethod
    def from_state(cls, state: EnvironmentState, key: bytes) -> EnvironmentModels:
        """The models :meth:`to_state` made: they predict exactly what those did; a serving state holds only its
        candidates.  Raises :class:`models.persist.SignatureError` for river learners not signed with ``key``, and
        ``ValueError`` on a state of another format."""
        if state.format != FORMAT:
            raise ValueError(f"state format {state.format}, not {FORMAT}")
        self = cls(state.environment, seed=state.seed, config=state.config)
        self.observations, self.last_refit, self.refit_seconds = state.observations, state.last_refit, state.refit_seconds
        self.refits, self._since_refit, self.clipped = state.refits, state.since_refit, state.clipped
        sel = self.selector
        sel.measurements = Measurements.restore(state.measurements)
        sel.own_slots = set(state.own_slots)
        if state.serving:
            sel.candidates = {}
        for cs in state.candidates:
            kind = KINDS[cs.kind]
            ck = CandidateKey(*cs.key)
            estimator = kind.estimator_of(cs.estimator, key, self.config)
            c = sel.candidates.get(ck)
            if c is None:
                c = sel.candidates[ck] = kind(ck, estimator, self.config, cs.record)
            else:  # made by its kind's starting(): keeps its place (the heavy learners' stagger)
                c.estimator, c.record = estimator, type(c.record)(self.config, cs.record)
        for sample in state.history:
            self._append(sample)
        for c in sel.candidates.values():
            c.link(sel.candidates, refit=False)
        sel.changed()
        sel.stale.update(REGIMES)
        sel.select()
        for seen, cs in state.compose.items():
            score = self.compose_scores[seen == "true"]
            score.n, score.composed_abs, score.served_abs = cs.n, cs.composed_abs, cs.served_abs
        window = self.config.history
        self.many_residuals = ResidualWindow(window, state.many_residuals)
        self.seen_residuals = ResidualWindow(window, state.seen_residuals)
        self.novel_residuals = ResidualWindow(window, state.novel_residuals)
        self.window_counts = dict(state.window_counts)
        return self

    def save(self, directory: Path, *, key_dir: Path | None = None) -> None:
        """:meth:`to_state` to ``directory`` (:func:`models.persist.write_state`); river learners are signed with the
        key in ``key_dir`` (default: ``directory``'s parent, the state directory)."""
        directory = Path(directory)
        key = persist.state_key(Path(key_dir) if key_dir else directory.parent)
        persist.write_state(directory / STATE_FILE, self.to_state(key))

    @classmethod
    def load(cls, directory: Path, *, key_dir: Path | None = None) -> EnvironmentModels:
        """Resume from :meth:`save`; raises :class:`models.persist.SignatureError` on learners this state dir did not
        sign, and ``msgspec.ValidationError`` or ``ValueError`` on a state of another format."""
        directory = Path(directory)
        key = persist.state_key(Path(key_dir) if key_dir else directory.parent)
        return cls.from_state(persist.read_state(directory / STATE_FILE, EnvironmentState), key)

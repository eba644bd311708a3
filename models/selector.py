"""The AIP selection over candidates, test-then-train, in the shape of river's ``model_selection.GreedyRegressor``.

Each candidate (:class:`models.candidates.Candidate`) carries its own record; :meth:`Selector.learn_one` first
tests every candidate due on the observation (its prediction before learning, scored into its record in the
observation's regime), and only then trains them.  Batch candidates, which do not learn between refits, are
tested later in one vectorised pass (:meth:`Selector.score_pending`): the same errors, computed cheaper.

Errors are kept per regime: ``seen`` (the slot, job and co-runners, was measured before) and ``new``.
:meth:`Selector.best` is the candidate with the smallest error of its regime (``best_model``); a slot with
``jobset_min`` measurements has its own (:meth:`Selector.choice`).

No Kafka, no faust.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from events import CATEGORIES, MODES, REGIMES, LeaderboardEntry, ServedModel
from models.candidates import KINDS, BatchCandidate, Candidate
from models.live import LAST_MEASURED, MEDIAN, SLOWDOWN_MIN_PCT, Measurements, clip_pct
from models.modelconfig import ModelConfig
from models.refit import RefitResult
from models.rolling import Ewm
from models.views import VIA, CandidateKey, Views

FALLBACK = {"seen": LAST_MEASURED, "new": MEDIAN}
"""What a regime serves before any candidate has enough evidence in it (the median only once anything is measured)."""


class Choice(NamedTuple):
    """A selection: the error it is judged by, and the candidate's category and served name."""

    error: float
    category: str
    name: str


@dataclass
class Deferred:
    """A labelled observation waiting for the :attr:`Candidate.deferred <models.candidates.Candidate.deferred>`
    candidates' test then training."""

    views: Views
    target: float
    regime: str | None
    """None: learned, not scored (see :meth:`Selector.learn_one`)."""
    slot: str | None
    n: int
    """Its number (what :meth:`Candidate.due <models.candidates.Candidate.due>` takes)."""


@dataclass
class Pending:
    """A labelled observation waiting for the batch candidates' vectorised test."""

    views: Views
    target: float
    regime: str
    slot: str | None
    """Its slot where the slot keeps its own errors."""


def _best_k(judged: Iterable[tuple[CandidateKey, bool, float]], mode: str, k: int) -> list[Choice]:
    """The ``k`` smallest :class:`Choice` of ``mode`` over ``judged`` (:func:`_best_of`'s rule: its first is
    :func:`_best_of`'s).

    >>> judged = [(CandidateKey("placement", "all", m), False, e) for m, e in (("a", 3.0), ("b", 1.0), ("c", 2.0))]
    >>> [c.name for c in _best_k(judged, "placement", 2)]
    ['b', 'c']
    """
    via = mode == "observed"
    return sorted(
        Choice(e, key.category, key.name_in(mode)) for key, lends, e in judged if key.mode == mode or (via and key.mode == VIA and lends)
    )[:k]


def _best_of(judged: list[tuple[CandidateKey, bool, float]], mode: str) -> Choice | None:
    """:meth:`Selector.best` (``wider``, every category) over ``judged``: (key, lends, error) of the candidates that
    can serve and have an error, in any order (no two candidates make the same :class:`Choice` in a mode, so the
    smallest is one whatever the order)."""
    best: Choice | None = None
    via = mode == "observed"
    for k, lends, e in judged:
        if k.mode != mode and not (via and k.mode == VIA and lends):
            continue
        if best is None or e <= best.error:
            choice = Choice(e, k.category, k.name_in(mode))
            if best is None or choice < best:
                best = choice
    return best


class Selector:
    """The candidates of one environment, their test-then-train scoring, and the selection among them."""

    def __init__(self, config: ModelConfig, seed: int) -> None:
        self.config = config
        self.candidates: dict[CandidateKey, Candidate] = {}
        for kind in KINDS.values():
            for c in kind.starting(config, seed):
                self.candidates[c.key] = c
        self.measurements = Measurements()
        self.own_slots: set[str] = set()
        """Slots that keep their own errors (the first ``max_jobsets`` measured twice)."""
        self.scored_in: dict[str, list[Candidate]] = {}
        """Per slot with its own errors, the candidates scored there (what :meth:`choice` weighs)."""
        self.pending: list[Pending] = []
        self.deferred: list[Deferred] = []
        self.job_sets: set[tuple[str, ...]] = set()
        """Job sets (the sorted types of a slot's job and co-runners) measured since this selector started (not
        saved): a new slot of one of these is the same job set's other role, scored in neither regime."""
        self.selected: dict[str, dict[str, Choice]] = {regime: {} for regime in REGIMES}
        self.stale = set(REGIMES)
        """Regimes whose errors changed since their last selection (``new`` changes rarely: first observations
        of a slot and refits)."""
        self.selection_seconds: float | None = None
        self._members: list[Choice] = []
        """Placement mode's ``new_members`` best candidates on new job sets, as of the last selection (:meth:`members`)."""
        self._lent: list[Choice] = []
        """The same, as observed mode serves them (when each lends itself to observed mode)."""
        self._judged: dict[str, dict[CandidateKey, tuple[CandidateKey, bool, float]] | None] = {r: None for r in REGIMES}
        """Per regime, (key, lends, error) of each servable candidate with an error, as of the last selection (None:
        to be made afresh): a selection weighs again only the candidates scored since (:attr:`_scored`)."""
        self._scored: dict[str, set[CandidateKey]] = {r: set() for r in REGIMES}
        self.changed()

    def changed(self) -> None:
        """The candidates, their estimators or their records changed other than by scoring (a refit, a load):
        which are tested when, and every error is weighed afresh at the next selection."""
        self._immediate = [c for c in self.candidates.values() if not c.batched and not c.deferred]
        self._deferred = [c for c in self.candidates.values() if c.deferred]
        self._offline = [c for c in self._immediate if c.kind != "online"]
        sampled = self.config.batch_sampled and self.config.online_sample > 1
        self._pending_max = max(1, self.config.score_batch_every // (self.config.online_sample if sampled else 1))
        """Pending rows per batch pass: ``score_batch_every`` observations' worth (a sample of them, when the batch
        candidates are tested on the sample), so their errors are as up to date as before."""
        for c in self._deferred:
            c.waiting = self.settle
        self._batched = [c for c in self.candidates.values() if c.batched and c.servable]
        self.scored_in = {}
        for c in self.candidates.values():
            for key in c.record.slots:
                self.scored_in.setdefault(key, []).append(c)
        self._judged = {r: None for r in REGIMES}

    # ------------------------------------------------------------------ test-then-train

    def _own_slot(self, key: str) -> str | None:
        if key not in self.own_slots and len(self.own_slots) < self.config.max_jobsets:
            self.own_slots.add(key)
        return key if key in self.own_slots else None

    def _score(self, c: Candidate, pred: float | None, y: float, regime: str, own: str | None) -> None:
        if pred is not None:
            if own is not None and own not in c.record.slots:
                self.scored_in.setdefault(own, []).append(c)
            c.score(y - clip_pct(pred, self.config.max_pct)[0], regime, own)
            self.stale.add(regime)
            self._scored[regime].add(c.key)

    def _score_rows(self, c: Candidate, preds: list[float], rows: list[Pending]) -> None:
        """:meth:`_score` of each prediction of its pending row, in order: the same updates (:meth:`Candidate.score
        <models.candidates.Candidate.score>`'s where the kind keeps it), each lookup made once per candidate."""
        if type(c).score is not Candidate.score:
            for pred, p in zip(preds, rows, strict=True):
                self._score(c, pred, p.target, p.regime, p.slot)
            return
        max_pct = self.config.max_pct
        record = c.record
        errors, residuals, slots, alpha = record.errors, record.residuals, record.slots, record.alpha
        regimes = set()
        for pred, p in zip(preds, rows, strict=True):
            residual = p.target - (pred if SLOWDOWN_MIN_PCT <= pred <= max_pct else clip_pct(pred, max_pct)[0])
            error = abs(residual)
            errors[p.regime].update(error)
            residuals[p.regime].update(residual)
            if p.slot is not None:
                e = slots.get(p.slot)
                if e is None:
                    self.scored_in.setdefault(p.slot, []).append(c)
                    e = slots[p.slot] = Ewm(alpha)
                e.update(error)
            regimes.add(p.regime)
        for regime in regimes:
            self.stale.add(regime)
            self._scored[regime].add(c.key)

    def learn_one(self, views: Views, y: float, n: int, draw: int | None = None, thin: int = 1) -> None:
        """Test every candidate due on the ``n``-th observation, then train them; the batch ones are tested later.

        ``draw`` (:func:`models.environment.draw`): the online learners are due where ``draw % online_sample`` is 0,
        each on its stride of ``draw // online_sample``, and the batch candidates are tested there (the same rows;
        ``ModelConfig.batch_sampled``); None: all of them, on their stride of ``n``, and the batch candidates on every
        observation.  The baselines are tested and trained on every one, the deferred candidates (the newcomer) on
        every one too unless the fleet thins the sample: then on one in ``thin`` (the served model's drift sample),
        and on every one of a slot measured fewer than ``ModelConfig.newcomer_full_below`` times.
        ``thin``: the sample is one in ``online_sample * thin`` (:func:`models.modelconfig.thinning`)."""
        key = views.slot
        measured = self.measurements.measured(key)
        seen = measured > 0
        job_set = tuple(sorted((views.sample.job_type, *views.sample.co_job_types)))
        regime: str | None
        regime, own = ("seen", self._own_slot(key)) if seen else ("new", None)
        if not seen and job_set in self.job_sets:
            # a slot never measured, of a job set measured: its other role, usually of the same window.  Online
            # learners have just learned that role; scored as ``new`` they would be judged on a question a
            # what-if of a job set never measured never asks (there every role is unmeasured), and beat the batch
            # models' grouped-CV error with an error they do not have there.
            regime = None
        if draw is None:
            online = True
            due = [c for c in self._immediate if c.due(n)]
        else:
            sample = max(1, self.config.online_sample) * thin
            online, m = draw % sample == 0, draw // sample
            # in the candidates' order (the online learners are not asked off their sample)
            due = [c for c in self._immediate if (c.due(m) if c.kind == "online" else c.due(n))] if online else [
                c for c in self._offline if c.due(n)
            ]
        for c in due:
            x = c.features(views)
            if regime is not None and x and c.ready():
                self._score(c, c.predict_one(x), y, regime, own)
        for c in due:
            c.learn(views, y)
        self.measurements.update(key, y, (views.sample.job_type, *views.sample.co_job_types))
        self.job_sets.add(job_set)
        if self._deferred and (thin == 1 or draw is None or draw % thin == 0 or measured < self.config.newcomer_full_below):
            self.deferred.append(Deferred(views, y, regime, own, n))
        if self._batched and regime is not None and (online or not self.config.batch_sampled):
            self.pending.append(Pending(views, y, regime, own))
        if len(self.deferred) >= self.config.score_batch_every:
            self.settle()
        if len(self.pending) >= self._pending_max:
            self.score_pending()
        self.select()

    def settle(self) -> int:
        """Test then train the deferred candidates on the observations learned since the last pass, in their order;
        return how many observations waited.  Called by a deferred candidate before it predicts anything
        (:attr:`Candidate.waiting <models.candidates.Candidate.waiting>`), with every batch pass, and so at refits
        and saves."""
        if not self.deferred:
            return 0
        rows, self.deferred = self.deferred, []
        for c in self._deferred:
            due = [r for r in rows if c.due(r.n)]
            preds = c.test_then_learn([(r.views, r.target, r.regime is not None) for r in due])
            for r, pred in zip(due, preds, strict=True):
                if r.regime is not None:
                    self._score(c, pred, r.target, r.regime, r.slot)
        return len(rows)

    def score_pending(self) -> int:
        """Test the batch candidates on the observations that arrived since the last pass (and the deferred
        candidates, :meth:`settle`); return how many the batch candidates were tested on.

        Batch models do not learn between refits, so predicting an observation now gives what it would
        have given on arrival: the prequential error, in one vectorised call per candidate."""
        import pandas as pd
        import sklearn

        self.settle()
        pending, self.pending = self.pending, []
        batch = self._batched
        if not pending or not batch:
            return 0
        for mode in MODES:
            rows = [i for i, p in enumerate(pending) if p.views.full(mode)]
            if not rows:
                continue
            frame = pd.DataFrame([pending[i].views.full(mode) for i in rows])
            # one array for every candidate of the mode: each takes its columns from it (a reindex of the frame
            # per candidate was most of this pass)
            union = frame.to_numpy(dtype=float, na_value=np.nan)
            where = {str(col): j for j, col in enumerate(frame.columns)}
            uses: dict[str, list[int]] = {}  # per category, the rows with its features (a batch model's features)
            for c in batch:
                if c.key.mode != mode:
                    continue
                if type(c).features is Candidate.features:
                    use = uses.get(c.key.category)
                    if use is None:
                        use = uses[c.key.category] = [j for j, i in enumerate(rows) if pending[i].views.get(mode, c.key.category)]
                else:
                    use = [j for j, i in enumerate(rows) if c.features(pending[i].views)]
                if not use:
                    continue
                # the rows are filled and finite (select_columns): scikit-learn's checks are skipped, as serving's are
                with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
                    preds = c.predict_matrix(union[use] if len(use) < len(rows) else union, where).tolist()
                self._score_rows(c, preds, [pending[rows[j]] for j in use])
        self.select()
        return len(pending)

    # ------------------------------------------------------------------ refits

    def apply(self, result: RefitResult) -> None:
        """The refit's batch candidates replace the last ones (records kept by key), with its CV scores and offsets."""
        self.score_pending()  # what arrived during the refit is scored by the models it was predicted with
        for key in result.candidates:
            if key not in self.candidates:
                self.candidates[key] = BatchCandidate(key, None, self.config)
        for c in self.candidates.values():
            r = result.candidates.get(c.key)
            c.record.cv, c.record.offsets = (r.cv, r.offsets) if r is not None else (None, None)
            if c.batched:
                c.estimator = None if r is None else r.model
        for c in self.candidates.values():
            c.link(self.candidates, refit=True)
        self.changed()  # every error weighed afresh
        self.stale.update(REGIMES)  # other candidates, other CV errors
        self.select()

    # ------------------------------------------------------------------ selection

    def best(self, regime: str, mode: str, category: str | None = None, *, wider: bool = False) -> Choice | None:
        """The candidate with the smallest error of ``mode``'s in ``regime`` (``best_model``).  ``wider``: observed
        mode also weighs placement mode's models (named ``placement/<model>``): the solo profiles are part of what
        it knows about a running co-location, so what it serves is never judged worse than placement's."""
        best: Choice | None = None
        via = wider and mode == "observed"
        min_samples = self.config.min_samples
        for c in self.candidates.values():
            k = c.key
            if (k.mode != mode and not (via and k.mode == VIA and c.lends)) or not c.servable:
                continue
            if category is not None and k.category != category:
                continue
            e = c.error(regime, min_samples)
            if e is not None and (best is None or e <= best.error):
                choice = Choice(e, k.category, k.name_in(mode))
                if best is None or choice < best:
                    best = choice
        return best

    def select(self) -> None:
        """Per stale regime and mode, the best candidate."""
        t0 = time.perf_counter()
        for regime in REGIMES:
            if regime not in self.stale:
                continue
            self.stale.discard(regime)
            for mode, best in self.best_per_mode(regime).items():
                if best is not None:
                    self.selected[regime][mode] = best
                else:
                    self.selected[regime].pop(mode, None)
            if regime == "new":
                judged = self._judged["new"]
                k = self.config.new_members
                self._members = _best_k(judged.values(), VIA, k) if judged and k > 1 else []
                chosen = {(c.category, c.name) for c in self._members}
                lend = all(lends for key, lends, _ in judged.values() if key.mode == VIA and (key.category, key.model) in chosen)
                self._lent = [Choice(c.error, c.category, f"{VIA}/{c.name}") for c in self._members] if lend else []
        self.selection_seconds = time.perf_counter() - t0

    def best_per_mode(self, regime: str) -> dict[str, Choice | None]:
        """Per mode, :meth:`best` of ``regime`` (``wider``), each candidate's error computed once for both modes
        (placement mode's models are weighed in observed mode too), and only for the candidates scored in ``regime``
        since the last selection (every one after :meth:`changed`): the others' errors have not moved."""
        min_samples = self.config.min_samples
        judged = self._judged[regime]
        scored, self._scored[regime] = self._scored[regime], set()
        if judged is None:
            judged = self._judged[regime] = {
                c.key: (c.key, c.lends, e)
                for c in self.candidates.values()
                if c.servable and (e := c.error(regime, min_samples)) is not None
            }
        else:
            for key in scored:
                c = self.candidates[key]
                e = c.error(regime, min_samples) if c.servable else None
                if e is None:
                    judged.pop(key, None)
                else:
                    judged[key] = (key, c.lends, e)
        values = list(judged.values())
        return {mode: _best_of(values, mode) for mode in MODES}

    def choice(self, mode: str, key: str) -> tuple[str, Choice] | None:
        """(regime, choice) serving slot ``key`` (a :func:`models.live.slot`) in ``mode``."""
        measured = self.measurements.measured(key)
        if measured == 0:
            choice = self.selected["new"].get(mode)
            if choice is None and self.measurements.labels:  # nothing judged on new job sets yet
                choice = Choice(math.nan, "all", FALLBACK["new"])
            return None if choice is None else ("new", choice)
        if measured >= self.config.jobset_min:
            best: Choice | None = None
            via, min_samples = mode == "observed", self.config.min_samples
            for c in self.scored_in.get(key, ()):
                e = c.record.slots[key]
                if e.n < min_samples or not c.servable:
                    continue
                k = c.key
                if k.mode == mode or (via and k.mode == VIA and c.lends):
                    own = Choice(e.get(), k.category, k.name_in(mode))
                    if best is None or own < best:
                        best = own
            if best is not None:
                return "seen", best
        return "seen", self.selected["seen"].get(mode) or Choice(math.nan, "all", FALLBACK["seen"])

    def members(self, mode: str, choice: Choice, regime: str) -> list[Choice]:
        """The candidates whose mean serves what ``choice`` serves in ``mode`` and ``regime``: for a job set never
        measured (``new``), placement mode's ``new_members`` best on new job sets when ``choice`` is the best of them
        (in observed mode too, when it serves placement's best); else none (``choice`` alone)."""
        m = self._members if mode == VIA else self._lent
        return m if regime == "new" and len(m) > 1 and m[0] == choice else []

    def candidate(self, mode: str, choice: Choice) -> Candidate:
        """The candidate ``choice`` names in ``mode``."""
        src, _, model = choice.name.rpartition("/")
        return self.candidates[CandidateKey(src or mode, choice.category, model)]

    def served_models(self) -> list[ServedModel]:
        """What each mode serves, per regime, with the error it is judged by."""
        out = []
        for regime, by_mode in self.selected.items():
            for mode in MODES:
                c = by_mode.get(mode)
                if c is not None:
                    out.append(ServedModel(mode=mode, regime=regime, model=c.name, category=c.category, error_pct=c.error))
        return out

    def selected_names(self) -> dict[str, str]:
        """``"<mode>:<category>"`` -> the candidate with the smallest error on measured job sets."""
        out = {}
        for mode in MODES:
            for cat in CATEGORIES:
                b = self.best("seen", mode, cat)
                if b is not None:
                    out[f"{mode}:{cat}"] = b.name
        return out

    def served_keys(self) -> set[CandidateKey]:
        """The candidates a prediction or what-if can be served by, now: the selection of each regime and mode, each
        slot's own choice, the baselines (the fallbacks, the novel interval's median) and the feature model a served
        candidate builds on (its estimator's ``base_key``)."""
        keys = {k for k, c in self.candidates.items() if c.kind == "baseline"}
        for mode in MODES:
            for regime in REGIMES:
                choice = self.selected[regime].get(mode)
                if choice is not None:
                    keys.add(self.candidate(mode, choice).key)
                    keys.update(self.candidate(mode, c).key for c in self.members(mode, choice, regime))
            for slot in self.scored_in:
                picked = self.choice(mode, slot)
                if picked is not None:
                    keys.add(self.candidate(mode, picked[1]).key)
        for k in list(keys):
            base = getattr(self.candidates[k].estimator, "base_key", None)
            if base is not None:
                keys.add(base)
        return {k for k in keys if k in self.candidates}

    def leaderboard_entries(self) -> list[LeaderboardEntry]:
        """Every listed candidate's errors, as the ``models.leaderboard`` record holds them."""
        entries = []
        for key in sorted(k for k, c in self.candidates.items() if c.listed):
            c = self.candidates[key]
            seen, new, cv = c.record.errors["seen"], c.record.errors["new"], c.record.cv
            entries.append(
                LeaderboardEntry(
                    model=key.model, category=key.category, mode=key.mode, kind=c.board_kind or c.kind,
                    samples=seen.n, mae=seen.get(),
                    relative_error=cv.relative_error if cv else None,
                    cv_mae=cv.mae if cv else None, cv_samples=cv.rows if cv else None,
                    new_mae=new.get(), new_samples=new.n if new.n else None,
                )
            )  # fmt: skip
        return entries

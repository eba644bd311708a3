"""The candidates of the live selection: one object per (mode, category, model), whatever its kind.

A :class:`Candidate` holds its estimator (what serving needs) apart from its record (what learning keeps to
judge it: per regime its prequential errors and residuals, per slot its exponentially weighted error, the
last refit's CV score and conformal offsets).  The kinds differ only in what their estimator takes and when
it learns:

* :class:`OnlineCandidate`: a river learner on the mode x category's features, tested then trained on every
  observation (the heavy ones on a stride);
* :class:`BatchCandidate`: a model of the last refit, which learns only at refits; it is tested in one
  vectorised pass over the observations of a while (:attr:`Candidate.batched`);
* :class:`BaselineCandidate`: :class:`models.live.LastMeasured` or :class:`models.rolling.RollingMedian`, on
  the slot rather than on features;
* :class:`NewcomerCandidate`: a batch model of the last refit (placement mode) plus :class:`models.newcomer.Newcomer`
  learning its residuals online: what was measured of a job type, as the job and as a co-runner, carried to its
  job sets never measured.

A new kind is one subclass and one entry in :data:`KINDS`.

No Kafka, no faust.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import msgspec
import numpy as np

from events import CATEGORIES, MODES, REGIMES
from models.live import BASELINES, LAST_MEASURED, MEDIAN, LastMeasured, LastMeasuredState
from models.modelconfig import ModelConfig
from models.newcomer import Newcomer, NewcomerEstimator
from models.newcomer import dump as newcomer_dump
from models.newcomer import load as newcomer_load
from models.rolling import Ewm, EwmState, MeanState, ResidualWindow, RollingMean, RollingMedian, RollingMedianState
from models.views import VIA, CandidateKey, Views
from models.zoo import HEAVY_ONLINE, batch_from_state, make_online
from models.zoo.online import RiverModel, RiverState
from models.zoo.scikit import SklearnState
from models.zoo.torchmlp import MlpState


class CvScore(msgspec.Struct, frozen=True, array_like=True):
    """A candidate's grouped-CV score at the last refit."""

    mae: float | None
    """None: not finite (the model failed on a fold)."""
    relative_error: float | None
    rows: int



class RecordState(msgspec.Struct):
    errors: dict[str, MeanState] = {}
    residuals: dict[str, list[float]] = {}
    slots: dict[str, EwmState] = {}
    cv: CvScore | None = None
    offsets: tuple[float, float] | None = None


class Record:
    """How a candidate has done: what the selection judges it by (learning's bookkeeping, not serving's)."""

    __slots__ = ("alpha", "cv", "errors", "offsets", "residuals", "slots")

    def __init__(self, config: ModelConfig, state: RecordState | None = None) -> None:
        s = state or RecordState()
        w = config.window
        self.errors = {r: RollingMean(w, s.errors.get(r)) for r in REGIMES}
        """Per regime, the rolling mean absolute prequential error."""
        self.residuals = {r: ResidualWindow(w, s.residuals.get(r, ())) for r in REGIMES}
        """Per regime, the last ``window`` prequential residuals (the candidate's online interval)."""
        self.alpha = 2.0 / (config.jobset_window + 1.0)
        self.slots: dict[str, Ewm] = {k: Ewm(self.alpha, e) for k, e in s.slots.items()}
        """Per slot with its own selection, the exponentially weighted error."""
        self.cv: CvScore | None = s.cv
        """Grouped-CV score at the last refit (batch models and the median)."""
        self.offsets: tuple[float, float] | None = s.offsets
        """Conformal 90 % offsets from the last refit's out-of-fold residuals."""

    def state(self) -> RecordState:
        return RecordState(
            {r: m.state() for r, m in self.errors.items() if m.n},
            {r: list(w.values) for r, w in self.residuals.items() if w.n},
            {k: e.state() for k, e in self.slots.items()},
            self.cv, self.offsets,
        )  # fmt: skip


class Candidate:
    """A candidate of the selection: key, estimator, and its :class:`Record`."""

    kind: ClassVar[str]
    board_kind: ClassVar[str | None] = None
    """Its kind on the leaderboard record (:data:`events.MODEL_KINDS`) where that is not :attr:`kind`."""
    batched: ClassVar[bool] = False
    """Tested in one vectorised pass over pending observations (it does not learn between refits)."""
    lends: ClassVar[bool] = True
    """Offered to observed mode from placement mode (``placement/<model>``): a model of the solo profiles. The
    baselines are not: they do not read the mode's features, so observed mode has the same ones."""
    deferred: ClassVar[bool] = False
    """Tested then trained later, on the observations of a while in their order (:meth:`test_then_learn`, with the
    batch candidates' pass, and before it predicts anything): its estimator depends only on what it learned, so it
    learns, predicts and is scored as on arrival, and the dear part of many observations is computed at once."""

    __slots__ = ("estimator", "key", "phase", "record", "stride", "waiting")

    def __init__(self, key: CandidateKey, estimator: Any, config: ModelConfig, record: RecordState | None = None) -> None:
        self.key = key
        self.estimator = estimator
        self.record = Record(config, record)
        self.stride, self.phase = 1, 0
        self.waiting: Callable[[], Any] | None = None
        """A :attr:`deferred` kind's: what tests then trains it on the observations waiting for it (its selector's
        :meth:`models.selector.Selector.settle`), called before it predicts anything."""

    @property
    def servable(self) -> bool:
        return self.estimator is not None

    @property
    def answers(self) -> bool:
        """Its predictions are never None (a baseline's may be: a slot it does not know)."""
        return self.servable

    @property
    def listed(self) -> bool:
        """On the leaderboard: it can serve, or was scored by the last refit."""
        return self.servable or self.record.cv is not None

    def due(self, n: int) -> bool:
        """Tested and trained on the ``n``-th observation."""
        return (n + self.phase) % self.stride == 0

    def features(self, views: Views) -> Any:
        """What the estimator takes for ``views``; None or empty: it cannot predict this sample."""
        return views.get(self.key.mode, self.key.category)

    def ready(self) -> bool:
        """Its predictions count (an online learner that has learned nothing answers 0)."""
        return True

    def predict_one(self, x: Any) -> float | None:
        return float(self.estimator.predict_one(x))

    def predict_many(self, xs: Sequence[Any]) -> list[float | None]:
        return [self.predict_one(x) for x in xs]

    def predict_matrix(self, a: np.ndarray, where: Mapping[str, int]) -> np.ndarray:
        """Predictions of the rows of ``a``, the mode's full features (column ``where[name]``, NaN where a row has
        none): the vectorised test of a :attr:`batched` kind."""
        raise NotImplementedError

    def learn(self, views: Views, y: float) -> None:
        """Learn a labelled observation (after every candidate was tested on it)."""

    def test_then_learn(self, rows: Sequence[tuple[Views, float, bool]]) -> list[float | None]:
        """Of each (views, target, tested) in order: its prediction where ``tested`` and it can predict the row (else
        None), then learn it; what :meth:`predict_one` then :meth:`learn` of each in turn give (a :attr:`deferred`
        kind's pass)."""
        out: list[float | None] = []
        for views, y, tested in rows:
            x = self.features(views) if tested else None
            out.append(self.predict_one(x) if x and self.ready() else None)
            self.learn(views, y)
        return out

    # -- judging ------------------------------------------------------------------

    def score(self, residual: float, regime: str, slot: str | None) -> None:
        """One prequential ``residual`` (measured - predicted) in ``regime``; ``slot``: also its own error there."""
        error = abs(residual)
        self.record.errors[regime].update(error)
        self.record.residuals[regime].update(residual)
        if slot is not None:
            e = self.record.slots.get(slot)
            if e is None:
                e = self.record.slots[slot] = Ewm(self.record.alpha)
            e.update(error)

    def error(self, regime: str, min_samples: int) -> float | None:
        """The error it is judged by in ``regime`` (None: not enough evidence yet): on new job sets its CV error
        where it has one, else its rolling prequential error once it has ``min_samples``."""
        record = self.record
        if regime == "new" and record.cv is not None:
            return record.cv.mae
        r = record.errors[regime]
        return None if len(r.values) < min_samples else float(r.mean)

    def offsets(self, regime: str, min_samples: int) -> tuple[float, float] | None:
        """Its 90 % interval offsets in ``regime``: the refit's conformal ones on new job sets, else those of its
        rolling prequential residuals once it has ``min_samples`` of them."""
        if regime == "new" and self.record.offsets is not None:
            return self.record.offsets
        w = self.record.residuals[regime]
        return w.offsets() if w.n >= min_samples else None

    @classmethod
    def starting(cls, config: ModelConfig, seed: int) -> list[Candidate]:
        """The candidates of this kind from the first observation (none: they come from refits)."""
        return []

    def link(self, candidates: Mapping[CandidateKey, Candidate], *, refit: bool) -> None:
        """After a refit (``refit``) or a load, with every candidate in place: a kind that builds on others'
        estimators takes them here."""

    # -- persistence ----------------------------------------------------------------

    def estimator_state(self, key: bytes) -> EstimatorState | None:
        """The estimator as a Struct, its bytes in memory (river's pickles signed with ``key``); what
        :meth:`estimator_of` reads."""
        raise NotImplementedError

    @classmethod
    def estimator_of(cls, state: EstimatorState | None, key: bytes, config: ModelConfig) -> Any:
        """The estimator :meth:`estimator_state` saved."""
        raise NotImplementedError


class NewcomerState(msgspec.Struct, tag="newcomer"):
    base: tuple[str, str, str] | None
    """The key of the batch candidate whose residuals it learns (None: no refit yet)."""
    model: dict[str, Any]
    """:func:`models.newcomer.dump`."""


EstimatorState = RiverState | SklearnState | MlpState | LastMeasuredState | RollingMedianState | NewcomerState


class OnlineCandidate(Candidate):
    """A river learner (:class:`models.zoo.online.RiverModel`) of one mode x category; heavy ones learn on a stride."""

    kind = "online"
    __slots__ = ()

    def ready(self) -> bool:
        return bool(self.estimator.n)

    def learn(self, views: Views, y: float) -> None:
        x = self.features(views)
        if x:
            self.estimator.learn_one(x, y)

    def estimator_state(self, key: bytes) -> EstimatorState | None:
        return self.estimator.to_state(key)  # type: ignore[no-any-return]

    @classmethod
    def estimator_of(cls, state: EstimatorState | None, key: bytes, config: ModelConfig) -> Any:
        assert isinstance(state, RiverState)
        return RiverModel.from_state(state, key)

    @classmethod
    def starting(cls, config: ModelConfig, seed: int) -> list[Candidate]:
        out: list[Candidate] = [
            cls(CandidateKey(mode, cat, name), make_online(name, seed), config)
            for mode in MODES
            for cat in CATEGORIES
            for name in config.online_models
        ]
        heavy = [c for c in out if c.key.model in HEAVY_ONLINE]
        for i, c in enumerate(heavy):  # staggered: about two heavy updates per observation
            c.stride, c.phase = max(1, config.heavy_stride), i
        return out


def select_columns(a: np.ndarray, where: Mapping[str, int], cols: Any) -> np.ndarray:
    """``a``'s columns in the order of a fitted model's ``cols`` (:class:`models.zoo.frames.Columns`), a column ``a`` lacks
    all NaN, and NaN filled with the model's fill values: ``cols.frame`` of a frame of the same rows.

    >>> from models.zoo.frames import Columns
    >>> cols = Columns.of_saved(["a", "b", "c"], [0.5, 1.5, 2.5])
    >>> select_columns(np.array([[1.0, np.nan], [3.0, 4.0]]), {"c": 0, "a": 1}, cols).tolist()
    [[0.5, 1.5, 1.0], [4.0, 1.5, 3.0]]
    """
    idx = np.array([where.get(name, -1) for name in cols.columns], dtype=int)
    out = a[:, np.maximum(idx, 0)] if len(idx) else np.empty((len(a), 0))
    missing = idx < 0
    if missing.any():
        out[:, missing] = np.nan
    return np.asarray(cols.filled(out), dtype=float)


class BatchCandidate(Candidate):
    """A batch model of the last refit (None when the last refit did not fit it: not servable)."""

    kind = "batch"
    batched = True
    __slots__ = ()

    def predict_many(self, xs: Sequence[Any]) -> list[float | None]:
        return [float(v) for v in self.estimator.predict_rows(xs)]

    def predict_matrix(self, a: np.ndarray, where: Mapping[str, int]) -> np.ndarray:
        """Predictions of the rows of ``a`` (scoring pending observations): what ``estimator.predict`` gives for the
        frame of the same rows, whose columns it reindexes to its own (absent: NaN, then its fill values)."""
        return np.asarray(self.estimator.predict_array(select_columns(a, where, self.estimator.cols)), dtype=float)

    def estimator_state(self, key: bytes) -> EstimatorState | None:
        return None if self.estimator is None else self.estimator.to_state()

    @classmethod
    def estimator_of(cls, state: EstimatorState | None, key: bytes, config: ModelConfig) -> Any:
        assert state is None or isinstance(state, SklearnState | MlpState)
        return None if state is None else batch_from_state(state)


class BaselineCandidate(Candidate):
    """A baseline (:class:`models.live.LastMeasured`, :class:`models.rolling.RollingMedian`) of one mode; it reads
    the slot, not features, learns every labelled observation, and is tested where the mode has features."""

    kind = "baseline"
    lends = False
    __slots__ = ()

    @property
    def answers(self) -> bool:
        return False

    @property
    def listed(self) -> bool:
        r = self.record
        return r.cv is not None or any(m.n for m in r.errors.values())

    def features(self, views: Views) -> Any:
        return views.slot if views.has(self.key.mode) else None

    def predict_one(self, x: Any) -> float | None:
        return self.estimator.predict_one(x)  # type: ignore[no-any-return]

    def learn(self, views: Views, y: float) -> None:
        self.estimator.learn_one(views.slot, y)

    def estimator_state(self, key: bytes) -> EstimatorState | None:
        return self.estimator.state()  # type: ignore[no-any-return]

    @classmethod
    def estimator_of(cls, state: EstimatorState | None, key: bytes, config: ModelConfig) -> Any:
        if isinstance(state, LastMeasuredState):
            return LastMeasured.restore(state)
        assert isinstance(state, RollingMedianState)
        return RollingMedian.restore(state)

    @classmethod
    def starting(cls, config: ModelConfig, seed: int) -> list[Candidate]:
        make = {LAST_MEASURED: lambda: LastMeasured(config.baseline_span), MEDIAN: lambda: RollingMedian(config.median_window)}
        return [cls(CandidateKey(mode, "all", name), make[name](), config) for mode in MODES for name in BASELINES]


NEWCOMER = "Newcomer"
NEWCOMER_BASES = ("ExtraTrees", "RandomForest", "HistGradientBoosting")
"""The batch models of placement mode's ``all`` category the newcomer candidate builds on, in order of preference
(the first the last refit fitted; else the one with the smallest CV error)."""


def _cv_mae(c: Candidate) -> float:
    cv = c.record.cv
    return math.inf if cv is None or cv.mae is None else float(cv.mae)


class NewcomerCandidate(Candidate):
    """``Newcomer``, placement mode: a batch model of the last refit plus a :class:`models.newcomer.Newcomer` on
    its residuals, learned from every labelled observation (test-then-train, like an online learner).  Shrunk
    toward the feature model: a type's biases keep ``n / (n + prior)`` of its mean residual.  At a refit it takes
    the new batch model and starts its residuals afresh (the new model has learned what the old residuals said).
    Not servable before the first refit."""

    kind = "newcomer"
    board_kind = "online"  # on the leaderboard record (events.ModelKind): it learns every observation
    deferred = True  # its base model's prediction of one row (a forest's) was a tenth of the learner's time
    __slots__ = ()

    @property
    def servable(self) -> bool:
        return self.estimator.base is not None

    def features(self, views: Views) -> Any:
        return views if views.has(VIA) else None

    def ready(self) -> bool:
        return self.servable

    def predict_one(self, x: Any) -> float | None:
        if self.waiting is not None:
            self.waiting()  # from everything learned so far
        return float(self.estimator.predict(x)) if self.servable else None

    def predict_many(self, xs: Sequence[Any]) -> list[float | None]:
        if self.waiting is not None:
            self.waiting()
        if not self.servable:
            return [None] * len(xs)
        return [float(v) for v in self.estimator.predict_many(xs)]

    def learn(self, views: Views, y: float) -> None:
        if self.servable and views.has(VIA):
            self.estimator.learn(views, y)

    def test_then_learn(self, rows: Sequence[tuple[Views, float, bool]]) -> list[float | None]:
        """The base model's predictions of the rows in one ``predict_rows``; then, in order, each row's prediction
        (base plus the residual model as it is then) and the residual model learning it."""
        if not self.servable:
            return [None] * len(rows)
        est: NewcomerEstimator = self.estimator
        use = [i for i, (views, _, _) in enumerate(rows) if views.has(VIA)]
        base = dict(zip(use, est.base_many([rows[i][0] for i in use]), strict=True)) if use else {}
        out: list[float | None] = []
        for i, (views, y, tested) in enumerate(rows):
            b = base.get(i)
            if b is None:
                out.append(None)
                continue
            out.append(float(est.predict_with(views, b)) if tested else None)
            est.learn_with(views, y, b)
        return out

    def link(self, candidates: Mapping[CandidateKey, Candidate], *, refit: bool) -> None:
        est: NewcomerEstimator = self.estimator
        fitted = {
            k: c for k, c in candidates.items() if c.kind == "batch" and c.servable and k.mode == VIA and k.category == "all"
        }
        key = est.base_key if not refit and est.base_key in fitted else None
        for name in NEWCOMER_BASES if key is None else ():
            if CandidateKey(VIA, "all", name) in fitted:
                key = CandidateKey(VIA, "all", name)
                break
        if key is None and fitted:
            key = min(fitted, key=lambda k: (_cv_mae(fitted[k]), k))
        est.base, est.base_key = (None, None) if key is None else (fitted[key].estimator, key)
        if refit:
            r = est.residuals
            est.residuals = Newcomer(r.rank, r.prior, r.lr, r.reg, r.init_scale, r.seed)

    def estimator_state(self, key: bytes) -> EstimatorState | None:
        est: NewcomerEstimator = self.estimator
        base = None if est.base_key is None else (est.base_key.mode, est.base_key.category, est.base_key.model)
        return NewcomerState(base, newcomer_dump(est.residuals))

    @classmethod
    def estimator_of(cls, state: EstimatorState | None, key: bytes, config: ModelConfig) -> Any:
        assert isinstance(state, NewcomerState)
        return NewcomerEstimator(newcomer_load(state.model), None, None if state.base is None else CandidateKey(*state.base))

    @classmethod
    def starting(cls, config: ModelConfig, seed: int) -> list[Candidate]:
        if not config.newcomer:
            return []
        model = Newcomer(rank=config.newcomer_rank, prior=config.newcomer_prior, seed=seed)
        return [cls(CandidateKey(VIA, "all", NEWCOMER), NewcomerEstimator(model), config)]


KINDS: dict[str, type[Candidate]] = {c.kind: c for c in (OnlineCandidate, BatchCandidate, BaselineCandidate, NewcomerCandidate)}
"""Every kind of candidate, by :attr:`Candidate.kind` (what a save says each candidate is), in the order their
:meth:`Candidate.starting` candidates are made."""

"""The model zoo behind two small contracts.

* :class:`OnlineModel`: ``learn_one(x, y)`` / ``predict_one(x)`` on feature dicts
  (river learners, updated on every observation);
* :class:`BatchModel`: ``fit(X, y)`` / ``predict(X)`` on frames, plus ``predict_rows(xs)`` on
  feature dicts for serving (one matrix, one ``predict``; scikit-learn and the torch MLP).

Each family is wrapped once (:class:`RiverModel`, :class:`SklearnModel`,
:class:`TorchMLP`); :data:`ONLINE` and :data:`BATCH` name every member.  Models
never depend on feature order (columns are sorted by name) and handle missing
features: an absent indicator (``key=value``) is 0, any other absent feature
takes its training median.
"""

from __future__ import annotations

import math
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

import msgspec
import numpy as np
import pandas as pd

from models import persist


@runtime_checkable
class OnlineModel(Protocol):
    name: str

    def learn_one(self, x: Mapping[str, float], y: float) -> None: ...

    def predict_one(self, x: Mapping[str, float]) -> float: ...

    def save(self, path: Path, key: bytes) -> None: ...


@runtime_checkable
class BatchModel(Protocol):
    name: str

    def fit(self, X: pd.DataFrame, y: Sequence[float]) -> BatchModel: ...

    def predict(self, X: pd.DataFrame) -> np.ndarray: ...

    def predict_rows(self, xs: Sequence[Mapping[str, float]]) -> np.ndarray: ...

    def predict_one(self, x: Mapping[str, float]) -> float: ...

    def save(self, path: Path) -> None: ...


# --------------------------------------------------------------------------- online (river)


class RiverModel:
    """A river regressor (usually a pipeline) behind :class:`OnlineModel`.

    ``predict_one`` never returns None: before the first ``learn_one`` (AMF
    returns None then) it answers the running mean of the targets seen (0 at first).
    """

    def __init__(self, name: str, estimator: Any) -> None:
        self.name = name
        self.estimator = estimator
        self.n = 0
        self.mean = 0.0

    def learn_one(self, x: Mapping[str, float], y: float) -> None:
        self.estimator.learn_one(dict(sorted(x.items())), float(y))
        self.n += 1
        self.mean += (float(y) - self.mean) / self.n

    def predict_one(self, x: Mapping[str, float]) -> float:
        if self.n == 0:
            return self.mean
        y = self.estimator.predict_one(dict(sorted(x.items())))
        if y is None or not math.isfinite(y):
            return self.mean
        return float(y)

    def save(self, path: Path, key: bytes) -> None:
        persist.dump_signed(path, {"name": self.name, "estimator": self.estimator, "n": self.n, "mean": self.mean}, key)

    @classmethod
    def load(cls, path: Path, key: bytes) -> RiverModel:
        state = persist.load_signed(path, key)
        model = cls(state["name"], state["estimator"])
        model.n, model.mean = state["n"], state["mean"]
        return model


Z_MAX = 10.0
"""Standardised inputs of the online linear learner are bounded to +-Z_MAX: early in a stream a feature's
variance is tiny and one ordinary value is a z-score of thousands, which made the SGD weights blow up."""


def bound_z(x: dict[str, float]) -> dict[str, float]:
    """Each value clipped to ``[-Z_MAX, Z_MAX]`` (a module-level function, so the pipeline pickles).

    >>> bound_z({"a": 1e6, "b": -0.5})
    {'a': 10.0, 'b': -0.5}
    """
    return {k: Z_MAX if v > Z_MAX else -Z_MAX if v < -Z_MAX else v for k, v in x.items()}


def _river_linear(seed: int) -> Any:
    from river import compose, linear_model, optim, preprocessing

    # bounded inputs and a bounded loss gradient (an error of 50 points): no single observation moves it far
    return (
        preprocessing.StandardScaler()
        | compose.FuncTransformer(bound_z)
        | linear_model.LinearRegression(optimizer=optim.SGD(0.01), l2=0.001, clip_gradient=100.0)
    )


def _river_knn(seed: int) -> Any:
    from river import neighbors, preprocessing

    return preprocessing.StandardScaler() | neighbors.KNNRegressor(
        n_neighbors=5, engine=neighbors.LazySearch(window_size=100), aggregation_method="mean"
    )


def _river_hatr(seed: int) -> Any:
    from river import preprocessing, tree

    return preprocessing.StandardScaler() | tree.HoeffdingAdaptiveTreeRegressor(
        grace_period=50, max_depth=8, leaf_prediction="mean", seed=seed
    )


def _river_amf(seed: int) -> Any:
    from river import forest

    return forest.AMFRegressor(n_estimators=3, step=1.0, use_aggregation=True, seed=seed)


ONLINE: dict[str, Callable[[int], Any]] = {
    "river.LinearRegression": _river_linear,
    "river.KNNRegressor": _river_knn,
    "river.HoeffdingAdaptiveTreeRegressor": _river_hatr,
    "river.AMFRegressor": _river_amf,
}
HEAVY_ONLINE = ("river.KNNRegressor", "river.HoeffdingAdaptiveTreeRegressor", "river.AMFRegressor")
"""Online learners updated on a stride (see ``EnvironmentModels``) to hold the per-observation budget."""


def make_online(name: str, seed: int = 0) -> RiverModel:
    return RiverModel(name, ONLINE[name](seed))


# --------------------------------------------------------------------------- batch: shared frame handling


class _Columns:
    """Sorted columns and fill values learned at fit; frames and dicts become float arrays."""

    def __init__(self, X: pd.DataFrame) -> None:
        columns = sorted(str(c) for c in X.columns)
        raw = X.reindex(columns=columns).apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        self._init(columns, raw)

    def _init(self, columns: list[str], raw: np.ndarray) -> None:
        self.columns = columns
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN column: fill 0
            med = np.nanmedian(raw, axis=0) if len(raw) else np.full(len(columns), np.nan)
        ind = np.array(["=" in c for c in columns], dtype=bool)
        self.fill = np.where(ind | np.isnan(med), 0.0, med).astype(float)
        self.index = {c: i for i, c in enumerate(self.columns)}

    @classmethod
    def of_array(cls, columns: list[str], raw: np.ndarray) -> _Columns:
        """From an array whose columns are ``columns`` (sorted), NaN where missing."""
        self = cls.__new__(cls)
        self._init(list(columns), raw)
        return self

    def filled(self, raw: np.ndarray) -> np.ndarray:
        mask = np.isnan(raw)
        return np.where(mask, self.fill, raw) if mask.any() else raw

    def frame(self, X: pd.DataFrame) -> np.ndarray:
        a = X.reindex(columns=self.columns).to_numpy(dtype=float, na_value=np.nan)
        mask = np.isnan(a)
        if mask.any():
            a = np.where(mask, self.fill, a)
        return a

    def rows(self, xs: Sequence[Mapping[str, float]]) -> np.ndarray:
        """One row per feature dict (absent, unknown or non-finite values: the fill value)."""
        a = np.tile(self.fill, (len(xs), 1))
        for r, x in enumerate(xs):
            for k, v in x.items():
                i = self.index.get(k)
                if i is not None and v is not None and math.isfinite(v):
                    a[r, i] = v
        return a

    @classmethod
    def of_saved(cls, columns: Sequence[str], fill: Sequence[float]) -> _Columns:
        self = cls.__new__(cls)
        self.columns = list(columns)
        self.fill = np.array(fill, dtype=float)
        self.index = {c: i for i, c in enumerate(self.columns)}
        return self


def compress(a: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Collapse identical feature rows into one: (distinct rows, mean target, count).

    In placement mode every observation of the same job set has the same features, so 10,000
    observations hold a few hundred distinct rows.  For squared-error fits (least squares, MSE trees)
    the weighted distinct rows give exactly the same model.  Rows keep the order of their first
    occurrence; with no duplicates the input comes back unchanged with ``None`` weights.

    >>> a, t, w = compress(np.array([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0]]), np.array([1.0, 5.0, 3.0]))
    >>> a.tolist(), t.tolist(), w.tolist()
    ([[1.0, 2.0], [3.0, 4.0]], [2.0, 5.0], [2.0, 1.0])
    """
    if len(a) < 2:
        return a, y, None
    rows = np.ascontiguousarray(a, dtype=float) + 0.0  # + 0.0: -0.0 and 0.0 compare equal as bytes too
    _, first, inverse = np.unique(rows.view(np.dtype((np.void, 8 * a.shape[1])))[:, 0], return_index=True, return_inverse=True)
    if len(first) == len(a):
        return a, y, None
    order = np.argsort(first)  # distinct rows in order of first occurrence
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    g = rank[np.ravel(inverse)]
    count = np.bincount(g).astype(float)
    return a[first[order]], np.bincount(g, weights=y) / count, count


class Prepared:
    """A training set as the batch models use it: sorted columns, fill values, the filled array, the target,
    and (computed once, on demand) its distinct rows.  Cross-validation prepares each fold once for all models."""

    def __init__(self, cols: _Columns, a: np.ndarray, y: np.ndarray) -> None:
        self.cols, self.a, self.y = cols, a, y
        self._distinct: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None

    @classmethod
    def of_frame(cls, X: pd.DataFrame, y: Sequence[float]) -> Prepared:
        cols = _Columns(X)
        return cls(cols, cols.frame(X), np.asarray(y, dtype=float))

    @classmethod
    def of_array(cls, columns: list[str], raw: np.ndarray, y: np.ndarray) -> Prepared:
        cols = _Columns.of_array(columns, raw)
        return cls(cols, cols.filled(raw), np.asarray(y, dtype=float))

    def distinct(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if self._distinct is None:
            self._distinct = compress(self.a, self.y)
        return self._distinct


# --------------------------------------------------------------------------- batch: scikit-learn


class SklearnModel:
    """A scikit-learn regressor behind :class:`BatchModel` (scaled inputs where the model needs them)."""

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.spec = SKLEARN[name]
        self.seed = seed
        self.estimator: Any = None
        self.cols: _Columns | None = None
        self._memo: dict[bytes, float] = {}
        self.fit_id = ""

    def fit(self, X: pd.DataFrame, y: Sequence[float]) -> SklearnModel:
        return self.fit_prepared(Prepared.of_frame(X, y))

    def fit_prepared(self, data: Prepared) -> SklearnModel:
        self.cols = data.cols
        self._memo = {}
        with one_thread():
            self.estimator = self.spec.fit(self.spec.factory(self.seed), data)
        self.fit_id = new_fit_id()
        return self

    def predict_array(self, a: np.ndarray) -> np.ndarray:
        """Predict rows already in :attr:`cols` order and filled."""
        if not self.spec.threaded:
            return self.spec.predict(self.estimator, a)
        with one_thread():
            return self.spec.predict(self.estimator, a)

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        assert self.cols is not None, "fit first"
        return self.predict_array(self.cols.frame(X))

    def predict_rows(self, xs: Sequence[Mapping[str, float]]) -> np.ndarray:
        """One ``predict`` on the matrix of the rows of ``xs`` not predicted before (filled and finite: scikit-learn's
        checks are skipped).  Rows predicted before come from a memo: a fitted model is a pure function, and serving
        repeats rows (a job set's placement features on every observation, a GPU's what-if entries every window),
        while one ``predict`` call costs 0.1-3 ms even for one row (docs/BENCHMARKS.md, issue 14)."""
        import sklearn

        assert self.cols is not None, "fit first"
        a = self.cols.rows(xs)
        keys = [row.tobytes() for row in a]
        miss = [i for i, k in enumerate(keys) if k not in self._memo]
        new: dict[bytes, float] = {}
        if miss:
            with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
                new = dict(zip((keys[i] for i in miss), self.predict_array(a[miss]).tolist(), strict=True))
        out = np.array([new[k] if k in new else self._memo[k] for k in keys])
        if len(self._memo) + len(new) > MEMO_ROWS:
            self._memo.clear()
        self._memo.update(new)
        return out

    def predict_one(self, x: Mapping[str, float]) -> float:
        return float(self.predict_rows([x])[0])

    def save(self, path: Path) -> None:
        """Write the model to ``path``; nothing when ``path`` already holds this fit (a worker saves every interval,
        and an unchanged forest's skops file cost about 0.1 s of the event loop each time)."""
        assert self.cols is not None, "fit first"
        if saved_fit_id(path) == self.fit_id:
            return
        path.mkdir(parents=True, exist_ok=True)
        persist.dump_sklearn(path / "estimator.skops", self.estimator)
        meta = SklearnMeta(self.name, self.seed, self.cols.columns, self.cols.fill.tolist(), self.fit_id)
        persist.write_state(path / META, meta)  # last: the fit id says the files beside it are complete

    @classmethod
    def load(cls, path: Path, meta: SklearnMeta) -> SklearnModel:
        model = cls(meta.name, meta.seed)
        model.cols = _Columns.of_saved(meta.columns, meta.fill)
        model.estimator = persist.load_sklearn(path / "estimator.skops")
        model.fit_id = meta.fit_id
        return model


META = "columns.json"


class SklearnMeta(msgspec.Struct, tag="sklearn"):
    """A saved scikit-learn model's name, seed, columns and fill values (its estimator: skops, beside it)."""

    name: str
    seed: int
    columns: list[str]
    fill: list[float]
    fit_id: str = ""

    def load(self, path: Path) -> SklearnModel:
        return SklearnModel.load(path, self)


MEMO_ROWS = 2048
"""Rows a served scikit-learn model remembers the prediction of (then it forgets them all and starts again)."""
_OPENMP: Any = None


def one_thread() -> Any:
    """A context in which scikit-learn's OpenMP code (HistGradientBoosting) and the BLAS of numpy and scipy (the
    linear models' ``lstsq``) use one thread.  Refits run beside the event loop on a small machine, like the
    MLP's one torch thread; and oversubscribed threads spin-wait: a tiny refit took 71 s at load 6 (OpenMP), and
    144-row least squares took 3x as long with OpenBLAS's two threads as with one on a loaded 2-core machine
    (``tests/unit/test_evaluate.py``'s observed-mode case, 21 s against 6.9 s).  OpenMP's thread count is per
    calling thread, OpenBLAS's per process; the context restores both."""
    global _OPENMP
    if _OPENMP is None:
        import sklearn.ensemble  # noqa: F401  (loads the OpenMP runtime before the controller looks for it)
        from threadpoolctl import ThreadpoolController

        _OPENMP = ThreadpoolController()
    return _OPENMP.limit(limits=1)


def _scaled(est: Any) -> Any:
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), est)


def _linear(seed: int) -> Any:
    from sklearn.linear_model import LinearRegression

    return _scaled(LinearRegression())


def _linear_svr_class() -> type:
    from sklearn.svm import LinearSVR

    return LinearSVR


def _svr_linear(seed: int) -> Any:
    # SVR with a linear kernel, solved in the primal by liblinear (same objective as libsvm's SVR(kernel="linear"))
    from sklearn.svm import LinearSVR

    return _scaled(LinearSVR(C=1.0, epsilon=1.0, loss="epsilon_insensitive", dual=True, max_iter=5_000, random_state=seed))


def _svr_poly(seed: int) -> Any:
    # SVR with the kernel (gamma <x, x'> + 1)^2, solved in the primal on that kernel's explicit feature map
    # (degree-2 monomials, weighted so that their inner product is the kernel); see _fit_primal_svr
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import PolynomialFeatures, StandardScaler
    from sklearn.svm import LinearSVR

    return make_pipeline(
        StandardScaler(), PolynomialFeatures(degree=2, include_bias=False),
        LinearSVR(C=10.0, epsilon=1.0, loss="epsilon_insensitive", dual=True, max_iter=5_000, random_state=seed),
    )  # fmt: skip


POLY_COEF0 = 1.0


def _fit_svr(pipe: Any, a: np.ndarray, y: np.ndarray, weight: np.ndarray | None) -> Any:
    """Fit ``StandardScaler [-> PolynomialFeatures] -> LinearSVR`` as the kernel SVR it stands for; returns the estimator.

    * linear kernel: ``<x, x'>`` on the scaled inputs -- LinearSVR's own (primal) problem;
    * poly kernel ``(gamma <x, x'> + c)^2`` (gamma as scikit-learn's ``"scale"``, on the weighted rows): the
      same objective is solved where it is smaller.  Dual (libsvm ``SVR(kernel="poly")``, one variable per
      row) when the rows are at most 4x the kernel's features; else primal on the kernel's explicit feature
      map -- ``sqrt(2 c gamma) x_i``, ``gamma x_i^2``, ``sqrt(2) gamma x_i x_j`` (the constant ``c`` is
      absorbed by the unpenalised intercept) -- with LinearSVR, whose weights are then folded into ``coef_``
      so that the pipeline predicts from plain monomials.

    For liblinear the target is centred first (liblinear penalises its intercept; libsvm does not).
    """
    import warnings as _w

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.pipeline import make_pipeline
    from sklearn.svm import SVR

    steps = [s for _, s in pipe.steps]
    scaler, svr = steps[0], steps[-1]
    xs = scaler.fit_transform(a, sample_weight=weight)
    d: np.ndarray | None = None
    with _w.catch_warnings():
        _w.simplefilter("ignore", ConvergenceWarning)
        if len(steps) == 3:
            poly = steps[1]
            feats = poly.fit_transform(xs)
            w = np.ones(len(xs)) if weight is None else weight
            ww = np.broadcast_to(w[:, None], xs.shape)
            mean = float(np.average(xs, weights=ww))
            var = float(np.average((xs - mean) ** 2, weights=ww))
            gamma = 1.0 / (xs.shape[1] * var) if var > 0 else 1.0
            if len(xs) <= 4 * feats.shape[1]:
                kernel = SVR(
                    kernel="poly", degree=2, gamma=gamma, coef0=POLY_COEF0, C=svr.C, epsilon=svr.epsilon, max_iter=50_000
                )
                kernel.fit(xs, y, sample_weight=weight)
                return make_pipeline(scaler, kernel)
            deg = poly.powers_.sum(axis=1)
            square = poly.powers_.max(axis=1) == 2
            d = np.where(deg == 1, math.sqrt(2.0 * POLY_COEF0 * gamma), np.where(square, gamma, math.sqrt(2.0) * gamma))
            xs = feats * d
        center = float(np.average(y, weights=weight))
        svr.fit(xs, y - center, sample_weight=weight)
    if d is not None:
        svr.coef_ = svr.coef_ * d
    svr.intercept_ = svr.intercept_ + center
    return pipe


def _tree(seed: int) -> Any:
    from sklearn.tree import DecisionTreeRegressor

    return DecisionTreeRegressor(min_samples_leaf=3, random_state=seed)


def _knn(seed: int) -> Any:
    from sklearn.neighbors import KNeighborsRegressor

    return _scaled(KNeighborsRegressor(n_neighbors=5, weights="distance", algorithm="kd_tree"))


def _gbr(seed: int) -> Any:
    from sklearn.ensemble import GradientBoostingRegressor

    return GradientBoostingRegressor(n_estimators=50, max_depth=4, learning_rate=0.15, subsample=0.7, random_state=seed)


def _hgb(seed: int) -> Any:
    # histogram gradient boosting: the same boosting settings as _gbr (50 stages, depth 4, learning rate 0.15, leaves
    # of any size as GradientBoosting's default, so a fit of distinct rows weighted by their copies is the fit of
    # the copies), on binned features (255 bins), without row subsampling -- a different, faster model, own name
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(
        max_iter=50, max_depth=4, learning_rate=0.15, min_samples_leaf=1, early_stopping=False, random_state=seed
    )


MONOTONE_UP_PARAMS = ("E", "S", "V", "R", "W", "M")
"""Co-runner load: more of any of these (power, SM and memory utilisation, bandwidth, memory) never makes a job
faster, so a monotone model's prediction never falls as they rise."""


def monotone_direction(column: str) -> int:
    """+1 for a feature that measures co-runner load (the slowdown may only rise with it), else 0.

    >>> [monotone_direction(c) for c in ("other_solo_S", "other_max_M", "n_co", "solo_S", "other_solo_throughput")]
    [1, 1, 1, 0, 0]
    """
    if column == "n_co":
        return 1
    for prefix in ("other_solo_", "other_max_"):
        if column.startswith(prefix) and column[len(prefix) :] in MONOTONE_UP_PARAMS:
            return 1
    return 0


def forest_predict(forest: Any, a: np.ndarray) -> np.ndarray:
    """A forest regressor's ``predict``: its trees' predictions, summed in their order and divided by their
    number, as scikit-learn's does (so the same floats), without its per-tree task dispatch, which costs about
    0.15 ms a tree here: 4 ms of the 4.5 ms of a 25-tree ``predict`` of a few rows (docs/BENCHMARKS.md)."""
    x = np.ascontiguousarray(a, dtype=np.float32)  # what the forest's own input check makes of it
    out = np.zeros(len(x), dtype=np.float64)
    for tree in forest.estimators_:
        out += _tree_values(tree, x)
    out /= len(forest.estimators_)
    return out


def _tree_values(tree: Any, x: np.ndarray) -> np.ndarray:
    """A fitted regression tree's ``predict`` of ``x`` (float32, C-contiguous): its ``tree_``'s, as the public method
    returns it, without the public method's fitted check (20 of its 24 us for one row, against 4)."""
    values: np.ndarray = tree.tree_.predict(x)[:, 0]
    return values


def tree_predict(tree: Any, a: np.ndarray) -> np.ndarray:
    """A regression tree's ``predict`` (the same floats: :func:`_tree_values` of what its input check makes of ``a``)."""
    return np.asarray(_tree_values(tree, np.ascontiguousarray(a, dtype=np.float32)), dtype=float)


def _predict(estimator: Any, a: np.ndarray) -> np.ndarray:
    return np.asarray(estimator.predict(a), dtype=float)


# How each scikit-learn model is fitted on a :class:`Prepared` training set: the distinct feature rows, each
# weighted by its copies (see SKLEARN); the estimator fitted is returned.


def fit_weighted(estimator: Any, data: Prepared) -> Any:
    """The distinct rows, weighted by their copies (``sample_weight``)."""
    a, t, weight = data.distinct()
    if weight is None:
        return estimator.fit(a, t)
    return estimator.fit(a, t, sample_weight=weight)


def fit_scaled_weighted(pipeline: Any, data: Prepared) -> Any:
    """A pipeline (scaler, model) on the distinct rows, every step weighted by their copies."""
    a, t, weight = data.distinct()
    if weight is None:
        return pipeline.fit(a, t)
    return pipeline.fit(a, t, **{f"{n}__sample_weight": weight for n, _ in pipeline.steps})


def fit_leaf_weighted(tree: Any, data: Prepared) -> Any:
    """A tree on the distinct rows: a leaf of >= m duplicated rows is a leaf of weight >= m (``min_samples_leaf``
    would count distinct rows), so its minimum leaf becomes a weight fraction."""
    _, _, weight = data.distinct()
    if weight is not None and tree.min_samples_leaf > 1:
        # scikit-learn takes a fraction up to 0.5: a tree of fewer than 2 m rows' weight is a stump or a leaf anyway
        fraction = min(0.5, tree.min_samples_leaf / float(weight.sum()))
        tree.set_params(min_weight_fraction_leaf=fraction, min_samples_leaf=1)
    return fit_weighted(tree, data)


def fit_neighbours(pipeline: Any, data: Prepared) -> Any:
    """KNN: the distinct points, each with the mean target of its copies (unweighted); fewer neighbours on a
    data set smaller than ``n_neighbors`` (the paper's rows)."""
    a, t, _ = data.distinct()
    knn = pipeline.steps[-1][1]
    if len(a) < knn.n_neighbors:
        knn.set_params(n_neighbors=max(1, len(a)))
    return pipeline.fit(a, t)


def fit_kernel_svr(pipeline: Any, data: Prepared) -> Any:
    """The SVRs: the kernel SVR the pipeline stands for (:func:`_fit_svr`), on the weighted distinct rows."""
    a, t, weight = data.distinct()
    return _fit_svr(pipeline, a, t, weight)


def fit_monotone(estimator: Any, data: Prepared) -> Any:
    """Constrained to be non-decreasing in every co-runner load feature (:func:`monotone_direction`)."""
    estimator.set_params(monotonic_cst=[monotone_direction(c) for c in data.cols.columns])
    return fit_weighted(estimator, data)


class Spec(NamedTuple):
    """A scikit-learn model of the zoo: how it is made, fitted and asked."""

    factory: Callable[[int], Any]
    fit: Callable[[Any, Prepared], Any] = fit_weighted
    predict: Callable[[Any, np.ndarray], np.ndarray] = _predict
    threaded: bool = True
    """Its ``predict`` may run OpenMP or BLAS threads (asked in :func:`one_thread`); False: one thread whatever the
    limits (the trees' :func:`forest_predict` and :func:`tree_predict`), asked without the context, which costs more
    than a tree's prediction of a few rows (threadpoolctl reads every library's thread count to restore it)."""


def _rf(seed: int) -> Any:
    from sklearn.ensemble import RandomForestRegressor

    return RandomForestRegressor(n_estimators=20, max_features=0.5, random_state=seed, n_jobs=1)


def _extra(seed: int) -> Any:
    from sklearn.ensemble import ExtraTreesRegressor

    return ExtraTreesRegressor(n_estimators=25, max_features=0.7, random_state=seed, n_jobs=1)


SKLEARN: dict[str, Spec] = {
    "LinearRegression": Spec(_linear, fit_scaled_weighted),
    "SVR-linear": Spec(_svr_linear, fit_kernel_svr),
    "SVR-poly": Spec(_svr_poly, fit_kernel_svr),
    "DecisionTree": Spec(_tree, fit_leaf_weighted, tree_predict, threaded=False),
    "KNN": Spec(_knn, fit_neighbours),
    "GradientBoosting": Spec(_gbr),
    "HistGradientBoosting": Spec(_hgb),
    "HistGradientBoosting-monotone": Spec(_hgb, fit_monotone),
    "RandomForest": Spec(_rf, predict=forest_predict, threaded=False),
    "ExtraTrees": Spec(_extra, predict=forest_predict, threaded=False),
}
"""The scikit-learn models.  Every one is fitted on the distinct feature rows (weights = copies; KNN: distinct
points, mean target): exact for LinearRegression and the MSE trees (DecisionTree; ExtraTrees in distribution); RandomForest's
bootstrap and GradientBoosting's subsample draw distinct rows, and the SVRs' epsilon-insensitive loss of a
mean target is not the summed loss of the copies, so those are close to, not equal to, the duplicated fit."""


# --------------------------------------------------------------------------- batch: torch MLP


BATCH_ROWS = 256
"""Rows of one minibatch of the MLP (every row when fewer)."""
WEIGHT_DECAY = 1e-4
"""The MLP's L2 weight decay (added to the gradient, as torch's Adam does)."""


class TorchMLP:
    """A small MLP (CPU, one thread, deterministic for a seed) behind :class:`BatchModel`."""

    name = "MLP"

    def __init__(self, seed: int = 0, hidden: int = 32, epochs: int = 120, lr: float = 0.03) -> None:
        self.seed, self.hidden, self.epochs, self.lr = seed, hidden, epochs, lr
        self.cols: _Columns | None = None
        self.net: Any = None
        self.stats = np.zeros(0)
        self.fit_id = ""

    def _build(self, n_in: int) -> Any:
        import torch

        torch.manual_seed(self.seed)
        return torch.nn.Sequential(
            torch.nn.Linear(n_in, self.hidden), torch.nn.ReLU(), torch.nn.Linear(self.hidden, self.hidden), torch.nn.ReLU(),
            torch.nn.Linear(self.hidden, 1),
        )  # fmt: skip

    def fit(self, X: pd.DataFrame, y: Sequence[float]) -> TorchMLP:
        return self.fit_prepared(Prepared.of_frame(X, y))

    def fit_prepared(self, data: Prepared) -> TorchMLP:
        """Fits every row (not the distinct ones): the minibatches sample rows, so copies weigh as rows.

        torch builds and seeds the network (its default initialisation) and keeps it for saving; the steps run in
        numpy (:func:`models.mlp.adam`: torch's Adam and smooth-L1 arithmetic, about a quarter of its cost per fit)."""
        import torch

        from models import mlp

        self.cols = data.cols
        a, t = data.a, data.y
        mu, sd = a.mean(axis=0), a.std(axis=0)
        sd[sd == 0] = 1.0
        self.stats = np.concatenate([mu, sd, [t.mean(), t.std() or 1.0]])
        torch.set_num_threads(1)  # refits run beside the event loop on a small machine; one thread each
        with torch.random.fork_rng(devices=[]):
            self.net = self._build(a.shape[1])
        linears = [m for m in self.net if hasattr(m, "weight")]
        shapes = [(m.in_features, m.out_features) for m in linears]
        flat = np.concatenate(
            [np.concatenate([m.weight.detach().numpy().T.ravel(), m.bias.detach().numpy()]) for m in linears]
        ).astype(np.float32)
        xs = ((a - mu) / sd).astype(np.float32)
        ys = ((t - self.stats[-2]) / self.stats[-1]).astype(np.float32).reshape(-1, 1)
        batches = mlp.minibatches(len(xs), self.epochs, BATCH_ROWS, self.seed)  # ``epochs`` counts steps
        with one_thread():
            mlp.adam(flat, shapes, xs, ys, batches, self.lr, WEIGHT_DECAY)
        with torch.no_grad():
            for m, (w, b) in zip(linears, mlp.layout(shapes, flat), strict=True):
                m.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T)))
                m.bias.copy_(torch.from_numpy(b.copy()))
        self._numpy_weights()
        self.fit_id = new_fit_id()
        return self

    def _numpy_weights(self) -> None:
        self.weights = [
            (m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy()) for m in self.net if hasattr(m, "weight")
        ]

    def _forward(self, a: np.ndarray) -> np.ndarray:
        n = self.stats.shape[0] // 2 - 1
        h = (a - self.stats[:n]) / self.stats[n : 2 * n]
        for i, (w, b) in enumerate(self.weights):
            h = h @ w + b
            if i < len(self.weights) - 1:
                h = np.maximum(h, 0.0)
        out: np.ndarray = h[:, 0] * self.stats[-1] + self.stats[-2]
        return out

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        assert self.cols is not None, "fit first"
        return self._forward(self.cols.frame(X))

    def predict_array(self, a: np.ndarray) -> np.ndarray:
        return self._forward(a)

    def predict_rows(self, xs: Sequence[Mapping[str, float]]) -> np.ndarray:
        assert self.cols is not None, "fit first"
        return self._forward(self.cols.rows(xs))

    def predict_one(self, x: Mapping[str, float]) -> float:
        return float(self.predict_rows([x])[0])

    def save(self, path: Path) -> None:
        import torch

        assert self.cols is not None, "fit first"
        if saved_fit_id(path) == self.fit_id:  # as SklearnModel.save
            return
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.net.state_dict(), path / "mlp.pt")
        meta = MlpMeta(
            self.seed, self.hidden, self.epochs, self.lr, self.cols.columns, self.cols.fill.tolist(), self.stats.tolist(),
            self.fit_id,
        )  # fmt: skip
        persist.write_state(path / META, meta)

    @classmethod
    def load(cls, path: Path, meta: MlpMeta) -> TorchMLP:
        import torch

        model = cls(meta.seed, meta.hidden, meta.epochs, meta.lr)
        model.cols = _Columns.of_saved(meta.columns, meta.fill)
        model.stats = np.array(meta.stats, dtype=float)
        model.net = model._build(len(model.cols.columns))
        model.net.load_state_dict(torch.load(path / "mlp.pt", weights_only=True))
        model._numpy_weights()
        model.fit_id = meta.fit_id
        return model


class MlpMeta(msgspec.Struct, tag="mlp"):
    """A saved MLP's settings, columns, fill values and standardisation (its weights: ``mlp.pt``, beside it)."""

    seed: int
    hidden: int
    epochs: int
    lr: float
    columns: list[str]
    fill: list[float]
    stats: list[float]
    fit_id: str = ""

    def load(self, path: Path) -> TorchMLP:
        return TorchMLP.load(path, self)


BATCH: tuple[str, ...] = (*SKLEARN, "MLP")
"""Every batch model (``aip evaluate`` runs them all: the paper's models, ExtraTrees, HistGradientBoosting, MLP)."""
REFIT_BATCH: tuple[str, ...] = tuple(n for n in BATCH if n not in ("GradientBoosting", "HistGradientBoosting-monotone"))
"""The batch models of the stream's refits (``ModelConfig.batch_models``): every model but the paper's
GradientBoosting, whose place HistGradientBoosting takes (same boosting settings; on the 10,000-observation
refit its fits cost ~3 s of CPU against ~0.3 s, at the same or lower CV error; docs/MODELS.md), and but the
monotone HistGradientBoosting (``aip evaluate`` only so far: the stream's refit budget was measured without it)."""


def new_fit_id() -> str:
    """A fit's identity: saved with it, so that saving the same fit again can be skipped."""
    return uuid.uuid4().hex


def saved_fit_id(path: Path) -> str | None:
    """The fit id of the batch model saved in ``path`` (None: nothing saved there, or a save from before fit ids).

    >>> import tempfile
    >>> saved_fit_id(Path(tempfile.mkdtemp()))
    """
    try:
        meta = persist.read_state(path / META, FitId)
    except (OSError, msgspec.DecodeError):
        return None
    return meta.fit_id or None


class FitId(msgspec.Struct):
    """The one field of a saved batch model's meta that says which fit it holds."""

    fit_id: str = ""


def make_batch(name: str, seed: int = 0) -> SklearnModel | TorchMLP:
    return TorchMLP(seed) if name == TorchMLP.name else SklearnModel(name, seed)


def load_batch(path: Path) -> SklearnModel | TorchMLP:
    """A batch model saved by its ``save(path)``."""
    return persist.read_state(path / META, SklearnMeta | MlpMeta).load(path)  # type: ignore[arg-type]

"""scikit-learn regressors behind :class:`models.zoo.BatchModel` (:class:`SklearnModel`), and how each is made,
fitted and asked (:data:`SKLEARN`)."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from models import persist
from models.zoo.frames import Columns, FittedState, Prepared, new_fit_id, one_thread


class SklearnModel:
    """A scikit-learn regressor behind :class:`BatchModel` (scaled inputs where the model needs them)."""

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.spec = SKLEARN[name]
        self.seed = seed
        self.estimator: Any = None
        self.cols: Columns | None = None
        self._memo: dict[bytes, float] = {}
        self.fit_id = ""
        self._state: SklearnState | None = None

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
        if not self.spec.threaded or len(a) <= self.spec.one_thread_rows:
            return self.spec.predict(self.estimator, a)
        with one_thread():
            return self.spec.predict(self.estimator, a)

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        assert self.cols is not None, "fit first"
        return self.predict_array(self.cols.frame(X))

    def predict_rows(self, xs: Sequence[Mapping[str, float]]) -> np.ndarray:
        """One ``predict`` on the matrix of the rows of ``xs`` not predicted before (filled and finite: scikit-learn's
        checks are skipped), each row's floats whatever rows are asked with it (:attr:`Spec.served`).  Rows
        predicted before come from a memo: a fitted model is a pure function, and serving
        repeats rows (a job set's placement features on every observation, a GPU's what-if entries every window),
        while one ``predict`` call costs 0.1-3 ms even for one row (docs/BENCHMARKS.md)."""
        import sklearn

        assert self.cols is not None, "fit first"
        a = self.cols.rows(xs)
        keys = [row.tobytes() for row in a]
        miss = [i for i, k in enumerate(keys) if k not in self._memo]
        new: dict[bytes, float] = {}
        if miss:
            served = self.spec.served
            with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
                pred = self.predict_array(a[miss]) if served is None else served(self.estimator, a[miss])
                new = dict(zip((keys[i] for i in miss), pred.tolist(), strict=True))
        out = np.array([new[k] if k in new else self._memo[k] for k in keys])
        if len(self._memo) + len(new) > MEMO_ROWS:
            self._memo.clear()
        self._memo.update(new)
        return out

    def predict_one(self, x: Mapping[str, float]) -> float:
        return float(self.predict_rows([x])[0])

    def to_state(self) -> SklearnState:
        """The fitted model as bytes (skops) with its name, seed, columns and fill values.  Made once per fit and
        remembered (a worker saves every interval, and an unchanged forest's skops cost about 0.1 s each time)."""
        assert self.cols is not None, "fit first"
        state = self._state
        if state is None or state.fit_id != self.fit_id:
            state = self._state = SklearnState(
                columns=self.cols.columns, fill=self.cols.fill.tolist(), fit_id=self.fit_id, name=self.name, seed=self.seed,
                skops=persist.dump_sklearn(self.estimator),
            )  # fmt: skip
        return state

    @classmethod
    def from_state(cls, state: SklearnState) -> SklearnModel:
        """What :meth:`to_state` made (only the trusted types of :data:`models.persist.SKLEARN_TRUSTED`)."""
        model = cls(state.name, state.seed)
        model.cols, model.fit_id, model._state = Columns.of_saved(state.columns, state.fill), state.fit_id, state
        model.estimator = persist.load_sklearn(state.skops)
        return model


class SklearnState(FittedState, tag="sklearn"):
    """A saved scikit-learn model: its columns, fill values and fit id, its name, seed and estimator (skops)."""

    name: str
    seed: int
    skops: bytes


MEMO_ROWS = 2048
"""Rows a served scikit-learn model remembers the prediction of (then it forgets them all and starts again)."""


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

    from models.zoo import treeseeds

    treeseeds.install()  # a tree's random state seeded again, not made anew (the same draws)
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

    from models.zoo import hgbbinning

    hgbbinning.install()  # weighted rows' bin thresholds in one pass per feature (scikit-learn 1.8-1.9 sorted 254 times)
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


HGB_VECTOR_ROWS = 32
"""Up to this many rows :func:`hgb_predict` walks a HistGradientBoosting model's trees for all rows and trees at once
(a few rows: 30-50 us against 360-430 us for scikit-learn's ``predict`` in :func:`one_thread`); from 80 rows on
scikit-learn's own walk is as fast or faster."""

_HGB_FLAT: weakref.WeakKeyDictionary[Any, tuple[Any, ...] | None] = weakref.WeakKeyDictionary()


def _hgb_flat(estimator: Any) -> tuple[Any, ...] | None:
    """A fitted HistGradientBoostingRegressor's trees as one node table (roots, feature, threshold, missing goes left,
    left, right with a leaf its own child, value, depth), kept per estimator; None where :func:`hgb_predict` leaves
    the model to scikit-learn (categorical features, a loss other than squared error)."""
    if estimator in _HGB_FLAT:
        return _HGB_FLAT[estimator]
    trees = [p.nodes for ps in estimator._predictors for p in ps]
    flat: tuple[Any, ...] | None = None
    if (
        trees
        and estimator.loss == "squared_error"
        and estimator.n_trees_per_iteration_ == 1
        and estimator._preprocessor is None
        and not any(t["is_categorical"].any() for t in trees)
    ):
        sizes = [len(t) for t in trees]
        offsets = np.concatenate([[0], np.cumsum(sizes[:-1])]).astype(np.intp)
        nodes = np.concatenate(trees)
        base, here, leaf = np.repeat(offsets, sizes), np.arange(len(nodes)), nodes["is_leaf"].astype(bool)
        flat = (
            offsets, nodes["feature_idx"].astype(np.intp), nodes["num_threshold"], nodes["missing_go_to_left"].astype(bool),
            np.where(leaf, here, nodes["left"].astype(np.intp) + base), np.where(leaf, here, nodes["right"].astype(np.intp) + base),
            nodes["value"], int(nodes["depth"].max()),
        )  # fmt: skip
    _HGB_FLAT[estimator] = flat
    return flat


def hgb_predict(estimator: Any, a: np.ndarray) -> np.ndarray:
    """A HistGradientBoostingRegressor's ``predict`` (the same floats).  Up to :data:`HGB_VECTOR_ROWS` rows, every
    tree is walked for every row at once, one level a step, as scikit-learn's ``_predict_one_from_raw_data`` walks
    one (a missing value goes the node's missing side, else left when at most the threshold), and the leaves are
    added to the baseline one tree after another, as its ``_raw_predict`` adds them; scikit-learn's ``predict`` was
    its input check, fitted check and one OpenMP call per tree, 50 of them (about 0.4 ms for one row).  More rows,
    or a model it does not cover, go to scikit-learn, on one thread."""
    flat = _hgb_flat(estimator) if len(a) <= HGB_VECTOR_ROWS else None
    if flat is None:
        with one_thread():
            return _predict(estimator, a)
    roots, feature, threshold, nan_left, left, right, value, depth = flat
    x = np.asarray(a, dtype=np.float64)
    idx = np.broadcast_to(roots, (len(x), len(roots)))
    rows = np.arange(len(x))[:, None]
    for _ in range(depth):
        v = x[rows, feature[idx]]
        idx = np.where(np.where(np.isnan(v), nan_left[idx], v <= threshold[idx]), left[idx], right[idx])
    terms = np.empty((len(x), len(roots) + 1))
    terms[:, 0] = estimator._baseline_prediction[0, 0]
    terms[:, 1:] = value[idx]
    return np.add.accumulate(terms, axis=1)[:, -1]  # accumulate adds in order: the floats of one-by-one sums


def pipeline_predict(pipeline: Any, a: np.ndarray, *, alone: bool = False) -> np.ndarray:
    """A pipeline's ``predict`` (the same floats), its scalers and linear or kernel SVR last steps computed as
    scikit-learn computes them, without its per-call checks of input, fitted state and tags, which took most of a
    pipeline's ``predict`` of a few rows in a worker's profile (docs/BENCHMARKS.md); other steps ask their own.
    ``alone``: each row's floats those of ``predict`` of that row alone (:func:`pipeline_rows`)."""
    x = np.array(a, dtype=np.float64, order="C")  # what the scaler's input check makes (a copy)
    for _, step in pipeline.steps[:-1]:
        x = _transform(step, x)
    return np.asarray(_final_predict(pipeline.steps[-1][1], x, alone), dtype=float)


def pipeline_rows(pipeline: Any, a: np.ndarray) -> np.ndarray:
    """:func:`pipeline_predict` of served rows: a linear last step multiplies each row on its own.  OpenBLAS's
    product of a matrix and a vector adds a row's terms in an order that depends on the rows around it (and on its
    threads), so a row served next to others could differ in the last bits from the same row served alone
    (measured: 13 of 40 LinearRegression rows); the scalers and feature maps before it are element by element."""
    return pipeline_predict(pipeline, a, alone=True)


def _transform(step: Any, x: np.ndarray) -> np.ndarray:
    from sklearn.preprocessing import StandardScaler

    if type(step) is not StandardScaler:
        return np.ascontiguousarray(step.transform(x), dtype=np.float64)
    if step.with_mean:
        x -= step.mean_
    if step.with_std:
        x /= step.scale_
    return x


def _final_predict(estimator: Any, x: np.ndarray, alone: bool = False) -> np.ndarray:
    from sklearn.linear_model import LinearRegression
    from sklearn.svm import SVR, LinearSVR

    kind = type(estimator)
    if kind in (LinearRegression, LinearSVR):  # LinearModel._decision_function
        coef = estimator.coef_ if estimator.coef_.ndim == 1 else estimator.coef_.T
        if alone and len(x) > 1:
            return np.concatenate([x[i : i + 1] @ coef for i in range(len(x))]) + estimator.intercept_
        return x @ coef + estimator.intercept_
    if kind is SVR and not estimator._sparse and not callable(estimator.kernel):  # BaseLibSVM.predict, dense input
        return estimator._dense_predict(x)
    return estimator.predict(x)


# How each scikit-learn model is fitted on a :class:`Prepared` training set: the distinct feature rows, each
# weighted by its copies (see SKLEARN); the estimator fitted is returned.


def fit_weighted(estimator: Any, data: Prepared) -> Any:
    """The distinct rows, weighted by their copies (``sample_weight``)."""
    a, t, weight = data.distinct()
    if weight is None:
        return estimator.fit(a, t)
    return estimator.fit(a, t, sample_weight=weight)


def fit_subsampled(estimator: Any, data: Prepared) -> Any:
    """:func:`fit_weighted` for a model fitted on a random subsample of the rows (GradientBoosting's ``subsample``):
    on a single distinct row the subsample leaves no row out of the bag to score, which scikit-learn divides by, so
    that row is fitted whole."""
    if len(data.distinct()[0]) < 2:
        estimator.set_params(subsample=1.0)
    return fit_weighted(estimator, data)


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


def fit_forest(forest: Any, data: Prepared) -> Any:
    """:func:`fit_weighted` for a forest, each tree made as a copy of one configured tree.

    scikit-learn makes each tree by ``clone`` and ``set_params`` of its template, both through ``get_params``,
    which reads the constructor's signature with :mod:`inspect`: about a tenth of a 25-tree fit of 800 rows
    (docs/BENCHMARKS.md, "Models").  A copy gets the same parameters and the same random state (scikit-learn's one
    draw for a tree's ``random_state``), so the forest is the same tree for tree
    (``tests/unit/test_models_contract.py``)."""
    from sklearn.base import clone

    template: Any = None

    def make_estimator(append: bool = True, random_state: Any = None) -> Any:
        nonlocal template
        if template is None:
            template = clone(forest.estimator_)
            template.set_params(**{p: getattr(forest, p) for p in forest.estimator_params})
        tree = object.__new__(type(template))
        tree.__dict__.update(template.__dict__)
        if random_state is not None:
            tree.random_state = random_state.randint(np.iinfo(np.int32).max)
        if append:
            forest.estimators_.append(tree)
        return tree

    forest._make_estimator = make_estimator
    try:
        return fit_weighted(forest, data)
    finally:
        del forest._make_estimator


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
    one_thread_rows: int = 0
    """Up to this many rows its ``predict`` runs on one thread whatever the limits, and is asked without the context
    (14 us, against 6 us for a pipeline's :func:`pipeline_predict` of two rows): OpenBLAS multiplies a matrix by a
    vector on one thread below 9,216 elements (``GEMM_MULTITHREAD_THRESHOLD`` 4 x 2,304), libsvm has no threads."""
    served: Callable[[Any, np.ndarray], np.ndarray] | None = None
    """How the rows it serves are predicted (:meth:`SklearnModel.predict_rows`), each row's floats those of that row
    alone, on one thread (:func:`pipeline_rows`); None: ``predict``, whose rows never depend on each other."""


FEW_ROWS = 4
"""Rows a linear model or SVR predicts on one thread (:attr:`Spec.one_thread_rows`): 4 rows of SVR-poly's feature map
of 60 columns (1,890 monomials) are 7,560 elements.  Serving asks one or two rows a call."""


FOREST_LEAF_SHARE = 0.0005
"""A forest's leaves hold at least this share of its rows (scikit-learn's fractional ``min_samples_leaf``: one row up
to 2,000 rows, 5 at the refit's 10,000): at most about 2,000 leaves a tree, whatever the rows."""


def _rf(seed: int) -> Any:
    from sklearn.ensemble import RandomForestRegressor

    from models.zoo import treeseeds

    treeseeds.install()  # each tree's two random states seeded again, not made anew (the same draws, 4-16 % less CPU)
    return RandomForestRegressor(n_estimators=20, max_features=0.5, min_samples_leaf=FOREST_LEAF_SHARE, random_state=seed, n_jobs=1)


def _extra(seed: int) -> Any:
    from sklearn.ensemble import ExtraTreesRegressor

    from models.zoo import treeseeds

    treeseeds.install()
    return ExtraTreesRegressor(n_estimators=25, max_features=0.7, min_samples_leaf=FOREST_LEAF_SHARE, random_state=seed, n_jobs=1)


SKLEARN: dict[str, Spec] = {
    "LinearRegression": Spec(_linear, fit_scaled_weighted, pipeline_predict, one_thread_rows=FEW_ROWS, served=pipeline_rows),
    "SVR-linear": Spec(_svr_linear, fit_kernel_svr, pipeline_predict, one_thread_rows=FEW_ROWS, served=pipeline_rows),
    "SVR-poly": Spec(_svr_poly, fit_kernel_svr, pipeline_predict, one_thread_rows=FEW_ROWS, served=pipeline_rows),
    "DecisionTree": Spec(_tree, fit_leaf_weighted, tree_predict, threaded=False),
    "KNN": Spec(_knn, fit_neighbours, pipeline_predict),
    "GradientBoosting": Spec(_gbr, fit_subsampled),
    "HistGradientBoosting": Spec(_hgb, predict=hgb_predict, threaded=False),
    "HistGradientBoosting-monotone": Spec(_hgb, fit_monotone, hgb_predict, threaded=False),
    "RandomForest": Spec(_rf, fit_forest, forest_predict, threaded=False),
    "ExtraTrees": Spec(_extra, fit_forest, forest_predict, threaded=False),
}
"""The scikit-learn models.  Every one is fitted on the distinct feature rows (weights = copies; KNN: distinct
points, mean target): exact for LinearRegression and the MSE trees (DecisionTree; ExtraTrees in distribution); RandomForest's
bootstrap and GradientBoosting's subsample draw distinct rows, and the SVRs' epsilon-insensitive loss of a
mean target is not the summed loss of the copies, so those are close to, not equal to, the duplicated fit."""

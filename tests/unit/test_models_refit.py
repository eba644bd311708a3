"""Refit over many observations: exact compression of duplicated rows, primal SVRs, capped cross-validation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from models import zoo
from models.crossval import cross_validate, stratified_subsample
from models.datasets import Sample
from models.zoo import frames


def _duplicated(seed: int = 0, distinct: int = 40, copies: int = 6) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = pd.DataFrame({"a": rng.uniform(0, 10, distinct), "b": rng.uniform(-5, 5, distinct), "fam=x": 1.0})
    X = pd.concat([base] * copies, ignore_index=True)
    y = 3 * X["a"].to_numpy() - 2 * X["b"].to_numpy() + rng.normal(0, 2.0, len(X))
    return X, y


def test_compress_keeps_first_occurrence_order_and_means() -> None:
    a = np.array([[2.0, 0.0], [1.0, 1.0], [2.0, -0.0], [1.0, 1.0]])
    rows, t, w = frames.compress(a, np.array([1.0, 2.0, 3.0, 6.0]))
    assert rows.tolist() == [[2.0, 0.0], [1.0, 1.0]] and t.tolist() == [2.0, 4.0] and w.tolist() == [2.0, 2.0]
    same, _, none = frames.compress(a[:2], np.array([1.0, 2.0]))
    assert none is None and same.tolist() == a[:2].tolist()


@pytest.mark.parametrize("name", ["LinearRegression", "DecisionTree"])
def test_compressed_fit_equals_fit_on_duplicates(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    X, y = _duplicated()
    fast = zoo.make_batch(name).fit(X, y)
    monkeypatch.setattr(frames.Prepared, "distinct", lambda self: (self.a, self.y, None))  # every copy, unweighted
    slow = zoo.make_batch(name).fit(X, y)
    if name == "DecisionTree":  # same fit of the rows; between rows, float sums may break split ties differently
        probe = X.iloc[:40]
    else:
        probe = pd.DataFrame({"a": np.linspace(0, 10, 25), "b": np.linspace(-5, 5, 25)[::-1], "fam=x": 1.0})
    np.testing.assert_allclose(fast.predict(probe), slow.predict(probe), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("rows", [30, 400])  # 30 rows: dual (libsvm, kernel); 400 rows: primal on the feature map
def test_svr_poly_primal_and_dual_solve_the_same_problem(rows: int) -> None:
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVR

    rng = np.random.default_rng(1)
    X = pd.DataFrame({"a": rng.uniform(0, 10, rows), "b": rng.uniform(-5, 5, rows)})
    y = (X["a"] - 5) ** 2 + 2 * X["a"] * X["b"] + rng.normal(0, 1.0, rows)
    m = zoo.make_batch("SVR-poly").fit(X, y)
    xs = StandardScaler().fit_transform(X.to_numpy())
    ref = SVR(kernel="poly", degree=2, coef0=1.0, C=10.0, epsilon=1.0, gamma=1 / (2 * xs.var()), tol=1e-6).fit(xs, y)
    pred, want = m.predict(X), ref.predict(xs)
    assert np.mean(np.abs(pred - want)) < 0.05 * np.mean(np.abs(want - np.mean(want)))


def test_stratified_subsample_keeps_every_group() -> None:
    groups = [f"g{i % 50}" for i in range(5000)]
    idx = stratified_subsample(groups, 500, seed=3)
    assert 450 <= len(idx) <= 550 and len({groups[i] for i in idx}) == 50
    assert list(idx) == sorted(set(idx.tolist()))
    assert stratified_subsample(groups[:100], 500).tolist() == list(range(100))


def test_capped_cross_validation_scores_every_row() -> None:
    rng = np.random.default_rng(0)
    samples = [
        Sample(f"j{i % 30}", (f"c{i % 7}",), float(v), f"g{i % 30}", "", {"E": float(v) + rng.normal(), "T": rng.normal()})
        for i, v in enumerate(rng.uniform(0, 50, 900))
    ]  # fmt: skip
    capped = cross_validate(samples, ["observed"], models=("LinearRegression",), categories=("1",), k=3, max_rows=300)
    full = cross_validate(samples, ["observed"], models=("LinearRegression",), categories=("1",), k=3)
    assert capped[0].trained <= 310 and full[0].trained == 900
    assert capped[0].samples == full[0].samples == 900 and np.all(capped[0].oof != 0)
    assert capped[0].mae == pytest.approx(full[0].mae, rel=0.2)


def test_knn_on_duplicates_frame_and_row_agree() -> None:
    """On copies of the same points a KNN's neighbours are distinct points (compressed), so the frame and the
    serving rows, batched or one by one, predict the same (before compression, 5 of 8 equidistant copies were
    picked arbitrarily)."""
    X, y = _duplicated(copies=8)
    m = zoo.make_batch("KNN").fit(X, y)
    rows = X.iloc[:40].to_dict("records")
    frame = m.predict(X.iloc[:40])
    np.testing.assert_allclose(frame, m.predict_rows(rows), rtol=1e-9)
    np.testing.assert_allclose(frame, [m.predict_one(r) for r in rows], rtol=1e-9)
    knn = m.estimator.steps[-1][1]
    assert knn.n_samples_fit_ == 40  # the distinct points, not the 320 copies


def _sorted_groups_reference(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Groups of identical rows by a sort of their bytes, numbered in order of first occurrence (what
    :func:`frames.row_groups` replaced)."""
    _, first, inverse = np.unique(rows.view(np.dtype((np.void, 8 * rows.shape[1])))[:, 0], return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return rank[np.ravel(inverse)], first[order]


def _rows_with_copies(rng: np.random.Generator) -> np.ndarray:
    distinct = int(rng.integers(1, 300))
    base = rng.normal(size=(distinct, int(rng.integers(1, 40)))).round(int(rng.integers(0, 3)))
    base[rng.random(base.shape) < rng.choice([0.0, 0.1, 0.6])] = np.nan
    base[:, 0] *= rng.choice([1.0, 2.0**40, 0.0])  # values apart only in their exponent bits, or -0.0 against 0.0
    a = base[rng.integers(0, distinct, int(rng.integers(2, 3000)))]
    a[rng.random(a.shape) < 0.05] *= -1.0  # -0.0 where 0.0 was
    return a


def test_row_groups_and_what_uses_them_equal_a_sort_of_the_rows() -> None:
    from models.crossval import distinct_rows, distinct_rows_of

    rng = np.random.default_rng(3)
    for _ in range(200):
        a = _rows_with_copies(rng)
        rows = a + 0.0
        codes, first = frames.row_groups(rows)
        want_codes, want_first = _sorted_groups_reference(rows)
        assert codes.tolist() == want_codes.tolist() and first.tolist() == want_first.tolist()
        y = rng.normal(size=len(a))
        got, want = (
            frames.compress(a, y),
            (a[want_first], np.bincount(want_codes, weights=y) / np.bincount(want_codes), np.bincount(want_codes).astype(float)),
        )
        if len(want_first) == len(a):
            want = (a, y, None)
        assert all(np.array_equal(g, w, equal_nan=True) if w is not None else g is None for g, w in zip(got, want, strict=True))
        _, sorted_first, sorted_inverse = np.unique(
            rows.view(np.dtype((np.void, 8 * rows.shape[1])))[:, 0], return_index=True, return_inverse=True
        )
        grouped = distinct_rows_of(a)
        if len(sorted_first) == len(a):
            assert grouped is None
        else:
            assert grouped is not None
            assert (
                grouped[0].tobytes() == rows[sorted_first].tobytes() and grouped[1].tolist() == np.ravel(sorted_inverse).tolist()
            )
        frame = pd.DataFrame(a, columns=[f"c{j}" for j in range(a.shape[1])])
        assert distinct_rows(frame) == len(np.unique(np.where(np.isnan(a), np.inf, a), axis=0))


def test_row_groups_sort_the_rows_when_their_hashes_collide(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _rows_with_copies(np.random.default_rng(4)) + 0.0
    monkeypatch.setattr(frames, "_hash_multipliers", lambda columns: np.zeros(columns, dtype=np.uint64))  # one hash
    codes, first = frames.row_groups(rows)
    want_codes, want_first = _sorted_groups_reference(rows)
    assert len(want_first) > 1 and codes.tolist() == want_codes.tolist() and first.tolist() == want_first.tolist()


def test_feature_frames_equal_the_features_of_every_sample() -> None:
    from models.crossval import feature_frames
    from models.features import restrict

    rng = np.random.default_rng(5)
    types = ["resnet (batch size 32)", "vgg (batch size 16)", "lstm", "bert (batch size 8)"]
    profiles = {
        t: [
            {"E": float(v), "S": float(rng.uniform(0, 100)), "throughput": float(rng.uniform(1, 50))}
            for v in rng.uniform(50, 300, 3)
        ]
        for t in types
    }
    profiles["lstm"].append({"E": -0.0, "S": float("nan"), "throughput": None})  # a signed zero, a NaN, a gap
    samples = []
    for i in range(600):
        job, *co = rng.choice(types, int(rng.integers(2, 4)))
        solo = dict(profiles[job][int(rng.integers(0, len(profiles[job])))])  # a fresh dict, as each observation's
        co_solos = tuple(dict(profiles[c][int(rng.integers(0, len(profiles[c])))]) for c in co)
        pcts = {p: float(rng.normal(0, 20)) for p in "ESVRWM"}
        samples.append(Sample(str(job), tuple(map(str, co)), float(rng.normal(10, 5)), f"g{i % 7}", "v100", pcts, solo, co_solos))
    for mode in ("observed", "placement"):
        full = pd.DataFrame([s.features(mode, "all") for s in samples])  # every sample's own features
        for cat, got in feature_frames(samples, mode).items():
            want = full[list(restrict(dict.fromkeys(full.columns, 0.0), cat))]
            cols = sorted(map(str, want.columns))
            assert sorted(map(str, got.columns)) == cols
            assert (
                got[cols].to_numpy(dtype=float, na_value=np.nan).tobytes()
                == want[cols].to_numpy(dtype=float, na_value=np.nan).tobytes()
            )

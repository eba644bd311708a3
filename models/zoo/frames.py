"""What the batch models share: sorted columns and fill values (:class:`Columns`), distinct rows (:func:`compress`),
a prepared training set (:class:`Prepared`), one-thread fits (:func:`one_thread`) and fit ids (:func:`new_fit_id`)."""

from __future__ import annotations

import math
import uuid
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import numpy as np
import pandas as pd


class Columns:
    """Sorted columns and fill values learned at fit; frames and dicts become float arrays."""

    def __init__(self, X: pd.DataFrame) -> None:
        columns = sorted(str(c) for c in X.columns)
        frame = X.reindex(columns=columns)
        text = [c for c, kind in frame.dtypes.items() if not pd.api.types.is_numeric_dtype(kind)]
        if text:  # only columns that are not numbers already (to_numeric column by column costs 0.5 ms each)
            frame[text] = frame[text].apply(pd.to_numeric, errors="coerce")
        self._init(columns, frame.to_numpy(dtype=float, na_value=np.nan))

    def _init(self, columns: list[str], raw: np.ndarray) -> None:
        self.columns = columns
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN column: fill 0
            med = np.nanmedian(raw, axis=0) if len(raw) else np.full(len(columns), np.nan)
        ind = np.array(["=" in c for c in columns], dtype=bool)
        self.fill = np.where(ind | np.isnan(med), 0.0, med).astype(float)
        self.index = {c: i for i, c in enumerate(self.columns)}

    @classmethod
    def of_array(cls, columns: list[str], raw: np.ndarray) -> Columns:
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
    def of_saved(cls, columns: Sequence[str], fill: Sequence[float]) -> Columns:
        self = cls.__new__(cls)
        self.columns = list(columns)
        self.fill = np.array(fill, dtype=float)
        self.index = {c: i for i, c in enumerate(self.columns)}
        return self


def row_groups(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The groups of identical rows of ``rows`` (2-D float64, at least one column; identical: the same
    bits, so ``+ 0.0`` first where -0.0 and 0.0 are one value): per row its group, numbered in the order of first
    occurrence, and per group the index of its first row.

    Rows are grouped by a hash of their bits (each value's 64 bits, the high half xor-ed into the low, times a fixed
    odd number per column, summed modulo 2**64) and the grouping is checked bit for bit; on a collision the rows are
    sorted as bytes instead (``np.unique`` of their bytes, which took 3.5-3.9 ms for 10,000 rows of 32 columns against
    0.8-1.2 ms).

    >>> codes, first = row_groups(np.array([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0], [5.0, 6.0]]))
    >>> codes.tolist(), first.tolist()
    ([0, 1, 0, 2], [0, 1, 3])
    """
    rows = np.ascontiguousarray(rows, dtype=float)
    bits = rows.view(np.uint64)
    codes, _ = pd.factorize((bits ^ (bits >> np.uint64(32))) @ _hash_multipliers(bits.shape[1]))
    new = np.empty(len(codes), dtype=bool)
    new[:1] = True
    new[1:] = codes[1:] > np.maximum.accumulate(codes)[:-1]  # groups are numbered as they first occur
    first = np.flatnonzero(new)
    if np.array_equal(bits[first][codes], bits):
        return codes, first
    _, first, inverse = np.unique(rows.view(np.dtype((np.void, 8 * rows.shape[1])))[:, 0], return_index=True, return_inverse=True)
    order = np.argsort(first)  # groups in order of first occurrence
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return rank[np.ravel(inverse)], first[order]


def _hash_multipliers(columns: int) -> np.ndarray:
    """:func:`row_groups`' fixed odd multiplier per column."""
    return np.random.default_rng(0x5EED).integers(1, 2**63, size=columns, dtype=np.uint64) | np.uint64(1)


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
    if len(a) < 2 or a.shape[1] == 0:
        return a, y, None
    g, first = row_groups(np.ascontiguousarray(a, dtype=float) + 0.0)  # + 0.0: -0.0 and 0.0 are one value
    if len(first) == len(a):
        return a, y, None
    count = np.bincount(g).astype(float)
    return a[first], np.bincount(g, weights=y) / count, count


class Prepared:
    """A training set as the batch models use it: sorted columns, fill values, the filled array, the target,
    and (computed once, on demand) its distinct rows.  Cross-validation prepares each fold once for all models."""

    def __init__(self, cols: Columns, a: np.ndarray, y: np.ndarray) -> None:
        self.cols, self.a, self.y = cols, a, y
        self._distinct: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None

    @classmethod
    def of_frame(cls, X: pd.DataFrame, y: Sequence[float]) -> Prepared:
        cols = Columns(X)
        return cls(cols, cols.frame(X), np.asarray(y, dtype=float))

    @classmethod
    def of_array(cls, columns: list[str], raw: np.ndarray, y: np.ndarray) -> Prepared:
        cols = Columns.of_array(columns, raw)
        return cls(cols, cols.filled(raw), np.asarray(y, dtype=float))

    def distinct(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if self._distinct is None:
            self._distinct = compress(self.a, self.y)
        return self._distinct


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


class FittedState(msgspec.Struct):
    """What every saved batch model holds besides its own: its columns, their fill values and its fit id."""

    columns: list[str]
    fill: list[float]
    fit_id: str


def new_fit_id() -> str:
    """A fit's identity: its saved state is made once per fit (``to_state`` of the batch models)."""
    return uuid.uuid4().hex

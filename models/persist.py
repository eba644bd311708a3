"""Estimators as bytes and the models' state on disk, without unpickling untrusted data.

Every estimator becomes bytes in memory, in its own safe format:

* scikit-learn: skops, loading only the types listed in :data:`SKLEARN_TRUSTED`
  (anything else in the bytes makes the load fail);
* torch: ``state_dict`` loaded with ``weights_only=True`` (see :mod:`models.zoo.torchmlp`);
* river: river has no format besides pickle, so river learners are pickled and the
  bytes are signed with HMAC-SHA256 (:func:`dump_signed`).  The key of a state directory lives in it
  (:func:`state_key`, created with mode 0600 on first use); bytes whose
  signature does not verify with it are refused *before* anything is unpickled.
  A model directory copied from another machine or edited by hand therefore
  does not load; the worker starts those learners afresh.

Everything else (the models' records, columns, baselines) is msgspec Structs; the whole state
(:class:`models.state.EnvironmentState`, estimators' bytes included) is msgpack, written and read by
:func:`write_state` and :func:`read_state`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import secrets
from pathlib import Path
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")

SKLEARN_TRUSTED = [
    "sklearn.pipeline.Pipeline",
    "sklearn.preprocessing._data.StandardScaler",
    "sklearn.linear_model._base.LinearRegression",
    "sklearn.svm._classes.SVR",
    "sklearn.svm._classes.LinearSVR",
    "sklearn.preprocessing._polynomial.PolynomialFeatures",
    "sklearn.tree._classes.DecisionTreeRegressor",
    "sklearn.tree._tree.Tree",
    "sklearn.neighbors._regression.KNeighborsRegressor",
    "sklearn.neighbors._kd_tree.KDTree",
    "sklearn.neighbors._ball_tree.BallTree",
    "sklearn.metrics._dist_metrics.EuclideanDistance64",
    "sklearn.ensemble._gb.GradientBoostingRegressor",
    "sklearn.ensemble._hist_gradient_boosting.gradient_boosting.HistGradientBoostingRegressor",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    "sklearn.ensemble._hist_gradient_boosting.binning._BinMapper",
    "sklearn.ensemble._forest.RandomForestRegressor",
    "sklearn.ensemble._forest.ExtraTreesRegressor",
    "sklearn._loss.loss.HalfSquaredError",
    "sklearn._loss.link.IdentityLink",
    "sklearn._loss.link.Interval",
    "sklearn.dummy.DummyRegressor",
    "sklearn.ensemble._gb_losses.LeastSquaresError",
    "numpy.random.mtrand.RandomState",
    "numpy.random._mt19937.MT19937",
    "builtins.slice",
]
"""Types a skops file may contain; the load fails on anything else."""

KEY_FILE = "models.hmac.key"


class SignatureError(ValueError):
    """A signed file's HMAC does not verify: it was not written by this state directory."""


def state_key(state_dir: Path) -> bytes:
    """The HMAC key of a state directory, created (0600) on first use."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / KEY_FILE
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(32))
    return path.read_bytes()


def sign(data: bytes, key: bytes) -> str:
    """The HMAC-SHA256 of ``data`` with ``key`` (hex)."""
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def dump_signed(obj: Any, key: bytes) -> tuple[bytes, str]:
    """``obj`` pickled, and its signature (:func:`sign`)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return data, sign(data, key)


def load_signed(data: bytes, signature: str, key: bytes) -> Any:
    """Unpickle ``data`` only if ``signature`` verifies with ``key``; else raise :class:`SignatureError`.

    >>> data, sig = dump_signed({"a": 1}, b"k" * 32)
    >>> load_signed(data, sig, b"k" * 32)
    {'a': 1}
    """
    if not hmac.compare_digest(sign(data, key), signature):
        raise SignatureError("signature does not verify; refusing to unpickle")
    return pickle.loads(data)


def dump_sklearn(estimator: Any) -> bytes:
    import skops.io as sio

    return sio.dumps(estimator)


def load_sklearn(data: bytes) -> Any:
    """What :func:`dump_sklearn` wrote, loading only the types of :data:`SKLEARN_TRUSTED` (else
    :class:`SignatureError`)."""
    import skops.io as sio

    types = sio.get_untrusted_types(data=data)
    untrusted = [t for t in types if t not in SKLEARN_TRUSTED]
    if untrusted:
        raise SignatureError(f"refusing types not on the trusted list: {', '.join(untrusted)}")
    return sio.loads(data, trusted=types)


def encode_state(obj: Any) -> bytes:
    """``obj`` (msgspec Structs, builtins) as msgpack: estimators' bytes as they are."""
    return msgspec.msgpack.encode(obj)


def decode_state(data: bytes, type: type[T]) -> T:
    """What :func:`encode_state` wrote, decoded and validated as ``type`` (``msgspec.ValidationError`` or
    ``msgspec.DecodeError`` on anything else)."""
    return msgspec.msgpack.decode(data, type=type)


def write_state(path: Path, obj: Any) -> None:
    """:func:`encode_state` of ``obj`` to ``path``, atomically (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(encode_state(obj))
    os.replace(tmp, path)


def read_state(path: Path, type: type[T]) -> T:
    """What :func:`write_state` wrote, decoded and validated as ``type`` (a clear error on anything else)."""
    return decode_state(path.read_bytes(), type)

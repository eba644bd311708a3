"""Local persistence without unpickling untrusted data.

* scikit-learn: skops, loading only the types listed in :data:`SKLEARN_TRUSTED`
  (anything else in the file makes the load fail);
* torch: ``state_dict`` loaded with ``weights_only=True`` (see :mod:`models.zoo.torchmlp`);
* river: river has no format besides pickle, so river learners are pickled and the
  file is signed with HMAC-SHA256.  The key lives in the state directory
  (:func:`state_key`, created with mode 0600 on first use); a file whose
  signature does not verify with it is refused *before* anything is unpickled.
  A model directory copied from another machine or edited by hand therefore
  does not load; the worker starts those learners afresh.

Everything else (the models' records, columns, baselines) is msgspec Structs, written and read as JSON by
:func:`write_state` and :func:`read_state`, the one JSON path of internal state.
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


def dump_signed(path: Path, obj: Any, key: bytes) -> None:
    """Pickle ``obj`` to ``path`` with an HMAC-SHA256 signature in ``path.sig``."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.with_suffix(path.suffix + ".sig").write_text(hmac.new(key, data, hashlib.sha256).hexdigest())


def load_signed(path: Path, key: bytes) -> Any:
    """Unpickle ``path`` only if its signature verifies with ``key``; else raise :class:`SignatureError`."""
    data = path.read_bytes()
    sig_path = path.with_suffix(path.suffix + ".sig")
    if not sig_path.exists():
        raise SignatureError(f"{path}: no signature")
    expected = hmac.new(key, data, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, sig_path.read_text().strip()):
        raise SignatureError(f"{path}: signature does not verify; refusing to unpickle")
    return pickle.loads(data)


def dump_sklearn(path: Path, estimator: Any) -> None:
    import skops.io as sio

    sio.dump(estimator, path)


def load_sklearn(path: Path) -> Any:
    import skops.io as sio

    untrusted = [t for t in sio.get_untrusted_types(file=path) if t not in SKLEARN_TRUSTED]
    if untrusted:
        raise SignatureError(f"{path}: refusing types not on the trusted list: {', '.join(untrusted)}")
    return sio.load(path, trusted=[t for t in sio.get_untrusted_types(file=path)])


def write_state(path: Path, obj: Any) -> None:
    """``obj`` (msgspec Structs, dataclasses, builtins) as JSON to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(obj))


def read_state(path: Path, type: type[T]) -> T:
    """What :func:`write_state` wrote, decoded and validated as ``type`` (a clear error on anything else)."""
    return msgspec.json.decode(path.read_bytes(), type=type)

"""Independent fits of a refit on joblib's process pool (loky backend), reused by every refit of the process.

A refit is a plain function (``models.refit.run_refit``) that the stream runs in an executor thread; inside it,
:class:`Fits` runs the cross-validation fits (model x category x mode x fold) and the final fits on
``workers`` processes:

* the workers are joblib's reusable loky executor: started on first use, kept while idle for ``IDLE_S``
  seconds, each limited to one BLAS/OpenMP thread, run at ``NICE`` steps of niceness below their owner's
  priority (a refit is background work: it must not take the cores a stream's event loop needs), warmed by one
  small fit of every batch model, and ended (SIGTERM) when the process that owns them dies;
* a refit's arrays (features per mode x category, target, fold indices) are written once, one ``.npy`` each
  (numeric: nothing a worker loads is unpickled), to a private directory in ``/dev/shm`` where there is
  one; a task carries the directory's name, and each worker memory-maps them and prepares each fold's
  training set once per refit (:meth:`Store.cached`);
* when a worker dies (loky's ``TerminatedWorkerError``) or a fit is not done within ``timeout`` seconds
  (joblib then kills the workers), the batch runs again in-process: a refit never hangs on the pool;
* once the process is stopping (:func:`stop`), a refit gives up at its next fit (:class:`Stopped`): a stopping
  worker does not wait seconds for a result it would not use.

Only our own processes exchange pickles here (task arguments, fitted models); nothing from a topic or a file.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import joblib
import numpy as np

IDLE_S = 3600
"""Seconds an idle worker waits for the next refit before it exits (the stream refits every few minutes)."""
NICE = 10
"""Niceness the workers add to their owner's (``os.nice``; Linux caps it at 19).  On a machine whose cores the worker
shares with its own event loop, the broker and producers, a refit's fits at the owner's priority compete with them
for the 20 s of a 10,000-GPU refit, while stage 1's lag grew; niced, they take what the others leave (an idle
machine runs them as fast: the kernel's weights only matter when the cores are contended).  0 keeps the owner's
priority."""
WARM_FITS = True
"""Workers fit every batch model once on a small set at start (tests turn it off to start pools quickly)."""
_CACHE: dict[str, dict[Any, Any]] = {}
"""Per store id: what the tasks of a refit derived from its arrays in this process (prepared folds)."""
_STOPPING = threading.Event()


class Stopped(Exception):
    """The process is stopping (:func:`stop`): the fits still to run were not run."""


def stop() -> None:
    """From now on every :meth:`Fits.run` of this process gives up between two fits, raising :class:`Stopped`."""
    _STOPPING.set()


def resume() -> None:
    """Undo :func:`stop` (tests)."""
    _STOPPING.clear()


def resolve(workers: int | None) -> int:
    """``None`` or < 1: all cores this process may use."""
    return joblib.cpu_count() if workers is None or workers < 1 else int(workers)


@dataclass(frozen=True)
class Store:
    """A refit's arrays by name, and what each process derives from them (:meth:`cached`).

    Published for workers (``path``: a private directory of one ``.npy`` per array, :func:`save_arrays`), it
    pickles as its id and path only; a worker memory-maps the files once per refit."""

    id: str
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)
    path: str | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __reduce__(self) -> tuple[Any, ...]:
        assert self.path is not None, "only a published store goes to the workers"
        return _opened, (self.id, self.path)

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        """A value computed once per refit and process (e.g. a fold's prepared training set)."""
        c = _CACHE.setdefault(self.id, {})
        v = c.get(key)
        if v is None:
            v = c[key] = make()
        return v


def _opened(id: str, path: str) -> Store:
    """A worker's copy of a published store: the arrays memory-mapped once per refit (the last two refits kept)."""
    while id not in _CACHE and len(_CACHE) >= 2:
        del _CACHE[next(iter(_CACHE))]
    return Store(id, Store(id).cached("arrays", lambda: load_arrays(path)))


def save_arrays(directory: str, arrays: Mapping[str, np.ndarray]) -> None:
    """One ``.npy`` per array (names are the refit's own: ``x_<mode>_<cat>``, ``y``, ...)."""
    for name, a in arrays.items():
        np.save(os.path.join(directory, f"{name}.npy"), np.ascontiguousarray(a), allow_pickle=False)


def load_arrays(directory: str) -> dict[str, np.ndarray]:
    """:func:`save_arrays`' arrays, memory-mapped (numeric only: nothing is unpickled)."""
    return {
        f[: -len(".npy")]: np.load(os.path.join(directory, f), mmap_mode="r")
        for f in sorted(os.listdir(directory))
        if f.endswith(".npy")
    }


def _init_worker(owner: int, warm_fits: bool, nice: int = 0) -> None:
    from config.process import exit_with_parent

    exit_with_parent(owner)  # loky's workers would outlive an owner killed by SIGKILL
    if nice > 0:
        os.nice(nice)
    if not warm_fits:
        return
    import pandas as pd

    from models import zoo

    rng = np.random.default_rng(0)  # one small fit of every batch model: imports and first-call set-up, once
    X = pd.DataFrame(rng.normal(size=(150, 5)), columns=["a", "b", "c", "d", "e"]).assign(**{"f=x": 1.0})
    X = pd.concat([X, X], ignore_index=True)  # duplicated rows, as in placement mode
    for name in zoo.BATCH:
        zoo.make_batch(name).fit(X, rng.normal(size=len(X)))


def _pool(workers: int, timeout: float) -> joblib.Parallel:
    """A joblib call on the reusable loky executor of ``workers`` processes (the same settings every time, so that
    every refit reuses the running workers); tasks are dispatched one at a time, in the order given."""
    with joblib.parallel_config(
        backend="loky",
        inner_max_num_threads=1,
        idle_worker_timeout=IDLE_S,
        initializer=_init_worker,
        initargs=(os.getpid(), WARM_FITS, NICE),
    ):
        return joblib.Parallel(n_jobs=workers, timeout=timeout, batch_size=1, return_as="generator")


def warm(workers: int | None = None) -> float:
    """Start the pool (if ``workers`` > 1) and wait until workers answer; returns the seconds taken."""
    n = resolve(workers)
    t0 = time.perf_counter()
    if n > 1:
        list(_pool(n, 300.0)(joblib.delayed(os.getpid)() for _ in range(4 * n)))
    return time.perf_counter() - t0


def workers_cpu_seconds() -> float:
    """CPU time (user + system) used so far by this process's live child processes (the pool's workers)."""
    import psutil

    total = 0.0
    for child in psutil.Process().children():
        try:
            t = child.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


class Fits:
    """The fits of one refit: ``publish`` its arrays once, then ``run`` batches of independent calls.

    With ``workers`` <= 1 everything runs in-process, in order.  Results always come back in call order.
    """

    def __init__(self, workers: int | None = 1, timeout: float = 300.0) -> None:
        self.workers = resolve(workers)
        self.timeout = timeout
        self.fallbacks = 0
        """Batches that ran again in-process (a worker died or the pool timed out)."""
        self.store = Store(uuid.uuid4().hex)
        self._shared: Store | None = None
        self._dir: str | None = None

    def __enter__(self) -> Fits:
        return self

    def __exit__(self, *exc: object) -> None:
        _CACHE.pop(self.store.id, None)
        self._shared = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def publish(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.store = Store(self.store.id, dict(arrays))
        if self.workers > 1:
            shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
            self._dir = tempfile.mkdtemp(prefix="aip-refit-", dir=shm)
            save_arrays(self._dir, self.store.arrays)
            self._shared = Store(self.store.id, path=self._dir)

    def run(
        self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], progress: Callable[[int, int], None] | None = None
    ) -> list[Any]:
        """``[fn(store, *args) for args in calls]``, on the pool when there is one; ``progress(done, total)``."""
        out: list[Any] = []

        def collect(results: Any) -> list[Any]:
            for r in results:
                if _STOPPING.is_set():
                    raise Stopped(f"stopped after {len(out)} of {len(calls)} fits")
                out.append(r)
                if progress is not None:
                    progress(len(out), len(calls))
            return out

        if self._shared is not None and len(calls) >= 2:
            try:
                return collect(_pool(self.workers, self.timeout)(joblib.delayed(fn)(self._shared, *a) for a in calls))
            except (BrokenProcessPool, TimeoutError, multiprocessing.TimeoutError, OSError, EOFError):
                self.fallbacks += 1
                out.clear()
        return collect(fn(self.store, *a) for a in calls)

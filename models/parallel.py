"""Independent fits of a refit spread over a long-lived process pool (one per process, created lazily).

A refit is a plain function (``models.api.run_refit``) that the stream runs in an executor thread; inside it,
:class:`Fits` runs the cross-validation fits (model x category x mode x fold) and the final fits on
``workers`` processes.  The pool is module-level, shared by every ``EnvironmentModels`` of the process, and
lives until :func:`shutdown` (registered ``atexit``):

* processes are *spawned* (never forked: the stream's process has an event loop and executor threads), each
  importing scikit-learn and torch once and limited to one BLAS/OpenMP/torch thread;
* a refit's arrays (features per mode x category, target, fold indices) are written once, as ``.npy`` files in
  a temporary directory (``/dev/shm`` where there is one), and memory-mapped by the workers, which cache
  them and each fold's prepared training set for the duration of the refit; a task carries only names;
* a worker that dies (``BrokenProcessPool``) or a pool that does not answer within ``timeout`` seconds is
  discarded (its processes killed) and the remaining fits run in-process: a refit never hangs on the pool.

Only our own processes exchange pickles here (task arguments, fitted models); nothing from a topic or a file.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ALL_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

_LOCK = threading.Lock()
_POOLS: dict[int, ProcessPoolExecutor] = {}
_MEM: dict[str, dict[str, np.ndarray]] = {}
"""In-process stores (no pool, or the fallback): store name -> arrays."""
_CACHE: dict[str, dict[Any, Any]] = {}
"""Per store: loaded arrays and prepared training sets (workers keep the last two stores)."""


def cpu_count() -> int:
    """Cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def resolve(workers: int | None) -> int:
    """``None`` or < 1: all cores."""
    return cpu_count() if workers is None or workers < 1 else int(workers)


WARM_FITS = True
"""Workers fit every batch model once on a small set at start (tests turn it off to start pools quickly)."""


def _die_with_parent() -> None:
    """Linux: SIGTERM this pool worker when the process that owns the pool dies, even by SIGKILL."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pool's broken pipe still ends the worker
        pass


def _init_worker(warm_fits: bool = True) -> None:
    _die_with_parent()
    # one thread per worker: two processes on two cores; OpenMP (HistGradientBoosting) spin-waits when oversubscribed.
    # The variables are read when the libraries load (none has yet: the worker has imported numpy only).
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    import sklearn.ensemble  # noqa: F401  (loads scikit-learn's OpenMP runtime, so that the limit below covers it)
    from threadpoolctl import threadpool_limits

    globals()["_LIMITS"] = threadpool_limits(1)  # kept alive (the MLP sets torch's threads itself)
    if not warm_fits:
        return
    import pandas as pd

    from models import zoo

    rng = np.random.default_rng(0)  # one small fit of every batch model: imports and first-call set-up, once
    X = pd.DataFrame(rng.normal(size=(150, 5)), columns=["a", "b", "c", "d", "e"]).assign(**{"f=x": 1.0})
    X = pd.concat([X, X], ignore_index=True)  # duplicated rows, as in placement mode
    for name in zoo.BATCH:
        zoo.make_batch(name).fit(X, rng.normal(size=len(X)))


def _ping(_: object = None) -> int:
    return os.getpid()


def pool(workers: int) -> ProcessPoolExecutor:
    """The process pool of ``workers`` processes, started on first use."""
    with _LOCK:
        p = _POOLS.get(workers)
        if p is None:
            p = _POOLS[workers] = ProcessPoolExecutor(
                workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker, initargs=(WARM_FITS,)
            )
        return p


def warm(workers: int | None = None) -> float:
    """Start the pool (if ``workers`` > 1) and wait until every worker has imported; returns the seconds taken."""
    n = resolve(workers)
    t0 = time.perf_counter()
    if n > 1:
        p = pool(n)
        list(p.map(_ping, range(4 * n)))
    return time.perf_counter() - t0


def _discard(p: ProcessPoolExecutor) -> None:
    with _LOCK:
        for k, v in list(_POOLS.items()):
            if v is p:
                del _POOLS[k]
    procs = list((getattr(p, "_processes", None) or {}).values())
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    p.shutdown(wait=True, cancel_futures=True)


def shutdown() -> None:
    """Stop every pool of this process (their processes exit); a later refit starts a new one."""
    with _LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for p in pools:
        p.shutdown(wait=True, cancel_futures=True)


atexit.register(shutdown)


def live_workers() -> list[int]:
    """Pids of this process's pool workers (tests: none left behind after :func:`shutdown`)."""
    with _LOCK:
        return [pid for p in _POOLS.values() for pid in (getattr(p, "_processes", None) or {})]


def workers_cpu_seconds() -> float:
    """CPU time (user + system) used so far by this process's live pool workers (Linux ``/proc``; else 0)."""
    total = 0.0
    for pid in live_workers():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            continue
    return total


# --------------------------------------------------------------------------- what the tasks read


def array(store: str, name: str) -> np.ndarray:
    """Array ``name`` of a refit's store: in-process memory, else the memory-mapped file (cached per store)."""
    mem = _MEM.get(store)
    if mem is not None:
        return mem[name]
    cache = _cache(store)
    a = cache.get(("array", name))
    if a is None:
        a = cache[("array", name)] = np.load(os.path.join(store, name + ".npy"), mmap_mode="r", allow_pickle=False)
    return a


def cached(store: str, key: Any, make: Callable[[], Any]) -> Any:
    """A value computed once per store and process (e.g. a fold's prepared training set)."""
    cache = _cache(store)
    v = cache.get(key)
    if v is None:
        v = cache[key] = make()
    return v


def _cache(store: str) -> dict[Any, Any]:
    c = _CACHE.get(store)
    if c is None:
        if store not in _MEM:  # a worker: forget older refits
            for old in [s for s in _CACHE if s not in _MEM][:-1]:
                del _CACHE[old]
        c = _CACHE[store] = {}
    return c


# --------------------------------------------------------------------------- one refit's fits


class Fits:
    """The fits of one refit: ``publish`` its arrays once, then ``run`` batches of independent calls.

    With ``workers`` <= 1 everything runs in-process, in order.  Results always come back in call order.
    """

    def __init__(self, workers: int | None = 1, timeout: float = 300.0) -> None:
        self.workers = resolve(workers)
        self.timeout = timeout
        self.fallbacks = 0
        """Batches that fell back to in-process (a worker died or the pool timed out)."""
        self.store = f"mem:{uuid.uuid4().hex}"
        self._dir: str | None = None

    def __enter__(self) -> Fits:
        return self

    def __exit__(self, *exc: object) -> None:
        _MEM.pop(self.store, None)
        _CACHE.pop(self.store, None)
        if self._dir is not None:
            _CACHE.pop(self._dir, None)
            shutil.rmtree(self._dir, ignore_errors=True)

    def publish(self, arrays: Mapping[str, np.ndarray]) -> None:
        _MEM[self.store] = dict(arrays)
        if self.workers > 1:
            base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            self._dir = tempfile.mkdtemp(prefix="aip-refit-", dir=base)
            for name, a in arrays.items():
                np.save(os.path.join(self._dir, name + ".npy"), np.ascontiguousarray(a), allow_pickle=False)

    def run(
        self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], progress: Callable[[int, int], None] | None = None
    ) -> list[Any]:
        """``[fn(store, *args) for args in calls]``, on the pool when there is one; ``progress(done, total)``."""
        total, count = len(calls), [0]

        def tick(_: object = None) -> None:
            count[0] += 1
            if progress is not None:
                progress(count[0], total)

        if self.workers <= 1 or self._dir is None or len(calls) < 2:
            out = []
            for args in calls:
                out.append(fn(self.store, *args))
                tick()
            return out
        p = pool(self.workers)
        futures: list[Future[Any]] = []
        try:
            futures = [p.submit(fn, self._dir, *args) for args in calls]
            for f in futures:
                f.add_done_callback(tick)
            _, pending = wait(futures, timeout=self.timeout, return_when=ALL_COMPLETED)
            if pending:
                raise TimeoutError(f"{len(pending)} fits pending after {self.timeout} s")
            return [f.result() for f in futures]
        except (BrokenProcessPool, TimeoutError, OSError, EOFError):
            self.fallbacks += 1
            _discard(p)
            out = []
            for f, args in zip(futures or [None] * len(calls), calls, strict=True):
                ok = f is not None and f.done() and not f.cancelled() and f.exception() is None
                out.append(f.result() if ok and f is not None else fn(self.store, *args))
            return out

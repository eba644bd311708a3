"""The refit's process pool: same results as in-process, workers die with their owner, dead or stuck workers fall back."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from models import parallel
from models.crossval import cross_validate
from models.datasets import Sample
from models.environment import run_refit
from models.modelconfig import ModelConfig


@pytest.fixture(autouse=True)
def _pools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "WARM_FITS", False)  # workers start without their warm-up fits


def _samples(n: int = 240) -> list[Sample]:
    rng = np.random.default_rng(0)
    out = []
    for i, v in enumerate(rng.uniform(0, 50, n)):
        job, co = f"j{i % 12}", f"c{i % 5}"
        solo = {"E": 100.0 + i % 12, "T": 10.0 * (i % 3), "throughput": 5.0 + i % 12}
        pcts = {"E": float(v) + rng.normal(), "T": rng.normal(), "S": 0.5 * float(v) + rng.normal()}
        out.append(Sample(job, (co,), float(v), f"g{i % 12}", "", pcts, solo, ({"E": 50.0 + i % 5, "throughput": 3.0},)))
    return out


def _row(store: parallel.Store, owner: int, i: int) -> float:
    return float(store["v"][i]) * 2


def _die_in_worker(store: parallel.Store, owner: int, i: int) -> float:
    if os.getpid() != owner:  # in a pool worker
        os._exit(3)
    return _row(store, owner, i)


def _stuck_in_worker(store: parallel.Store, owner: int, i: int) -> float:
    if os.getpid() != owner:
        time.sleep(60)
    return _row(store, owner, i)


def _pid(store: parallel.Store, i: int) -> int:
    return os.getpid()


def test_pool_cross_validation_equals_in_process() -> None:
    samples = _samples()
    models = ("LinearRegression", "ExtraTrees", "HistGradientBoosting", "MLP")
    kw = {"models": models, "categories": ("all",), "k": 3, "max_rows": 120}
    one = cross_validate(samples, ["observed", "placement"], workers=1, **kw)  # type: ignore[arg-type]
    two = cross_validate(samples, ["observed", "placement"], workers=2, **kw)  # type: ignore[arg-type]
    assert [(s.mode, s.category, s.model) for s in one] == [(s.mode, s.category, s.model) for s in two]
    for a, b in zip(one, two, strict=True):
        np.testing.assert_allclose(a.oof, b.oof, rtol=1e-9, atol=1e-9)
        assert a.trained == b.trained and a.mae == pytest.approx(b.mae, rel=1e-9)


def test_refit_on_the_pool_selects_and_fits_as_in_process() -> None:
    samples = _samples()
    models = ("LinearRegression", "DecisionTree", "HistGradientBoosting")
    one = run_refit(samples, ModelConfig(workers=1, batch_models=models), 0)
    two = run_refit(samples, ModelConfig(workers=2, pool_min_rows=0, batch_models=models), 0)
    assert two.pool_fallbacks == 0 and one.scores == two.scores
    assert one.fitted.keys() == two.fitted.keys()
    x = samples[0].features("observed", "all")
    for key, model in one.fitted.items():
        assert two.fitted[key].predict_one(x) == pytest.approx(model.predict_one(x), rel=1e-9)


@pytest.mark.parametrize("fn", [_die_in_worker, _stuck_in_worker])
def test_a_dead_or_stuck_worker_falls_back_to_in_process(fn: object) -> None:
    with parallel.Fits(2, timeout=2.0) as fits:
        fits.publish({"v": np.arange(6.0)})
        assert fits.run(fn, [(os.getpid(), i) for i in range(6)]) == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]  # type: ignore[arg-type]
        assert fits.fallbacks == 1
    with parallel.Fits(2) as fits:  # the next refit gets a working pool
        fits.publish({"v": np.arange(6.0)})
        assert os.getpid() not in fits.run(_pid, [(i,) for i in range(6)]) and fits.fallbacks == 0


def test_one_worker_stays_in_process() -> None:
    with parallel.Fits(1) as fits:
        fits.publish({"v": np.arange(3.0)})
        assert fits.run(_row, [(os.getpid(), 0), (os.getpid(), 2)]) == [0.0, 4.0]
        assert set(fits.run(_pid, [(0,), (1,)])) == {os.getpid()}


OWNER = """
import os, time
from models import parallel
parallel.WARM_FITS = False
with parallel.Fits(2) as fits:
    fits.publish({})
    print(*set(fits.run(lambda store, i: os.getpid(), [(i,) for i in range(8)])), flush=True)
    time.sleep(60)
"""


def test_workers_die_with_their_owner() -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        workers = [int(p) for p in owner.stdout.readline().split()]
        assert workers and owner.pid not in workers
        left = psutil.Process(owner.pid).children()  # the workers (also any not started yet) and loky's helpers
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert set(workers) <= {p.pid for p in left}
    _, alive = psutil.wait_procs(left, timeout=20)
    assert alive == [], f"outlived their owner: {[p.cmdline()[-4:] for p in alive]}"


SHUTDOWN = """
import os
from models import parallel
parallel.WARM_FITS = False
with parallel.Fits(2) as fits:
    fits.publish({})
    print(*set(fits.run(lambda store, i: os.getpid(), [(i,) for i in range(8)])), flush=True)
    print(*[p.pid for p in __import__("psutil").Process().children(recursive=True)], flush=True)
"""


def test_no_worker_is_left_after_a_normal_shutdown() -> None:
    """The owner refits on the pool and exits normally: it exits, and every worker (and loky's helpers) with it."""
    owner = subprocess.Popen([sys.executable, "-c", SHUTDOWN], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    workers = {int(p) for p in owner.stdout.readline().split()}
    children = [psutil.Process(int(p)) for p in owner.stdout.readline().split()]
    try:
        owner.wait(timeout=60)
    except subprocess.TimeoutExpired:
        owner.kill()
        owner.wait()
        for p in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        pytest.fail("the owner did not exit: its pool's workers kept it waiting")
    assert owner.returncode == 0
    assert workers and workers <= {p.pid for p in children}  # it did run on worker processes
    _, alive = psutil.wait_procs(children, timeout=20)
    assert alive == [], f"left after the owner's normal exit: {[p.cmdline()[-4:] for p in alive]}"


def test_refits_below_pool_min_rows_stay_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from models import refit

    made: list[parallel.Fits] = []

    class Spy(parallel.Fits):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            made.append(self)

    monkeypatch.setattr(refit, "Fits", Spy)
    samples = _samples(60)
    small = run_refit(samples, ModelConfig(workers=2, pool_min_rows=61, batch_models=("LinearRegression",)), 0)
    assert [f.workers for f in made] == [1] and made[0]._shared is None  # nothing published to a pool
    pooled = run_refit(samples, ModelConfig(workers=2, pool_min_rows=60, batch_models=("LinearRegression",)), 0)
    assert [f.workers for f in made] == [1, 2]
    assert small.scores == pooled.scores and small.fitted.keys() == pooled.fitted.keys()


def _stop_at(store: parallel.Store, owner: int, i: int) -> float:
    if i == 1:
        parallel.stop()  # the worker's signal arrives during the second fit
    return _row(store, owner, i)


def test_a_stopping_process_gives_up_between_fits() -> None:
    try:
        with parallel.Fits(1) as fits:
            fits.publish({"v": np.arange(6.0)})
            calls: list[int] = []

            def counted(store: parallel.Store, owner: int, i: int) -> float:
                calls.append(i)
                return _stop_at(store, owner, i)

            with pytest.raises(parallel.Stopped, match="after 1 of 6 fits"):
                fits.run(counted, [(os.getpid(), i) for i in range(6)])
            assert calls == [0, 1]  # the fit in progress ends; no other starts
        with pytest.raises(parallel.Stopped):  # a refit, in-process and on the pool
            run_refit(_samples(), ModelConfig(workers=1, batch_models=("LinearRegression",)), 0)
        with pytest.raises(parallel.Stopped):
            run_refit(_samples(), ModelConfig(workers=2, pool_min_rows=0, batch_models=("LinearRegression",)), 0)
    finally:
        parallel.resume()
    assert run_refit(_samples(), ModelConfig(workers=1, batch_models=("LinearRegression",)), 0).fitted  # resumed


def _niceness(store: parallel.Store, i: int) -> tuple[int, int]:
    return os.getpid(), os.nice(0)


def test_pool_workers_run_below_their_owners_priority() -> None:
    owner = os.nice(0)
    with parallel.Fits(2) as fits:
        fits.publish({"v": np.arange(4.0)})
        got = fits.run(_niceness, [(i,) for i in range(4)])
    assert fits.fallbacks == 0 and all(pid != os.getpid() for pid, _ in got)
    assert {nice for _, nice in got} == {min(19, owner + parallel.NICE)}

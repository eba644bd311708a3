"""``aip bench models``: refit + selection speed and online update speed (docs/BENCHMARKS.md, "Models").

* ``refit_seconds_10k``: an :class:`models.environment.EnvironmentModels` with the production :class:`models.environment.Config`
  that has learned 10,000 observations (Gavel pairs, synthetic percent changes) runs a full refit and
  selection three times (:data:`REFITS`): the median wall time of ``refit_task()()`` plus ``apply_refit``.  The
  refit fits the selected model of each mode x category on all ``refit_rows`` (10,000) observations (batch models
  fit the distinct feature rows, weighted by their copies) and cross-validates (grouped, 3 folds) every batch model x 4 categories x both
  modes, training on ``refit_cv_rows`` rows per mode (a group-stratified subsample where a mode has more
  distinct rows than ``ModelConfig.refit_cv_rows``; every row is scored out of fold).  One small refit first warms
  imports.  ``refit_cpu_seconds_10k`` is the CPU time of the same call (this process + the pool's workers), ``load_average_1m`` the machine's load.
* the fits of a refit run on ``ModelConfig.workers`` processes (default: all cores; ``AIP_BENCH_WORKERS=1`` measures
  the in-process refit).  The pool is started (and every worker warmed with one small fit per model) before the
  timed refits: ``pool_start_seconds``, paid once per process.  ``refit_seconds_all`` lists every timed refit.
* ``online_update_ms_median``: median wall time of ``learn(obs)`` per observation after the refit: every
  candidate's test-then-train scoring (online learners due, baselines, the served model for drift; the batch
  candidates in one vectorised pass every ``ModelConfig.score_batch_every`` observations, which the mean and p95
  include), learning, and selection.  ``online_update_ms_median_before_refit``: the same before any refit
  (no batch candidates).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

REFITS = 3
"""Refits timed, --quick too: ``refit_seconds_10k`` is their median (one refit's wall time on a shared 2-core machine
varied by up to 0.5 s between runs of the same code, 2.87-3.4 s, more than the margin to the 3 s floor)."""


def run(quick: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    from models import parallel
    from models.environment import EnvironmentModels
    from models.modelconfig import ModelConfig
    from models.synthetic import gavel_observations

    n = 10_000
    progress(f"generating {n} observations from Gavel v100 pairs")
    obs = gavel_observations(n, seed=7)
    env_workers = os.environ.get("AIP_BENCH_WORKERS")
    config = ModelConfig(workers=int(env_workers)) if env_workers else ModelConfig()
    workers = parallel.resolve(config.workers)
    progress(f"starting the refit pool ({workers} workers)")
    pool_start = parallel.warm(workers)
    warm = EnvironmentModels("v100", seed=0, config=config)
    for o in obs[:200]:
        warm.learn(o)
    warm.refit_now()
    em = EnvironmentModels("v100", seed=0, config=config)
    times = []
    for i, o in enumerate(obs):
        t0 = time.perf_counter()
        em.learn(o)
        times.append(time.perf_counter() - t0)
        if (i + 1) % 2500 == 0:
            progress(f"learned {i + 1}/{n}, median so far {statistics.median(times) * 1e3:.3f} ms")
    refits, cpu = [], []
    for _ in range(REFITS):
        c0 = time.process_time() + parallel.workers_cpu_seconds()
        t0 = time.perf_counter()
        task = em.refit_task()
        result = task()
        em.apply_refit(result)
        refits.append(time.perf_counter() - t0)
        cpu.append(time.process_time() + parallel.workers_cpu_seconds() - c0)
        progress(f"refit on {result.rows} rows took {refits[-1]:.2f} s")
    # the steady state: batch candidates of the refit are scored too (vectorised every score_batch_every observations)
    after = []
    for o in gavel_observations(3000 if quick else 5000, seed=8):
        t0 = time.perf_counter()
        em.learn(o)
        after.append(time.perf_counter() - t0)
    progress(f"learned {len(after)} more after the refit, median {statistics.median(after) * 1e3:.3f} ms")
    pt = []
    for o in obs[:500]:
        t0 = time.perf_counter()
        em.predict(o, "placement")
        pt.append(time.perf_counter() - t0)
    return {
        "refit_seconds_10k": round(statistics.median(refits), 2),
        "refit_cpu_seconds_10k": round(statistics.median(cpu), 2),
        "refit_rows": result.rows,
        "refit_cv_rows": min(result.cv_rows.values(), default=0),
        "refit_cv_rows_by_mode": result.cv_rows,
        "refit_seconds_all": [round(r, 2) for r in refits],
        "refit_workers": workers,
        "refit_pool_fallbacks": result.pool_fallbacks,
        "pool_start_seconds": round(pool_start, 2),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "online_update_ms_median": round(statistics.median(after) * 1e3, 3),
        "online_update_ms_p95": round(sorted(after)[int(0.95 * len(after))] * 1e3, 3),
        "online_update_ms_mean": round(statistics.mean(after) * 1e3, 3),
        "online_update_ms_median_before_refit": round(statistics.median(times) * 1e3, 3),
        "predict_ms_median": round(statistics.median(pt) * 1e3, 3),
        "selection_ms": round((em.selection_seconds or 0.0) * 1e3, 3),
        "selected": em.selected(),
    }

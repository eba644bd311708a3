"""``aip bench serving``: stage 2 split as with ``serving`` sharded, in process: learning vs serving per observation.

The units of ``aip bench stage2`` (:func:`aip.bench.stage2.units`: the same fleet, seed and order) go through

* learning: a :class:`streams.stage2.Stage2` (what the environment's one learner does with
  every observation: learn co-located ones, note solo profiles), its leaderboard once per ``BATCH`` units and its
  refits inline, as ``aip bench stage2`` times them; after each batch, the snapshots its
  :class:`streams.snapshots.Schedule` says are due, built and encoded (:func:`streams.snapshots.snapshot_bytes`,
  the batch models' dumps cached per refit as a worker caches them);
* serving: a :class:`streams.serving.Serving` that installs every snapshot as it is published (decoded and built:
  what each worker's snapshot reader does, in its thread) and serves every co-located and solo unit (idle windows
  are stage 1's, as in both modes).

Over the steady state (the last ``1 - WARMUP_SHARE`` of the units):

* ``serving_learning_ms_per_observation_amortised``: learning's time (units, leaderboards, refits, snapshots
  built) per unit: one worker pays it for the whole environment; ``_median`` per unit, and the refits' and
  the snapshots' share apart (``serving_learning_refit_ms_per_observation``, ``..._snapshot_...``);
* ``serving_serving_ms_per_observation_median`` / ``_amortised`` (with snapshots applied): per unit served; each
  of W workers serves about 1/W of the units;
* ``serving_snapshot_*``: how many, their size, the ms to build and to apply one.
"""

from __future__ import annotations

import os
import secrets
import statistics
import time
from collections.abc import Callable
from typing import Any

from aip.bench.stage2 import BATCH, GPUS, START_TS, WARMUP_SHARE, units


def replay(items: list[tuple[str, Any]], progress: Callable[[str], None]) -> dict[str, Any]:
    from streams import snapshots
    from streams.serving import Serving
    from streams.stage2 import Stage2
    from streams.windows import GpuState

    key = secrets.token_bytes(32)
    learner, serving, schedule = Stage2(), Serving(clock=lambda: START_TS), snapshots.Schedule()
    caches: dict[str, Any] = {}
    states: dict[str, GpuState] = {}
    warmup = int(len(items) * WARMUP_SHARE)
    learn_s, serve_s, build_s, apply_s = 0.0, [], [], []
    learn_units: list[float] = []
    by_kind: dict[str, tuple[list[float], list[float]]] = {"colocated": ([], []), "solo": ([], [])}  # learn, serve
    refit_s = 0.0
    sizes: list[int] = []
    version, event_ts = 0, 0.0
    every = max(1, len(items) // 10)
    for i, (kind, record) in enumerate(items):
        steady = i >= warmup
        if kind != "idle":
            event_ts = max(event_ts, record.window_end)
            t0 = time.perf_counter()
            learner.on_observation(record, leaderboard=False)
            t1 = time.perf_counter()
            serving.serve(record, states.setdefault(record.gpu_uuid, GpuState()).raised)
            t2 = time.perf_counter()
            if steady:
                learn_s += t1 - t0
                learn_units.append(t1 - t0)
                serve_s.append(t2 - t1)
                by_kind[kind][0].append(t1 - t0)
                by_kind[kind][1].append(t2 - t1)
        t0, applying = time.perf_counter(), 0.0
        due = learner.refits_due()
        for env, task in due:
            learner.apply_refit(env, task())
        if steady:
            refit_s += time.perf_counter() - t0
        if (i + 1) % BATCH == 0 or i + 1 == len(items) or due:
            for env in list(learner.models):
                learner.leaderboard_of(env)
                models, known = learner.models[env], learner.job_types.get(env, {})
                if not schedule.due(models, len(known), event_ts):
                    continue
                version += 1
                b0 = time.perf_counter()
                data = snapshots.snapshot_bytes(models, known, key, version, caches.setdefault(env, {}))
                schedule.done(models, len(known), event_ts)
                b1 = time.perf_counter()
                snapshots.apply(serving, env, version, data, key)
                b2 = time.perf_counter()
                applying += b2 - b1
                if steady:
                    build_s.append(b1 - b0)
                    apply_s.append(b2 - b1)
                    sizes.append(len(data))
        if steady:
            learn_s += time.perf_counter() - t0 - applying  # applying a snapshot is serving's, counted apart
        if (i + 1) % every == 0:
            progress(f"{i + 1}/{len(items)} units, {version} snapshots")
    n = len(serve_s)
    served = sum(serve_s)
    return {
        "learning_ms_per_observation_amortised": round(learn_s / n * 1e3, 3),
        "learning_ms_per_observation_median": round(statistics.median(learn_units) * 1e3, 3),
        "learning_refit_ms_per_observation": round(refit_s / n * 1e3, 3),
        "learning_snapshot_ms_per_observation": round(sum(build_s) / n * 1e3, 3),
        "refits_total": sum(m.refits for m in learner.models.values()),
        **{f"learning_{k}_ms_median": round(statistics.median(v[0]) * 1e3, 3) if v[0] else None for k, v in by_kind.items()},
        **{f"serving_{k}_ms_median": round(statistics.median(v[1]) * 1e3, 3) if v[1] else None for k, v in by_kind.items()},
        **{f"{k}_units_steady": len(v[0]) for k, v in by_kind.items()},
        "serving_ms_per_observation_median": round(statistics.median(serve_s) * 1e3, 3),
        "serving_ms_per_observation_amortised": round((served + sum(apply_s)) / n * 1e3, 3),
        "snapshots_steady": len(sizes),
        "snapshot_bytes_median": int(statistics.median(sizes)) if sizes else None,
        "snapshot_build_ms_median": round(statistics.median(build_s) * 1e3, 1) if build_s else None,
        "snapshot_apply_ms_median": round(statistics.median(apply_s) * 1e3, 1) if apply_s else None,
        "units_served_steady": n,
        "what_if_hits": serving.what_ifs.hits,
        "what_if_misses": serving.what_ifs.misses,
        "served_before_snapshot": serving.counters["served_before_snapshot"],
    }


def measure(gpus: int, duration_s: float, progress: Callable[[str], None]) -> dict[str, Any]:
    progress(f"simulating {gpus} GPUs for {duration_s:.0f} s through stage 1")
    items = list(units(gpus, duration_s))
    result = {f"serving_{k}" if not k.startswith("serving_") else k: v for k, v in replay(items, progress).items()}
    result["serving_gpus"] = gpus
    result["serving_sim_seconds"] = duration_s
    result["serving_load_average_1m"] = round(os.getloadavg()[0], 2)
    return result


def run(quick: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    return measure(GPUS, 1450.0 if quick else 2900.0, progress)

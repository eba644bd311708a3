"""``aip bench stage2``: stage 2's cost per observation, in process (no Kafka, no faust).

A :class:`producers.sim.Simulator` fleet (16 GPUs; full 2,900 simulated seconds, quick 1,450) goes through a
:class:`streams.stage1.Stage1` with the worker's settings and ``every_window`` (as ``aip worker`` runs it).  What
stage 1 hands stage 2, in order, is replayed through one :class:`streams.serving.LearnAndServe` (setting ``serving``
stage2: a :class:`streams.stage2.Stage2` and the :class:`streams.serving.Serving` of its models), timed unit by unit:

* a co-located observation: ``LearnAndServe.on_observation(obs, leaderboard=False)`` (both modes, what-if entries,
  alerts, learning);
* a solo window: ``LearnAndServe.on_observation`` too (it answers with :func:`streams.serving.solo_prediction`);
* an idle window: :func:`streams.serving.idle_prediction`, as the worker makes it;
* after every ``BATCH`` units (the worker's stage-2 batch of up to 200 in :mod:`streams.app`, full when
  the worker is saturated, as here): ``Stage2.leaderboard_of`` of the environment, as the worker publishes it.

After every unit, the refits due run inline (``refits_due``, the task, ``apply_refit``), timed apart.  The first
``WARMUP_SHARE`` of the units is the warm-up; over the rest (the steady state):

* ``ms_per_observation_median`` / ``ms_per_observation_p95``: per unit, refits and leaderboards excluded;
* ``ms_per_observation_amortised``: all stage-2 time of the steady state (units, leaderboards, refits) divided
  by its units; ``ms_per_colocated_observation_amortised`` divides the same time by the co-located observations
  only;
* ``ms_per_observation_amortised_at_refit_share``: the same without the refits, divided by ``1 - refit_share``:
  the amortised cost of a worker saturated for long, whose refits, always due, take their whole share of the
  time (``Stage2.refit_share``: after a refit of ``d`` seconds the next waits ``d * (1 / share - 1)``, so a short
  run like this one may hold none in its steady state);
* ``stage2_refit_seconds_steady`` (their sum), ``stage2_refits_steady``, ``stage2_refit_ms_per_observation``,
  ``stage2_leaderboard_ms_per_observation``;
* ``stage2_what_if_hits`` / ``stage2_what_if_misses``: what-if entries served from the cache / computed;
* per kind (``colocated``, ``solo``, ``idle``): the median ms and the count.

Counts are deterministic (same seed, same fleet); times depend on the machine's load (``load_average_1m``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

GPUS = 16
SEED = 0
START_TS = 1_700_000_000.0
WARMUP_SHARE = 0.25
"""Share of the units (in order) left out of the steady-state figures."""
KINDS = ("colocated", "solo", "idle")
BATCH = 200
"""Units per leaderboard (the worker's stage-2 batch)."""
HEADLINE = ("ms_per_observation", "ms_per_colocated_observation")
"""Keys printed as they are; every other key of this part starts with ``stage2_``."""


def units(gpus: int, duration_s: float, seed: int = SEED) -> Iterator[tuple[str, Any]]:
    """``(kind, record)`` in the order stage 1 hands them over: a co-located or solo :class:`events.Observation`,
    or an :class:`streams.stage1.IdleWindow`."""
    from config import Settings
    from events.topics import METRICS
    from producers.sim import Simulator
    from streams.stage1 import Stage1

    s = Settings()
    stage1 = Stage1.from_settings(s, every_window=True)
    for topic, record in Simulator(gpus, seed=seed, start_ts=START_TS, duration_s=duration_s).events():
        out = stage1.on_metric(record) if topic == METRICS else stage1.on_job(record)
        for obs in out:
            yield ("colocated" if obs.colocated else "solo"), obs
        for idle in stage1.take_idle():
            yield "idle", idle
    for obs in stage1.flush():
        yield ("colocated" if obs.colocated else "solo"), obs


def replay(items: list[tuple[str, Any]], progress: Callable[[str], None]) -> dict[str, Any]:
    """Time stage 2 on ``items`` (see the module docstring) and return the figures."""
    from streams.serving import LearnAndServe, idle_prediction

    stage = LearnAndServe.build(clock=lambda: START_TS)
    stage2 = stage.learner
    warmup = int(len(items) * WARMUP_SHARE)
    per_unit: list[tuple[str, float]] = []  # steady state: (kind, seconds)
    refit_s, refits, refit_s_warmup, board_s = 0.0, 0, 0.0, 0.0
    every = max(1, len(items) // 10)
    for i, (kind, record) in enumerate(items):
        t0 = time.perf_counter()
        if kind == "idle":
            idle_prediction(
                record.gpu_uuid, record.environment, record.window_end, stage2.job_types.get(record.environment, {}), now=START_TS
            )
        else:
            stage.on_observation(record, leaderboard=False)
        dt = time.perf_counter() - t0
        if (i + 1) % BATCH == 0 or i + 1 == len(items):
            b0 = time.perf_counter()
            for env in list(stage2.models):
                stage2.leaderboard_of(env)
            if i >= warmup:
                board_s += time.perf_counter() - b0
        r0 = time.perf_counter()
        due = stage2.refits_due()
        for env, task in due:
            stage2.apply_refit(env, task())
        rt = time.perf_counter() - r0 if due else 0.0
        if i >= warmup:
            per_unit.append((kind, dt))
            refit_s += rt
            refits += len(due)
        else:
            refit_s_warmup += rt
        if (i + 1) % every == 0:
            progress(f"{i + 1}/{len(items)} units, {refits} refits in the steady state so far")
    times = sorted(t for _, t in per_unit)
    total = sum(times) + refit_s + board_s
    n = len(per_unit)
    colocated = sum(1 for k, _ in per_unit if k == "colocated")
    by_kind = {k: [t for kk, t in per_unit if kk == k] for k in KINDS}
    return {
        "ms_per_observation_median": round(statistics.median(times) * 1e3, 3),
        "ms_per_observation_p95": round(times[int(0.95 * (n - 1))] * 1e3, 3),
        "ms_per_observation_mean": round(statistics.mean(times) * 1e3, 3),
        "ms_per_observation_amortised": round(total / n * 1e3, 3),
        "ms_per_colocated_observation_amortised": round(total / max(1, colocated) * 1e3, 3),
        "ms_per_observation_amortised_at_refit_share": round((total - refit_s) / n / (1.0 - stage2.refit_share) * 1e3, 3),
        "refit_share": stage2.refit_share,
        "refit_seconds_steady": round(refit_s, 2),
        "refit_seconds_warmup": round(refit_s_warmup, 2),
        "refits_steady": refits,
        "refit_ms_per_observation": round(refit_s / n * 1e3, 3),
        "leaderboard_ms_per_observation": round(board_s / n * 1e3, 3),
        "what_if_hits": stage.serving.what_ifs.hits,
        "what_if_misses": stage.serving.what_ifs.misses,
        "units_steady": n,
        "units_warmup": warmup,
        **{f"{k}_units_steady": len(v) for k, v in by_kind.items()},
        **{f"{k}_ms_median": round(statistics.median(v) * 1e3, 3) if v else None for k, v in by_kind.items()},
        "observations_learned": stage2.counters["observations"],
        "refits_total": sum(m.refits for m in stage2.models.values()),
    }


def measure(gpus: int, duration_s: float, progress: Callable[[str], None]) -> dict[str, Any]:
    """The part's figures for ``gpus`` simulated GPUs over ``duration_s`` simulated seconds."""
    progress(f"simulating {gpus} GPUs for {duration_s:.0f} s through stage 1")
    items = list(units(gpus, duration_s))
    progress(f"{len(items)} units for stage 2: " + ", ".join(f"{sum(1 for k, _ in items if k == kind)} {kind}" for kind in KINDS))
    result = {k if k.startswith(HEADLINE) else f"stage2_{k}": v for k, v in replay(items, progress).items()}
    result["stage2_gpus"] = gpus
    result["stage2_sim_seconds"] = duration_s
    result["stage2_load_average_1m"] = round(os.getloadavg()[0], 2)
    return result


def run(quick: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    return measure(GPUS, 1450.0 if quick else 2900.0, progress)

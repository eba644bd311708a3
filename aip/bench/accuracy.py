"""``aip bench accuracy``: what schedulers get -- live predictions of a real worker against the simulator's truth.

One ``aip worker`` on the embedded broker; a simulated fleet (16 GPUs, seed 3) is published paced at
``speedup`` x real time (full: 20x for 150 s, i.e. 3,000 simulated seconds; quick: 40x for 45 s), with the
simulator's ground truth kept in this process.  Once the worker has drained its input, every record on
``interference.predictions`` is compared with the true slowdown of its job in its window
(:class:`aip.bench.truth.Truth`), and every labelled observation's measured rate likewise.  Figures are for
the second half of the simulated span (after warm-up), per mode:

* ``live_mae_vs_truth``, ``live_p95_abs_error_vs_truth``, ``live_max_abs_error_vs_truth``;
* ``seen_share`` / ``seen_mae`` and ``new_share`` / ``new_mae``: predictions for a job with co-runners the
  worker had measured before, and for ones it had not (the prediction's ``regime``);
* ``out_of_range``: predictions outside the physically possible ``[-100, max]``;
* ``interval_coverage`` / ``interval_width_mean``: the share of predictions whose 90 % interval holds the
  truth, and the intervals' mean width (predictions without an interval left out);
* ``served``: the served-model mix (model, category, regime, predictions, MAE vs truth, claimed error).

The worker runs with ``refit_max_lag_s`` :data:`REFIT_MAX_LAG_S` (``config.refit_max_lag_s``): paced faster than real
time, it waits for its refits rather than serve models the pace has left behind, as real time would never; ``stage2``
reports its ``refits``, ``refits_awaited``, ``refit_await_s``, ``refit_s`` and the ``drain_s`` after the last event.

``label_mae_vs_truth`` is stage 1's measured interference against the truth, over the same half.  These figures
are of the predictions of co-located jobs; a GPU running one job or none answers too (``occupancy`` ``solo`` or
``idle``: its own slowdown is 0 by definition), and is scored only through its what-if entries.

``what_if``: every published what-if entry of the second half against the truth of its hypothetical job set
(:mod:`aip.bench.what_if`): ``newcomer_mae``, ``existing_mae``, ``interval_coverage``, ``regret_pts`` against
``random_regret_pts`` (the GPU the scheduler client would choose, under the ``novel_risk`` setting; every rule in
``regret_by_novel_risk``), by jobs already running and regime (``by_running``), and by how many job sets holding the
newcomer's type had been measured before (``by_measured_job_sets``); reported besides, in no floor, ``known_types``
(every entry but the ``novel`` ones) and ``new_by_placeable`` (the ``new`` entries apart for job sets the simulator
would place, :meth:`placement.experiment.Truth.fits`, and those it never runs).  Only entries of GPUs a job can go to
are scored (fewer than ``max_jobs_per_gpu`` running); any published on a full GPU is reported apart (``on_full_gpus``);
``out_of_bound`` counts entries with a value outside ``[-100, prediction_max_pct]``, ``what_if_clipped`` the worker's
entries bounded; ``unbounded`` / ``unbounded_share`` the intervals ``[lo, null]`` (coverage is of the bounded ones).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from aip.bench.truth import Truth, percentile
from aip.bench.what_if import MeasuredHistory, entries_of, score, truth_from_table

MODES = ("observed", "placement")


def colocated(p: Any) -> bool:
    """A prediction of a co-located job (not a lone job's or an idle GPU's answer)."""
    return getattr(p, "occupancy", None) in (None, "colocated")


def pairs(predictions: Iterable[Any], truth: Truth, *, window_s: float, since_ts: float) -> list[tuple[str, str, float, float]]:
    """(mode, regime, true %, predicted %) of every prediction of the second half that the truth covers."""
    out = []
    for p in predictions:
        if p.window_end is None or p.window_end < since_ts or not colocated(p):
            continue
        t = truth.interference_pct(p.job_id, p.window_end - window_s, p.window_end)
        if t is not None:
            out.append((p.mode, p.regime or "seen", t, p.interference_pct))
    return out


def plot(points: Sequence[tuple[str, str, float, float]], path: Any) -> None:
    """Predicted against true slowdown, one panel per mode, coloured by regime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5), sharex=True, sharey=True)
    top = max([max(t, p) for _, _, t, p in points] + [10.0])
    for ax, mode in zip(axes, MODES, strict=True):
        for regime, colour in (("seen", "tab:blue"), ("new", "tab:orange")):
            xs = [t for m, g, t, _ in points if m == mode and g == regime]
            ys = [p for m, g, _, p in points if m == mode and g == regime]
            if xs:
                mae = statistics.mean(abs(x - y) for x, y in zip(xs, ys, strict=True))
                ax.scatter(xs, ys, s=6, alpha=0.5, color=colour, label=f"{regime}: {len(xs)} predictions, MAE {mae:.2f}")
        ax.plot([-5, top], [-5, top], color="grey", lw=0.8)
        ax.set_title(f"{mode} mode")
        ax.set_xlabel("true slowdown of the job in its window (%)")
        ax.legend(loc="upper left", fontsize=8)
    axes[0].set_ylabel("published prediction (%)")
    fig.suptitle("Live predictions against the simulator's truth (second half of the run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summarize(
    predictions: Iterable[Any],
    observations: Iterable[Any],
    truth: Truth,
    *,
    window_s: float,
    since_ts: float,
    max_pct: float,
) -> dict[str, Any]:
    """The benchmark's figures from decoded predictions and observations (records with the project's fields)."""
    rows: dict[str, list[tuple[float, str, str, str, float | None, float]]] = {m: [] for m in MODES}
    covered: dict[str, list[tuple[bool, float]]] = {m: [] for m in MODES}  # (truth inside the interval, its width)
    for p in predictions:
        if p.window_end is None or p.window_end < since_ts or not colocated(p):
            continue
        t = truth.interference_pct(p.job_id, p.window_end - window_s, p.window_end)
        if t is None:
            continue
        rows[p.mode].append(
            (abs(p.interference_pct - t), p.model, p.category, p.regime or "seen", p.expected_error_pct, p.interference_pct)
        )
        interval = getattr(p, "interval_pct", None)
        if interval:
            covered[p.mode].append((interval[0] <= t <= interval[1], interval[1] - interval[0]))
    out: dict[str, Any] = {}
    for mode, r in rows.items():
        errors = [e for e, *_ in r]
        if not errors:
            out[mode] = {"predictions": 0}
            continue
        by_regime = {g: [e for e, _, _, reg, _, _ in r if reg == g] for g in ("seen", "new")}
        mix: dict[tuple[str, str, str], list[tuple[float, float | None]]] = defaultdict(list)
        for e, model, cat, reg, claimed, _ in r:
            mix[(model, cat, reg)].append((e, claimed))
        served = [
            {
                "model": model, "category": cat, "regime": reg, "predictions": len(v),
                "mae_vs_truth": round(statistics.mean(e for e, _ in v), 3),
                "claimed_error_pct": _mean_or_none([c for _, c in v if c is not None]),
            }
            for (model, cat, reg), v in sorted(mix.items(), key=lambda kv: -len(kv[1]))
        ]  # fmt: skip
        out[mode] = {
            "predictions": len(errors),
            "live_mae_vs_truth": round(statistics.mean(errors), 3),
            "live_p95_abs_error_vs_truth": round(percentile(errors, 0.95), 3),
            "live_max_abs_error_vs_truth": round(max(errors), 3),
            "out_of_range": sum(1 for *_, v in r if not -100.0 <= v <= max_pct),
            "interval_coverage": _mean_or_none([float(c) for c, _ in covered[mode]]),
            "interval_width_mean": _mean_or_none([w for _, w in covered[mode]]),
            **{f"{g}_share": round(len(v) / len(errors), 3) for g, v in by_regime.items()},
            **{f"{g}_mae": _mean_or_none(v) for g, v in by_regime.items()},
            "served": served,
        }
    labels = []
    for o in observations:
        if o.interference_pct is None or o.window_end < since_ts:
            continue
        t = truth.interference_pct(o.job_id, o.window_start, o.window_end)
        if t is not None:
            labels.append(abs(o.interference_pct - t))
    out["label_mae_vs_truth"] = _mean_or_none(labels)
    out["labels"] = len(labels)
    return out


def _mean_or_none(values: Sequence[float]) -> float | None:
    return round(statistics.mean(values), 3) if values else None


def _drained(worker: Any) -> bool:
    published = worker.counter("aip_stream_published_records_total", topic="observations")
    consumed = worker.counter("aip_stream_consumed_observations_total")  # observations, as published counts them
    return published > 0 and consumed >= published


def _read_all(settings: Any, topic: str, idle_s: float = 3.0) -> list[Any]:
    from transport import RecordConsumer

    records: list[Any] = []
    with RecordConsumer(settings, [topic], from_beginning=True) as c:
        last = time.monotonic()
        while time.monotonic() - last < idle_s:
            items = c.poll(timeout_s=0.5)
            if items:
                last = time.monotonic()
            records.extend(i.record for i in items if i.record is not None)
    return records


REFIT_MAX_LAG_S = 60.0
"""The worker's ``refit_max_lag_s`` here (unless ``AIP_REFIT_MAX_LAG_S`` says otherwise): the fleet is paced 20-40x
faster than real time, where a refit's wall-clock seconds would become minutes of event time; bounded, the models
are as fresh as in real time, where the bound never binds (docs/BENCHMARKS.md, "Refits that keep up")."""


def refit_max_lag_s() -> float:
    import os

    from config import Settings

    return Settings.from_env().refit_max_lag_s if "AIP_REFIT_MAX_LAG_S" in os.environ else REFIT_MAX_LAG_S


def run(quick: bool, progress: Callable[[str], None], plot_dir: str | None = None) -> dict[str, Any]:
    from aip.faults.worker import wait_until, worker_on_embedded_broker
    from producers.pacing import paced
    from producers.sim import Simulator
    from transport import RecordProducer

    gpus, seed = 16, 3
    speedup, wall_s = (40.0, 45.0) if quick else (20.0, 150.0)
    with worker_on_embedded_broker("a", refit_max_lag_s=refit_max_lag_s()) as worker:
        settings = worker.settings
        sim = Simulator(gpus, seed=seed, start_ts=time.time(), duration_s=wall_s * speedup)
        truth = Truth(sim.ground_truth, sim.jobs())
        progress(f"{gpus} simulated GPUs, {sim.duration_s:.0f} s at {speedup:g}x ({wall_s:g} s)")
        sent, t0 = 0, time.monotonic()
        with RecordProducer(settings, linger_ms=5) as p:
            for topic, record in paced(sim.events(), speedup, sim.start_ts):
                p.send(topic, record)
                sent += 1
                if sent % 20_000 == 0:
                    progress(f"sent {sent} events, {time.monotonic() - t0:.0f} s")
            p.flush(60)
        progress(f"sent {sent} events; waiting for the worker to drain")
        sent_at = time.monotonic()
        time.sleep(2 * (settings.window_s + settings.lateness_s) / speedup + 2.0)
        wait_until(lambda: _drained(worker), 900, "stage 2 to consume every observation", interval_s=0.5)
        refits = {
            "refits": int(worker.counter("aip_stream_stage_events_total", stage="stage2", kind="refits_applied")),
            "refits_awaited": int(worker.counter("aip_stream_stage_events_total", stage="stage2", kind="refits_awaited")),
            "refit_await_s": round(
                worker.counter("aip_stream_stage_events_total", stage="stage2", kind="refit_await_ms") / 1e3, 1
            ),
            "refit_s": round(worker.counter("aip_stream_stage_events_total", stage="stage2", kind="refit_ms") / 1e3, 1),
            "drain_s": round(time.monotonic() - sent_at, 1),
        }
        what_if_clipped = int(worker.counter("aip_stream_stage_events_total", stage="stage2", kind="what_if_clipped"))
        predictions = _read_all(settings, "interference.predictions")
        observations = _read_all(settings, "interference.observations")
    progress(f"{len(predictions)} predictions, {len(observations)} observations")
    from models.modelconfig import ModelConfig

    result = summarize(
        predictions, observations, truth,
        window_s=settings.window_s, since_ts=sim.start_ts + sim.duration_s / 2, max_pct=ModelConfig().max_pct,
    )  # fmt: skip
    since = sim.start_ts + sim.duration_s / 2
    entries, no_truth = entries_of(predictions, MeasuredHistory(observations), truth_from_table(sim.table), since_ts=since)
    from placement.experiment import Truth as Feasible  # the simulator's rule, for a reported split only

    result["what_if"] = score(
        entries, no_truth, placeable=Feasible(sim.gpu_model).fits, novel_risk=settings.novel_risk,
        max_jobs_per_gpu=settings.max_jobs_per_gpu, max_pct=settings.prediction_max_pct,
    )  # fmt: skip
    result["what_if"]["what_if_clipped"] = what_if_clipped
    result["floors_met"] = floors(result)
    if plot_dir:
        from pathlib import Path

        path = Path(plot_dir) / "accuracy.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        plot(pairs(predictions, truth, window_s=settings.window_s, since_ts=since), path)
        result["plot"] = str(path)
    result["config"] = {"gpus": gpus, "seed": seed, "speedup": speedup, "wall_s": wall_s, "sim_s": sim.duration_s,
                        "refit_max_lag_s": settings.refit_max_lag_s}  # fmt: skip
    result["stage2"] = refits
    return {"accuracy": result}


def what_if_floor(what_if: Mapping[str, Any]) -> bool:
    """The floor of the what-if entries (of GPUs a job can go to): on job sets never measured, ``newcomer_pct`` MAE
    <= 25 with two jobs running and <= 40 in regime ``new``; the bounded 90 % intervals covering 0.85-0.95 overall
    and in each regime; unbounded intervals only in regime ``novel``, at most 30 % of them; no value published
    outside ``[-100, prediction_max_pct]``; no entry of a full GPU; placement regret <= 0.05 x a random choice's."""
    running = what_if.get("by_running", {})
    regimes = what_if.get("by_regime", {})

    def new_mae_at_most(n: str, limit: float) -> bool:
        mae = running.get(n, {}).get("new", {}).get("newcomer_mae")
        return mae is None or mae <= limit

    def covered(cell: Mapping[str, Any]) -> bool:
        c = cell.get("interval_coverage")
        return not cell.get("intervals") or (c is not None and 0.85 <= c <= 0.95)

    def unbounded_ok(regime: str, cell: Mapping[str, Any]) -> bool:
        share = cell.get("unbounded_share") or 0.0
        return share <= 0.30 if regime == "novel" else not cell.get("unbounded")

    new_mae = regimes.get("new", {}).get("newcomer_mae")
    coverage, ratio = what_if.get("interval_coverage"), what_if.get("regret_ratio")
    return bool(
        what_if.get("entries")
        and new_mae_at_most("2", 25.0)
        and (new_mae is None or new_mae <= 40.0)
        and coverage is not None
        and 0.85 <= coverage <= 0.95
        and all(covered(cell) and unbounded_ok(g, cell) for g, cell in regimes.items())
        and not what_if.get("out_of_bound")
        and not what_if.get("on_full_gpus", {}).get("entries")
        and ratio is not None
        and ratio <= 0.05
    )


def floors(result: Mapping[str, Any]) -> dict[str, bool]:
    """The floors of the live-selection issue, per mode: MAE <= 5, p95 <= 20, none out of range, seen MAE <= 2;
    and, where the what-if entries were scored, :func:`what_if_floor`."""
    out = {}
    for mode in MODES:
        r = result.get(mode, {})
        out[mode] = bool(
            r.get("predictions")
            and r["live_mae_vs_truth"] <= 5.0
            and r["live_p95_abs_error_vs_truth"] <= 20.0
            and r["out_of_range"] == 0
            and (r["seen_mae"] is None or r["seen_mae"] <= 2.0)
        )
    if "what_if" in result:
        out["what_if"] = what_if_floor(result["what_if"])
    return out

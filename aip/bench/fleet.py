"""``aip bench fleet``: one environment of N GPUs at 1 Hz of real time, host-batched, through W workers.

Everything on this machine: the embedded broker, W ``aip worker`` processes (each with its own state
directory, as on its own host) and a simulated fleet (``producers.sim``, one environment, 8 GPUs per
host) sent as :class:`events.HostMetrics` and :class:`events.HostJobEvents` records, paced at real time (not sped
up).  Every
``SAMPLE_EVERY_S`` the harness reads each worker's ``/metrics`` (consumer lag per topic, records
consumed and published) and its CPU time and RSS (psutil); a consumer of ``interference.predictions``
times each prediction from its window's end (the wall-clock time its last sample was due: the
simulation's clock is the wall clock) to when it is read.

``kept_up``: the simulator kept real time (``sender_behind`` false), stage 1 consumed every batch sent, the lag of neither stage grew over the run's last
half, and p99 from a window's last sample to its prediction is at most window + lateness + 5 s.

``sender_cpu_ms_per_gpu_sample``: the sender's CPU while it simulated and sent, per GPU sample.  Its work is fixed by
the fleet's size and duration, so it gauges how fast the machine ran in the minutes of the run; the workers' figures
rise with it, about half as fast (docs/BENCHMARKS.md, "The machine's speed in a run").
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

SAMPLE_EVERY_S = 5.0
BEHIND_S = 30.0
"""A run ends this long after its duration even when the sender is behind (a fleet this machine cannot simulate
at real time: it did not keep up, and what it sent is what its costs are divided by)."""
GPUS_PER_HOST = 8
READ_METRICS = (
    "aip_stream_consumer_lag_records", "aip_stream_consumed_records_total", "aip_stream_published_records_total",
    "aip_stream_stage_events_total", "aip_worker_gc_seconds_total",
)  # fmt: skip
"""The worker's series the harness reads: it asks for only these (``name[]``), so a page holds no per-GPU series."""
METRICS_PATH = "/metrics?" + "&".join(f"name[]={n}" for n in READ_METRICS)
STAGES = {"stage1": ("gpu.metrics", "jobs.lifecycle"), "stage2": ("interference.observations",)}


def grows(series: list[tuple[float, float]], tolerance: float) -> bool:
    """Whether the lag rose over the last half of ``series`` ((t, records)): the lowest lag of its last quarter is
    above the lowest of the quarter before by more than ``tolerance`` records.  Lows, not means: stage 2's input
    comes in bursts (every window of the fleet closes at once), while a backlog that grows lifts the lows too.

    >>> grows([(t, 10.0) for t in range(8)], 5.0), grows([(t, 10.0 * t) for t in range(8)], 5.0)
    (False, True)
    """
    if len(series) < 4:
        return False
    half = series[len(series) // 2 :]
    q = len(half) // 2
    third, last = [v for _t, v in half[:q]], [v for _t, v in half[q:]]
    return min(last) > min(third) + tolerance


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values``, nearest rank; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _snapshot(workers: list[Any]) -> dict[str, Any]:
    """Lag per stage (records, summed over workers), consumed and published counts, CPU seconds and RSS per worker."""
    import psutil

    from aip.faults.worker import metric_values

    out: dict[str, Any] = {
        "lag": dict.fromkeys(STAGES, 0.0), "consumed": {}, "observations": 0.0, "refits": 0.0, "refits_on_drift": 0.0, "refit_ms": 0.0, "cpu_s": [],
        "gc_s": [], "rss_mb": [], "unread": 0, "lag_by_worker": [],
    }  # fmt: skip
    for w in workers:
        try:
            text = w.get(METRICS_PATH, timeout_s=5.0)
        except OSError:  # a worker too busy to answer: its counts are not in this snapshot (``unread``)
            text = ""
            out["unread"] += 1
        own = {
            stage: sum(sum(metric_values(text, "aip_stream_consumer_lag_records", topic=t)) for t in topics)
            for stage, topics in STAGES.items()
        }
        out["lag_by_worker"].append(own)
        for stage, behind in own.items():
            out["lag"][stage] += behind
        for t in ("gpu.metrics", "jobs.lifecycle", "interference.observations"):
            out["consumed"][t] = out["consumed"].get(t, 0.0) + sum(
                metric_values(text, "aip_stream_consumed_records_total", topic=t)
            )
        out["observations"] += sum(metric_values(text, "aip_stream_published_records_total", topic="observations"))
        for kind, key in (("refits_applied", "refits"), ("refits_on_drift", "refits_on_drift"), ("refit_ms", "refit_ms")):
            out[key] += sum(metric_values(text, "aip_stream_stage_events_total", stage="stage2", kind=kind))
        out["gc_s"].append(sum(metric_values(text, "aip_worker_gc_seconds_total")))
        try:
            proc = psutil.Process(w.pid)
            times = proc.cpu_times()
            out["cpu_s"].append(
                times.user + times.system + sum(c.cpu_times().user + c.cpu_times().system for c in proc.children())
            )
            out["rss_mb"].append(proc.memory_info().rss / 2**20)
        except psutil.Error:
            out["cpu_s"].append(0.0)
            out["rss_mb"].append(0.0)
    return out


def _read_snapshot(workers: list[Any], tries: int = 5) -> dict[str, Any]:
    """:func:`_snapshot` with every worker's page read: tried again (a second apart) while one is ``unread``; the
    last try whatever it read."""
    snap = _snapshot(workers)
    for _ in range(tries - 1):
        if not snap["unread"]:
            break
        time.sleep(1.0)
        snap = _snapshot(workers)
    return snap


def interval_line(snap: dict[str, Any], prev: dict[str, Any], seconds: float) -> str:
    """Each worker's stage-1 lag and CPU over the last interval, and the sender's and the broker's CPU: which process
    a run that falls behind is short of.

    >>> now = {"lag_by_worker": [{"stage1": 40.0}, {"stage1": 0.0}], "cpu_s": [13.0, 11.0], "harness_cpu_s": {"sender": 6.0, "broker": 3.0}}
    >>> before = {"cpu_s": [10.0, 10.5], "harness_cpu_s": {"sender": 4.0, "broker": 2.5}}
    >>> interval_line(now, before, 5.0)
    'w0 lag 40, 60 % CPU; w1 lag 0, 10 % CPU; sender 40 %, broker 10 %'
    """
    if seconds <= 0:
        return ""
    pct = [100.0 * max(0.0, c - b) / seconds for c, b in zip(snap["cpu_s"], prev["cpu_s"], strict=True)]
    harness = {
        k: 100.0 * max(0.0, snap["harness_cpu_s"].get(k, 0.0) - prev["harness_cpu_s"].get(k, 0.0)) / seconds
        for k in ("sender", "broker")
    }
    workers = "; ".join(
        f"w{i} lag {lag['stage1']:.0f}, {p:.0f} % CPU" for i, (lag, p) in enumerate(zip(snap["lag_by_worker"], pct, strict=True))
    )
    return f"{workers}; sender {harness['sender']:.0f} %, broker {harness['broker']:.0f} %"


def read_points(series: list[tuple[float, dict[str, Any]]], stage: str) -> list[tuple[float, float]]:
    """A stage's lag over the run, from the snapshots that read every worker: one that could not read a worker (too
    busy to answer within its timeout, as a worker far behind may be) holds no lag of it, and counted as 0 it would
    hide a lag that grows.

    >>> read_points([(0.0, {"lag": {"stage1": 5.0}, "unread": 0}), (5.0, {"lag": {"stage1": 1.0}, "unread": 1})], "stage1")
    [(0.0, 5.0)]
    """
    return [(t, s["lag"][stage]) for t, s in series if not s["unread"]]


def run_fleet(
    gpus: int,
    workers: int,
    duration_s: float,
    workdir: Path,
    progress: Any,
    *,
    partitions: int = 8,
    drain_s: float = 30.0,
    serving: str = "sharded",
) -> dict[str, Any]:
    """One measured run (see the module docstring); returns the ``fleet`` object.  ``serving``: the workers'
    setting (sharded: a snapshot key made for the run unless ``AIP_SNAPSHOT_KEY`` gives one)."""
    import secrets

    from aip.bench import fleet_harness as harness
    from aip.broker import EmbeddedBroker, free_port
    from aip.faults.worker import WorkerProcess, wait_until
    from config import Settings
    from transport import ensure_project_topics

    workdir.mkdir(parents=True, exist_ok=True)
    with EmbeddedBroker(port=free_port()) as broker:
        settings = Settings.from_env(broker=broker.address, topic_prefix=f"fleet{int(time.time())}.", partitions=partitions)
        key = settings.snapshot_key or (secrets.token_hex(16) if serving == "sharded" else "")
        settings = dataclasses.replace(settings, serving=serving, snapshot_key=key)
        ensure_project_topics(settings)

        procs = [
            WorkerProcess(
                dataclasses.replace(settings, state_dir=str(workdir / f"w{i}" / "state")), free_port(), workdir / f"w{i}.log"
            )
            for i in range(workers)
        ]
        ctx = multiprocessing.get_context("spawn")
        stop, sent, read = ctx.Event(), ctx.Array("q", 2), ctx.Array("q", 1)
        sender = reader = None
        try:
            for w in procs:
                w.start()
            for w in procs:
                w.wait_ready(120)
            progress(f"{workers} workers ready; {gpus} GPUs at 1 Hz for {duration_s:g} s")
            sender_out, reader_out = workdir / "sender.json", workdir / "reader.json"
            reader = ctx.Process(target=harness.read_predictions, args=(settings, stop, read, str(reader_out)), daemon=True)
            reader.start()
            sender = ctx.Process(
                target=harness.send,
                args=(settings, gpus, GPUS_PER_HOST, None, duration_s, stop, sent, str(sender_out)),
                daemon=True,
            )
            sender.start()
            pids: dict[str, int | None] = {
                "broker": broker.process.pid if broker.process else None,
                "sender": sender.pid,
                "reader": reader.pid,
                "bench": os.getpid(),
            }
            base = _read_snapshot(procs) | {"harness_cpu_s": {k: harness.cpu_s(pid) for k, pid in pids.items()}}
            workers_pids: dict[str, int | None] = {f"w{i}": w.pid for i, w in enumerate(procs)}
            profilers = harness.start_profilers(workers_pids | pids, duration_s)
            t0 = time.monotonic()
            series: list[tuple[float, dict[str, Any]]] = []
            while sender.is_alive():
                sender.join(SAMPLE_EVERY_S)
                if time.monotonic() - t0 > duration_s + BEHIND_S and not stop.is_set():
                    stop.set()  # the simulator fell behind real time: what was not sent by now is not
                    progress(f"the sender is {time.monotonic() - t0 - duration_s:.0f} s behind real time: stopped")
                snap = _snapshot(procs)
                snap["harness_cpu_s"] = {k: harness.cpu_s(pid) for k, pid in pids.items()}
                snap["sent"] = sent[1]
                prev_t, prev = series[-1] if series else (0.0, base)
                series.append((time.monotonic() - t0, snap))
                progress(
                    f"{time.monotonic() - t0:5.0f} s: sent {sent[1]} GPU samples; lag stage 1 "
                    f"{snap['lag']['stage1']:.0f}, stage 2 {snap['lag']['stage2']:.0f} records; "
                    f"{snap['observations'] - base['observations']:.0f} observations, {read[0]} predictions; "
                    + interval_line(snap, prev, series[-1][0] - prev_t)
                )
            elapsed = time.monotonic() - t0
            behind = stop.is_set()
            sent_stats: dict[str, Any] = (
                json.loads(sender_out.read_text()) if sender_out.exists() else {"error": "the sender exited"}
            )
            if sent_stats.get("error"):
                raise RuntimeError(f"the fleet's sender failed: {sent_stats['error']}")
            end = dict(series[-1][1]) if series else _read_snapshot(procs) | {"harness_cpu_s": base["harness_cpu_s"]}
            last_read = next((snap for _t, snap in reversed(series) if not snap["unread"]), None)
            if end["unread"] and last_read is not None:  # the workers' counts as last read; CPU (psutil) as it is
                end.update({k: last_read[k] for k in ("observations", "refits", "refits_on_drift", "refit_ms")})
            try:  # what was sent is consumed: the counts check (a slow worker may need longer than the run)
                wait_until(
                    lambda: (
                        _snapshot(procs)["consumed"]["gpu.metrics"] - base["consumed"].get("gpu.metrics", 0)
                        >= sent_stats["batches"]
                    ),
                    drain_s,
                    "stage 1 to consume every batch",
                    interval_s=1.0,
                )
            except TimeoutError:
                pass
            drained = _read_snapshot(procs)
            stop.set()
            reader.join(30)
            preds: dict[str, Any] = json.loads(reader_out.read_text()) if reader_out.exists() else {}
            for p in profilers:
                p.wait(60)
        finally:
            stop.set()
            for child in (sender, reader):
                if child is not None and child.is_alive():
                    child.terminate()
            for w in procs:
                w.stop(30)
    consumed_batches = drained["consumed"]["gpu.metrics"] - base["consumed"].get("gpu.metrics", 0)
    samples_per_batch = sent_stats["samples"] / sent_stats["batches"] if sent_stats["batches"] else 0.0
    observations = end["observations"] - base["observations"]
    cpu_s = [max(0.0, e - b) for e, b in zip(end["cpu_s"], base["cpu_s"], strict=True)]  # a refit child may have exited
    harness_cpu_s = {k: max(0.0, end["harness_cpu_s"][k] - base["harness_cpu_s"][k]) for k in base["harness_cpu_s"]}
    send_cpu_s = sent_stats.get("send_cpu_s")
    for k, stats in (("sender", sent_stats), ("reader", preds)):  # a child's own count at its exit (psutil: gone)
        if "cpu_s" in stats:
            harness_cpu_s[k] = stats["cpu_s"]
    lag: dict[str, Any] = {}
    rates = {"stage1": (sent_stats["batches"] + sent_stats["job_batches"]) / elapsed, "stage2": observations / elapsed}
    for stage in STAGES:
        points = read_points(series, stage)
        most = max((v for _t, v in points), default=0.0)
        lag[stage] = {
            "max_records": int(most),
            "max_s": round(most / rates[stage], 2) if rates[stage] else None,
            "grows": grows(points, tolerance=max(10.0, 2.0 * rates[stage])),
            "max_records_by_worker": [
                int(max((snap["lag_by_worker"][i][stage] for _t, snap in series if not snap["unread"]), default=0.0))
                for i in range(workers)
            ],
        }
    p50, p99 = percentile(preds.get("latencies_s", []), 0.5), percentile(preds.get("latencies_s", []), 0.99)
    bound_s = settings.window_s + settings.lateness_s + 5.0
    all_consumed = consumed_batches >= sent_stats["batches"] > 0
    return {
        "gpus": gpus,
        "workers": workers,
        "serving": serving,
        "hosts": sent_stats.get("hosts"),
        "duration_s": round(elapsed, 1),
        "gpu_samples_sent": sent_stats["samples"],
        "job_events_sent": sent_stats["job_events"],
        "input_records_sent": sent_stats["batches"] + sent_stats["job_batches"],  # host batches of samples and of job events
        "gpu_samples_consumed": round(consumed_batches * samples_per_batch),
        "gpu_samples_per_s": round(min(consumed_batches, sent_stats["batches"]) * samples_per_batch / elapsed, 1),
        "observations_per_s": round(observations / elapsed, 2),
        "observations": int(observations),
        "predictions": len(preds.get("latencies_s", [])),
        "lag": lag,
        "p50_s": None if p50 is None else round(p50, 2),
        "p99_s": None if p99 is None else round(p99, 2),
        "p99_bound_s": bound_s,
        "read_p50_s": _round(percentile(preds.get("read_latencies_s", []), 0.5)),
        "read_p99_s": _round(percentile(preds.get("read_latencies_s", []), 0.99)),
        "sender_late_s": {
            "handed_p50": _round(percentile(sent_stats["handed_late_s"], 0.5)),
            "handed_p99": _round(percentile(sent_stats["handed_late_s"], 0.99)),
            "acked_p50": _round(percentile(sent_stats["acked_late_s"], 0.5)),
            "acked_p99": _round(percentile(sent_stats["acked_late_s"], 0.99)),
        },
        "latency_s_by_occupancy": {
            occupancy: {"predictions": len(v), "p50": _round(percentile(v, 0.5)), "p99": _round(percentile(v, 0.99))}
            for occupancy, v in sorted(preds.get("by_occupancy", {}).items())
        },
        "refits": round(end["refits"] - base["refits"]),
        "refits_on_drift": round(end["refits_on_drift"] - base["refits_on_drift"]),
        "refit_wall_s": round((end["refit_ms"] - base["refit_ms"]) / 1000.0, 2),
        "worker_cpu_pct": [round(100.0 * c / elapsed, 1) for c in cpu_s],
        "worker_gc_pct": [round(100.0 * max(0.0, e - b) / elapsed, 2) for e, b in zip(end["gc_s"], base["gc_s"], strict=True)],
        "worker_rss_mb": [round(r, 1) for r in end["rss_mb"]],
        "harness_cpu_pct": {k: round(100.0 * c / elapsed, 1) for k, c in harness_cpu_s.items()},
        "cpu_ms_per_gpu_sample": round(1000.0 * sum(cpu_s) / sent_stats["samples"], 4) if sent_stats["samples"] else None,
        "cpu_ms_per_observation": round(1000.0 * sum(cpu_s) / observations, 2) if observations else None,
        "cpu_ms_per_gpu_sample_last_half": last_half_cost([(t, sum(s["cpu_s"]), s["sent"]) for t, s in series]),
        "sender_cpu_ms_per_gpu_sample": round(1000.0 * send_cpu_s / sent_stats["samples"], 4)
        if send_cpu_s and sent_stats["samples"]
        else None,
        "sender_behind": behind,
        "metrics_unread": sum(1 for _t, snap in series if snap["unread"]),
        "kept_up": bool(
            all_consumed and not behind and not any(v["grows"] for v in lag.values()) and (p99 is None or p99 <= bound_s)
        ),
    }


def last_half_cost(points: list[tuple[float, float, float]]) -> float | None:
    """The workers' CPU milliseconds per GPU sample over the second half of a run, from ``(t, worker CPU seconds,
    GPU samples sent)`` taken along it.  The simulated fleet starts empty and its jobs arrive over the first minutes:
    the first half has fewer co-located windows (observations, what-if entries, refits) than a fleet in its stride.
    None with too few points.

    >>> last_half_cost([(0.0, 0.0, 0), (5.0, 1.0, 1000), (10.0, 2.0, 2000), (15.0, 2.5, 3000), (20.0, 3.0, 4000)])
    0.5
    """
    if len(points) < 3:
        return None
    half = points[-1][0] / 2.0
    start = next(p for p in points if p[0] >= half)
    end = points[-1]
    return round(1000.0 * (end[1] - start[1]) / (end[2] - start[2]), 4) if end[2] > start[2] else None


CURVE_GPUS = (500, 2000, 10_000)
"""Fleet sizes of the cost curve."""
CURVE_S = {False: 120.0, True: 60.0}
"""Seconds of each cost-curve run other than the main one (full, ``--quick``)."""


def curve_point(fleet: dict[str, Any]) -> dict[str, Any]:
    """One point of the cost curve: what a fleet run cost per GPU sample and per observation.

    >>> curve_point({"gpus": 500, "duration_s": 60.2, "cpu_ms_per_gpu_sample": 0.2, "cpu_ms_per_observation": 9.5,
    ...              "worker_cpu_pct": [10.0, 5.0], "kept_up": True, "lag": {}})
    {'gpus': 500, 'duration_s': 60.2, 'cpu_ms_per_gpu_sample': 0.2, 'cpu_ms_per_observation': 9.5, 'worker_cpu_pct': [10.0, 5.0], 'kept_up': True}
    """
    keys = ("gpus", "duration_s", "cpu_ms_per_gpu_sample", "cpu_ms_per_observation", "worker_cpu_pct", "kept_up")
    return {k: fleet[k] for k in keys}


def plot_curve(points: list[dict[str, Any]], path: Any) -> None:
    """The cost curve: the workers' CPU per GPU sample against the fleet's size, each point with its run's length (the
    main run is longer than the others, and stage 2's refits weigh less in a shorter one); a size without figures is
    left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [p for p in points if p.get("cpu_ms_per_gpu_sample") is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["gpus"] for p in done], [p["cpu_ms_per_gpu_sample"] for p in done], marker="o")
    for p in done:
        label = f"{p['cpu_ms_per_gpu_sample']:.3f} ms, {p.get('duration_s', 0):.0f} s run" + ("" if p["kept_up"] else ", behind")
        ax.annotate(label, (p["gpus"], p["cpu_ms_per_gpu_sample"]), textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax.set_xscale("log")
    ax.margins(x=0.35, y=0.2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("GPUs at 1 Hz (one environment, 8 per host)")
    ax.set_ylabel("workers' CPU per GPU sample (ms)")
    ax.set_title("aip bench fleet: cost curve")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(
    quick: bool,
    progress: Any,
    gpus: int | None = None,
    workers: int | None = None,
    serving: str = "sharded",
    plot_dir: str | None = None,
) -> dict[str, Any]:
    """The main run (``--gpus``, default 10,000; ``--quick`` 2,000), then, unless ``--gpus`` was given, shorter
    runs at the other sizes of :data:`CURVE_GPUS`: ``cost_curve`` lists every size's CPU per unit, drawn to
    ``<plot_dir>/fleet_cost_curve.png`` with ``plot_dir``.  ``serving`` (default sharded: the design for one
    environment over several workers, docs/ARCHITECTURE.md)."""
    import tempfile

    n = gpus or (2000 if quick else 10_000)
    w = workers or 2
    with tempfile.TemporaryDirectory() as tmp:
        main = run_fleet(n, w, 120.0 if quick else 600.0, Path(tmp) / "main", progress, serving=serving)
        points = {n: curve_point(main)}
        for size in () if gpus else (g for g in CURVE_GPUS if g != n):
            progress(f"cost curve: {size} GPUs for {CURVE_S[quick]:g} s")
            try:
                points[size] = curve_point(
                    run_fleet(size, w, CURVE_S[quick], Path(tmp) / f"curve{size}", progress, serving=serving)
                )
            except Exception as exc:  # one size this machine cannot run is a point without figures, not a lost curve
                points[size] = {"gpus": size, "error": f"{type(exc).__name__}: {exc}"}
    curve = [points[g] for g in sorted(points)]
    out = main | {"cost_curve": curve}
    if plot_dir:
        path = Path(plot_dir) / "fleet_cost_curve.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        plot_curve(curve, path)
        out["plot"] = str(path)
    return {"fleet": out}

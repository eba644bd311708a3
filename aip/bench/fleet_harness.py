"""The harness of ``aip bench fleet`` in its own processes: the simulated fleet's sender and the predictions' reader.

Each runs in a child process (``multiprocessing``, spawn) so that its CPU is neither the workers' nor the parent's:
:func:`aip.bench.fleet.run_fleet` reports it apart (``harness_cpu_pct``).  A child shares live counts through
``multiprocessing.Value`` and writes what it measured, as JSON, to a file the parent reads after it exits.  A profile
of the workers (``AIP_BENCH_FLEET_PROFILE``) is taken by :func:`start_profilers`, outside the processes it samples.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec

PROFILE_ENV = "AIP_BENCH_FLEET_PROFILE"
"""A folder: every worker (and harness child) of the run is sampled by py-spy into ``<folder>/<name>.txt``, as
collapsed stacks (py-spy from ``AIP_PYSPY`` or ``PATH``; without it the run goes on unprofiled)."""
PROFILE_RATE_HZ = 67
PROFILE_GIL_ENV = "AIP_BENCH_FLEET_PROFILE_GIL"
"""Set (to anything but empty or 0): py-spy samples only the thread holding the GIL (``--gil``), so a thread waiting
for it is not counted where it waits (``--nonblocking`` alone counts a socket write's wait for the GIL as the
write)."""
SEND_BATCH_BYTES = 1_000_000
"""The sender's producer batches (kafka-python's ``batch_size``, 16 KB by default: a few host batches).  Sending 6 s
of a 10,000-GPU fleet's host batches unpaced to the embedded broker cost 0.050-0.051 ms of CPU a record against
0.097-0.104 with the default; in the 600 s 10,000-GPU run the sender took 38.0 % of a core, 73.1 % before
(docs/BENCHMARKS.md)."""
SEND_LINGER_MS = 100
"""How long the sender's producer waits to fill a batch.  A tick's samples go out over 0.4 s; at 20 ms a partition of
the 10,000-GPU fleet could get up to 50 batches a second (one per linger; not counted), and the embedded broker lists
every batch a partition holds at each fetch below its end (docs/BENCHMARKS.md, "The embedded broker's fetches"): its
CPU grew over the run with them.  100 ms: at most a fifth as many, each sample handed over at most 0.1 s later
(windows are 10 s)."""


def send(settings: Any, gpus: int, gpus_per_host: int, start_ts: float, duration_s: float, stop: Any, counts: Any,
         out_path: str) -> None:  # fmt: skip
    """The sender child: simulates ``gpus`` GPUs (seed 23, v100) from ``start_ts`` for ``duration_s`` and sends them
    host-batched, paced at real time.  ``counts``: shared [metric batches, samples] so far.  Writes ``out_path``:
    batches and samples of metrics and of job events handed to the producer, hosts, how late after its tick each
    metrics batch was handed over and acknowledged, the CPU seconds of the whole process (``cpu_s``) and of its
    sending alone (``send_cpu_s``: simulating and producing, a fixed amount of work for a given fleet and duration);
    ``error`` when it failed."""
    from producers.batching import host_batches
    from producers.pacing import paced
    from producers.sim import Simulator
    from transport import RecordProducer

    out: dict[str, Any] = {"batches": 0, "samples": 0, "job_batches": 0, "job_events": 0, "handed_late_s": [],
                           "acked_late_s": [], "error": None}  # fmt: skip
    acked: list[float] = out["acked_late_s"]
    try:
        sim = Simulator(gpus, "v100", seed=23, start_ts=start_ts, duration_s=duration_s, gpus_per_host=gpus_per_host)
        out["hosts"] = len({g.host for g in sim.gpus})
        with RecordProducer(settings, linger_ms=SEND_LINGER_MS, max_request_size=8_000_000, batch_size=SEND_BATCH_BYTES) as p:
            sending_from = time.process_time()
            for topic, record in paced(host_batches(sim.events()), 1.0, sim.start_ts):
                if stop.is_set():
                    break
                future = p.send(topic, record)
                if topic == "gpu.metrics":
                    out["handed_late_s"].append(time.time() - record.ts)
                    future.add_callback(lambda _m, ts=record.ts: acked.append(time.time() - ts))
                    out["batches"] += 1
                    out["samples"] += len(record.samples)
                    counts[0], counts[1] = out["batches"], out["samples"]
                else:
                    out["job_batches"] += 1
                    out["job_events"] += len(record.events)
            p.flush(60)
            out["send_cpu_s"] = time.process_time() - sending_from
    except BaseException as exc:  # reported by the parent
        if not stop.is_set():
            out["error"] = f"{type(exc).__name__}: {exc}"
        # stopped behind real time: the producer's backlog cannot be flushed in time, and is not counted as sent
    out["cpu_s"] = time.process_time()  # every thread of this process, from its start (the parent reads it at exit)
    Path(out_path).write_text(json.dumps(out))


class Stamps(msgspec.Struct):
    """What the reader takes of a prediction (:class:`events.Prediction`'s fields of the same names; the rest of the
    record is skipped, not decoded: whole predictions, 26 what-if entries each, validated, were 40 % of the reader's
    CPU at 10,000 GPUs)."""

    ts: float
    window_end: float | None = None
    occupancy: str | None = None


def read_predictions(settings: Any, stop: Any, counts: Any, out_path: str) -> None:
    """The reader child: reads ``interference.predictions`` from the beginning until ``stop``; writes ``out_path``:
    per prediction the seconds from its window's end to its ``ts`` (``latencies_s``, and by occupancy) and to its
    reading here (``read_latencies_s``).  ``counts``: shared [predictions read]."""
    from transport import RecordConsumer

    latencies_s: list[float] = []
    read_latencies_s: list[float] = []
    by_occupancy: dict[str, list[float]] = {}
    stamps = msgspec.json.Decoder(Stamps)
    with RecordConsumer(settings, ["interference.predictions"], from_beginning=True) as consumer:
        while not stop.is_set():
            for value in consumer.poll_values(timeout_s=0.5):
                try:
                    p = stamps.decode(value) if value is not None else None
                except msgspec.DecodeError:  # not a prediction's JSON: not counted
                    continue
                if p is not None and p.window_end is not None:
                    latency_s = p.ts - p.window_end
                    latencies_s.append(latency_s)
                    read_latencies_s.append(time.time() - p.window_end)
                    by_occupancy.setdefault(p.occupancy or "colocated", []).append(latency_s)
            counts[0] = len(latencies_s)
    out = {"latencies_s": latencies_s, "read_latencies_s": read_latencies_s, "by_occupancy": by_occupancy,
           "cpu_s": time.process_time()}  # fmt: skip
    Path(out_path).write_text(json.dumps(out))


def cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) of a process and its children so far (this process: its own only, its children
    are the ones measured); 0 when it is gone."""
    import psutil

    if pid is None:
        return 0.0
    try:
        proc = psutil.Process(pid)
        times = proc.cpu_times()
        children = proc.children() if pid != os.getpid() else []
        return float(times.user + times.system + sum(c.cpu_times().user + c.cpu_times().system for c in children))
    except psutil.Error:
        return 0.0


def pyspy() -> str | None:
    """The py-spy to profile with: ``AIP_PYSPY``, else one on ``PATH``."""
    return os.environ.get("AIP_PYSPY") or shutil.which("py-spy")


def start_profilers(pids: dict[str, int | None], duration_s: float) -> list[subprocess.Popen[bytes]]:
    """With ``AIP_BENCH_FLEET_PROFILE`` set and py-spy found: one ``py-spy record`` per process (collapsed stacks,
    :data:`PROFILE_RATE_HZ`, idle frames left out; with :data:`PROFILE_GIL_ENV`, the GIL's holder only) for
    ``duration_s``; else none."""
    folder, exe = os.environ.get(PROFILE_ENV), pyspy()
    gil = ["--gil"] if os.environ.get(PROFILE_GIL_ENV, "") not in ("", "0") else []
    if not folder or not exe:
        return []
    Path(folder).mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(pid),
                "--format",
                "raw",
                "--rate",
                str(PROFILE_RATE_HZ),
                "--duration",
                str(int(duration_s)),
                "--nonblocking",
                *gil,
                "--output",
                str(Path(folder) / f"{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
        if pid is not None
    ]

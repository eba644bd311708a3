"""A simulated GPU fleet calibrated on measured throughputs (Gavel) and solo profiles (MISO).

Each GPU runs a chain of jobs: a job starts (usually alone), after 40-90 s of
sim time a newcomer joins it (a type Gavel could co-run with it and that fits
in memory), sometimes a third job joins for a while, after 60-180 s together
the older job finishes and the newcomer runs alone until the next one
arrives.  With probability ``p_gap`` the older job finishes before the next
arrives, so that job also starts solo.  Throughputs while sharing come from
Gavel's measured pairs; metrics from :mod:`producers.calibration`'s contention
model with noise.  Everything is deterministic for a seed.

Timing inside each simulated second ``k`` (sim time ``start_ts + k``): metric
samples at ``+0.05..+0.45`` (one per GPU, describing the previous second),
lifecycle events at ``+0.5``.  Jobs start and finish on the half second and
report progress every ``progress_interval_s`` (2 s) with their cumulative steps
and the mean step time since the previous report (noise: sigma 0.2 %, at most 0.5 %).

>>> sim = Simulator(gpus=2, seed=1, start_ts=1_700_000_000.0, duration_s=300)
>>> kinds = {(topic, getattr(r, "kind", None)) for topic, r in sim.events()}
>>> sorted(kinds)  # doctest: +NORMALIZE_WHITESPACE
[('gpu.metrics', None), ('jobs.lifecycle', 'finished'), ('jobs.lifecycle', 'progress'),
 ('jobs.lifecycle', 'started')]
>>> truth = sim.ground_truth
>>> truth[0]["interference_pct"] == round(truth[0]["interference_pct"], 6)
True
"""

from __future__ import annotations

import itertools
import json
import math
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from events import GpuProcess, JobEvent, MetricSample
from events.topics import LIFECYCLE, METRICS
from producers import calibration as cal


@dataclass
class SimJob:
    job_id: str
    job_type: str
    pid: int
    start_k: int  # starts at start_ts + start_k + 0.5
    end_k: int  # finishes at start_ts + end_k + 0.5
    profile: cal.SoloProfile
    steps_f: float = 0.0
    last_steps_f: float = 0.0
    last_report_k: int = 0
    process: GpuProcess = field(init=False)

    def __post_init__(self) -> None:
        self.process = GpuProcess(pid=self.pid, used_mem_mb=round(self.profile.mem_used_mb, 1))  # a record: immutable


@dataclass
class SimGpu:
    index: int
    uuid: str
    host: str
    jobs: list[SimJob] = field(default_factory=list)
    seq: int = 0
    temp_c: float = 35.0
    energy_mj: float = 0.0


MIN_SPEED_FRACTION = 0.2
"""Never co-locate jobs one of which would keep less than this of its solo speed (a
scheduler would not; Gavel has a few pairs measured at near-zero throughput)."""


class Simulator:
    """Deterministic simulated fleet; :meth:`events` yields ``(topic_base, record)`` in time order."""

    def __init__(
        self,
        gpus: int,
        gpu_model: str = "v100",
        seed: int = 0,
        start_ts: float | None = None,
        duration_s: float = 600.0,
        *,
        max_jobs_per_gpu: int = 3,
        progress_interval_s: int = 2,
        p_third: float = 0.3,
        p_gap: float = 0.35,
        job_types: list[str] | None = None,
        gpus_per_host: int = 8,
    ) -> None:
        if gpus < 1:
            raise ValueError("gpus must be at least 1")
        if gpu_model not in cal.GPUS:
            raise ValueError(f"unknown gpu model {gpu_model!r}; choose one of {', '.join(cal.GPU_MODELS)}")
        self.gpu_model = gpu_model
        self.seed = seed
        self.start_ts = time.time() if start_ts is None else float(start_ts)
        self.duration_s = float(duration_s)
        self.ticks = max(0, math.ceil(self.duration_s))
        self.progress_interval_s = max(1, int(progress_interval_s))
        self.max_jobs_per_gpu = max(1, min(3, max_jobs_per_gpu))
        self.p_third = p_third
        self.p_gap = p_gap
        self.producer_id = f"sim-{seed}"
        self.table = cal.gavel_table(gpu_model)
        self.types = sorted(job_types) if job_types else sorted(self.table)
        unknown = [t for t in self.types if t not in self.table]
        if unknown:
            raise ValueError(f"unknown job types for {gpu_model}: {unknown}")
        self.profiles = {t: cal.solo_profile(gpu_model, t) for t in self.types}
        self.spec = cal.GPUS[gpu_model]
        self._fractions: dict[tuple[str, ...], list[float]] = {}
        self._metrics: dict[tuple[str, ...], dict[str, float]] = {}
        self.gpus = [self._build_gpu(g, gpus_per_host) for g in range(gpus)]

    # ------------------------------------------------------------------ schedule
    def _rng(self, g: int, salt: int) -> random.Random:
        return random.Random(self.seed * 1_000_003 + g * 7919 + salt)

    def _fits(self, types: list[str]) -> bool:
        if sum(self.profiles[t].mem_used_mb for t in types) > 0.95 * self.spec.mem_total_mb:
            return False
        for i, t in enumerate(types):
            frac = cal.speed_fraction(self.table, t, [o for k, o in enumerate(types) if k != i])
            if frac is None or frac < MIN_SPEED_FRACTION:
                return False
        return True

    def _pick(self, rng: random.Random, running: list[str]) -> str | None:
        candidates = [t for t in self.types if self._fits([*running, t])]
        return rng.choice(candidates) if candidates else None

    def _build_gpu(self, g: int, per_host: int) -> SimGpu:
        rng = self._rng(g, 1)
        gpu = SimGpu(
            index=g % per_host,
            uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}",
            host=f"sim{self.seed}-host{g // per_host:02d}",
        )
        gpu.temp_c = cal.steady_temp_c(self.gpu_model, self.spec.idle_w)
        jobs: list[SimJob] = []

        def new_job(job_type: str, start_k: int) -> SimJob:
            job = SimJob(
                job_id=f"sim{self.seed}-g{g}-j{len(jobs)}",
                job_type=job_type,
                pid=10_000 + g * 1000 + len(jobs),
                start_k=start_k,
                end_k=1 << 40,
                profile=self.profiles[job_type],
            )
            jobs.append(job)
            return job

        horizon = self.ticks + 1
        cur = new_job(rng.choice(self.types), rng.randint(0, 3))
        solo_until = cur.start_k + rng.randint(40, 90)
        while solo_until < horizon:
            newcomer_type = self._pick(rng, [cur.job_type]) if self.max_jobs_per_gpu >= 2 else None
            if newcomer_type is None or rng.random() < self.p_gap:
                # the job finishes alone; the next one starts solo after a short gap
                cur.end_k = solo_until
                cur = new_job(rng.choice(self.types), solo_until + rng.randint(2, 8))
                solo_until = cur.start_k + rng.randint(40, 90)
                continue
            newcomer = new_job(newcomer_type, solo_until)
            together = rng.randint(60, 180)
            cur.end_k = solo_until + together
            if self.max_jobs_per_gpu >= 3 and together > 80 and rng.random() < self.p_third:
                third_type = self._pick(rng, [cur.job_type, newcomer_type])
                if third_type is not None:
                    third = new_job(third_type, solo_until + rng.randint(20, together - 60))
                    third.end_k = third.start_k + rng.randint(30, cur.end_k - 10 - third.start_k)
            # the newcomer outlives the older job and runs solo before the next arrival
            solo_until = cur.end_k + rng.randint(40, 90)
            cur = newcomer
        gpu.jobs = sorted(jobs, key=lambda j: (j.start_k, j.job_id))
        return gpu

    # ------------------------------------------------------------------ arithmetic
    def fractions(self, types: tuple[str, ...]) -> list[float]:
        """Speed fraction of each job (in order) when ``types`` share a GPU."""
        cached = self._fractions.get(types)
        if cached is None:
            cached = []
            for i, t in enumerate(types):
                f = cal.speed_fraction(self.table, t, [o for k, o in enumerate(types) if k != i])
                cached.append(1.0 if f is None else f)
            self._fractions[types] = cached
        return cached

    def _active(self, gpu: SimGpu, k: int) -> list[SimJob]:
        """Jobs running during (start_ts + k - 0.5, start_ts + k + 0.5)."""
        return [j for j in gpu.jobs if j.start_k < k <= j.end_k]

    # ------------------------------------------------------------------ events
    def events(self) -> Iterator[tuple[str, Any]]:
        """``(topic_base, record)`` in non-decreasing timestamp order, one simulated second at a time."""
        rngs = [self._rng(g.index + i * 4096, 2) for i, g in enumerate(self.gpus)]
        n = len(self.gpus)
        unavailable = ["dram_bw_util_pct"] + ([] if self.spec.energy_counter else ["energy_mj"])
        decay = 1.0 - math.exp(-1.0 / 20.0)
        for k in range(self.ticks):
            lifecycle: list[JobEvent] = []
            for gi, gpu in enumerate(self.gpus):
                rng = rngs[gi]
                active = self._active(gpu, k)
                fr = self.fractions(tuple(j.job_type for j in active))
                for j, a in zip(active, fr, strict=True):
                    j.steps_f += j.profile.throughput * a
                if k > 0:
                    yield METRICS, self._sample(gpu, gi, n, k, active, fr, rng, unavailable, decay)
                lifecycle.extend(self._job_events(gpu, k, rng))
            for ev in lifecycle:
                yield LIFECYCLE, ev

    def _sample(
        self,
        gpu: SimGpu,
        gi: int,
        n: int,
        k: int,
        active: list[SimJob],
        fr: list[float],
        rng: random.Random,
        unavailable: list[str],
        decay: float,
    ) -> MetricSample:
        spec = self.spec
        if active:
            types = tuple(j.job_type for j in active)
            m = self._metrics.get(types)  # a job's profile is its type's: the noiseless metrics are the set's
            if m is None:
                m = self._metrics[types] = cal.combine(self.gpu_model, [j.profile for j in active], fr)
        else:
            m = {
                "power_w": spec.idle_w,
                "sm_util_pct": 0.0,
                "mem_util_pct": 0.0,
                "mem_used_mb": 0.0,
                "pcie_rx_kbps": 40.0,
                "pcie_tx_kbps": 20.0,
            }
        power = max(0.0, m["power_w"] * (1.0 + rng.gauss(0.0, 0.01)))
        gpu.temp_c += (cal.steady_temp_c(self.gpu_model, power) - gpu.temp_c) * decay
        gpu.energy_mj += power * 1000.0
        sample = MetricSample(
            ts=self.start_ts + k + 0.05 + 0.4 * gi / n,
            host=gpu.host,
            gpu_uuid=gpu.uuid,
            gpu_index=gpu.index,
            gpu_model=self.gpu_model,
            seq=gpu.seq,
            power_w=round(power, 2),
            temp_c=round(gpu.temp_c + rng.gauss(0.0, 0.2), 1),
            sm_util_pct=_clip_pct(m["sm_util_pct"] + rng.gauss(0.0, 0.8)),
            mem_util_pct=_clip_pct(m["mem_util_pct"] + rng.gauss(0.0, 0.6)),
            mem_used_mb=round(m["mem_used_mb"] + 0.005 * spec.mem_total_mb, 1),
            mem_total_mb=spec.mem_total_mb,
            pcie_rx_kbps=round(max(0.0, m["pcie_rx_kbps"] * (1.0 + rng.gauss(0.0, 0.08))), 1),
            pcie_tx_kbps=round(max(0.0, m["pcie_tx_kbps"] * (1.0 + rng.gauss(0.0, 0.08))), 1),
            energy_mj=round(gpu.energy_mj, 1) if spec.energy_counter else None,
            dram_bw_util_pct=None,
            processes=[j.process for j in active],
            producer_id=self.producer_id,
            unavailable=unavailable,
        )
        gpu.seq += 1
        return sample

    def _job_events(self, gpu: SimGpu, k: int, rng: random.Random) -> list[JobEvent]:
        out: list[JobEvent] = []
        ts = self.start_ts + k + 0.5
        for j in gpu.jobs:
            if j.start_k > k:
                break
            if k > j.end_k or (j.start_k < k < j.end_k and (k - j.start_k) % self.progress_interval_s):
                continue  # finished, or between reports: nothing to say this tick
            common = {
                "ts": ts,
                "job_id": j.job_id,
                "job_type": j.job_type,
                "gpu_uuid": gpu.uuid,
                "host": gpu.host,
                "pid": j.pid,
                "batch_size": cal.batch_size(j.job_type),
                "producer_id": self.producer_id,
            }
            if j.start_k == k:
                j.last_report_k = k
                out.append(JobEvent(kind="started", steps=0, **common))
            elif k == j.end_k:
                out.append(JobEvent(kind="finished", steps=int(j.steps_f), exit_code=0, **common))
            else:
                done = j.steps_f - j.last_steps_f
                step_time_s = (k - j.last_report_k) / done if done > 0 else None
                if step_time_s is not None:
                    noise = max(-0.005, min(0.005, rng.gauss(0.0, 0.002)))
                    out.append(JobEvent(kind="progress", steps=int(j.steps_f), step_time_s=step_time_s * (1.0 + noise), **common))
                    j.last_steps_f = j.steps_f
                    j.last_report_k = k
        return out

    # ------------------------------------------------------------------ ground truth
    @property
    def ground_truth(self) -> list[dict[str, Any]]:
        """The true interference of every job in every co-location inside the simulated span."""
        rows: list[dict[str, Any]] = []
        limit = self.ticks
        for gpu in self.gpus:
            bounds = sorted({b for j in gpu.jobs for b in (j.start_k, j.end_k) if b < limit} | {limit})
            for lo, hi in itertools.pairwise(bounds):
                active = [j for j in gpu.jobs if j.start_k <= lo and j.end_k >= hi]
                if len(active) < 2:
                    continue
                fr = self.fractions(tuple(j.job_type for j in active))
                for i, (j, a) in enumerate(zip(active, fr, strict=True)):
                    others = [o for k, o in enumerate(active) if k != i]
                    rows.append(
                        {
                            "gpu_uuid": gpu.uuid,
                            "environment": self.gpu_model,
                            "job_id": j.job_id,
                            "job_type": j.job_type,
                            "batch_size": cal.batch_size(j.job_type),
                            "co_job_types": [o.job_type for o in others],
                            "co_job_ids": [o.job_id for o in others],
                            "start_ts": self.start_ts + lo + 0.5,
                            "end_ts": self.start_ts + hi + 0.5,
                            "solo_throughput": j.profile.throughput,
                            "colocated_throughput": j.profile.throughput * a,
                            "interference_pct": round(cal.interference_pct(1.0, a), 6),
                        }
                    )
        rows.sort(key=lambda r: (r["start_ts"], r["gpu_uuid"], r["job_id"]))
        return rows

    def jobs(self) -> list[dict[str, Any]]:
        """Every scheduled job that starts inside the simulated span."""
        return [
            {
                "gpu_uuid": g.uuid,
                "job_id": j.job_id,
                "job_type": j.job_type,
                "start_ts": self.start_ts + j.start_k + 0.5,
                "end_ts": self.start_ts + j.end_k + 0.5,
            }
            for g in self.gpus
            for j in g.jobs
            if j.start_k < self.ticks
        ]

    def write_ground_truth(self, path: str | Path) -> int:
        """Write :attr:`ground_truth` as JSON lines; return the number of rows."""
        rows = self.ground_truth
        with open(path, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
        return len(rows)


def _clip_pct(value: float) -> float:
    return round(min(100.0, max(0.0, value)), 1)

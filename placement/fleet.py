"""An event-driven GPU fleet for placement experiments (pure: no Kafka, no models).

Jobs arrive with a job type and an amount of work (seconds of solo run time).
A placement policy picks one of the GPUs that can take the job; while jobs
share a GPU each runs at the speed fraction :func:`speed_of` gives it (the
ground truth, from Gavel's measured pairs).  A job that finds no GPU waits in a
queue and is placed, by the same policy, when a job finishes.

Job slowdown (percent) is ``run_time / solo_run_time * 100 - 100``: the
interference rate (docs/ARCHITECTURE.md, "Definitions") averaged over the job's life; time spent
queued is reported separately.

>>> jobs = [Job("j0", "a", 0.0, 10.0), Job("j1", "b", 1.0, 10.0)]
>>> speed = lambda types, i: 0.5 if len(types) > 1 else 1.0
>>> out = run_fleet(jobs, 1, LeastLoaded(), speed, fits=lambda types: len(types) <= 2)
>>> [(r.job_id, round(r.slowdown_pct, 1)) for r in out]
[('j0', 90.0), ('j1', 90.0)]
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Job:
    job_id: str
    job_type: str
    arrival_s: float
    work_s: float
    """Run time when alone on a GPU (s)."""


@dataclass(frozen=True)
class JobResult:
    job_id: str
    job_type: str
    gpu: str
    arrival_s: float
    start_s: float
    finish_s: float
    work_s: float

    @property
    def slowdown_pct(self) -> float:
        return ((self.finish_s - self.start_s) / self.work_s - 1.0) * 100.0

    @property
    def wait_s(self) -> float:
        return self.start_s - self.arrival_s


@dataclass
class Running:
    job: Job
    start_s: float
    remaining_s: float
    speed: float = 1.0


@dataclass
class Gpu:
    name: str
    jobs: list[Running] = field(default_factory=list)

    @property
    def types(self) -> list[str]:
        return [r.job.job_type for r in self.jobs]


class Policy(Protocol):
    """Chooses a GPU for a job among ``candidates`` (never empty); may observe starts and finishes."""

    name: str

    def choose(self, job: Job, candidates: Sequence[Gpu]) -> Gpu: ...

    def started(self, gpu: Gpu, job: Job, now_s: float) -> None: ...

    def finished(self, gpu: Gpu, job: Job, now_s: float) -> None: ...


class BasePolicy:
    name = "base"

    def choose(self, job: Job, candidates: Sequence[Gpu]) -> Gpu:
        return candidates[0]

    def started(self, gpu: Gpu, job: Job, now_s: float) -> None:
        pass

    def finished(self, gpu: Gpu, job: Job, now_s: float) -> None:
        pass


class RandomPolicy(BasePolicy):
    name = "random"

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def choose(self, job: Job, candidates: Sequence[Gpu]) -> Gpu:
        return self.rng.choice(list(candidates))


class LeastLoaded(BasePolicy):
    """The GPU with the fewest running jobs (the first such GPU on ties)."""

    name = "least_loaded"

    def choose(self, job: Job, candidates: Sequence[Gpu]) -> Gpu:
        return min(candidates, key=lambda g: len(g.jobs))


def arrivals(seed: int, n_jobs: int, job_types: Sequence[str], rate_per_s: float, work_s: tuple[float, float]) -> list[Job]:
    """A Poisson arrival sequence: uniform job types, log-uniform work.

    >>> [j.job_id for j in arrivals(1, 3, ["a", "b"], 0.1, (10.0, 100.0))]
    ['s1-j000', 's1-j001', 's1-j002']
    """
    rng = random.Random(seed)
    t = 0.0
    out = []
    lo, hi = math.log(work_s[0]), math.log(work_s[1])
    for i in range(n_jobs):
        t += rng.expovariate(rate_per_s)
        out.append(Job(f"s{seed}-j{i:03d}", rng.choice(list(job_types)), t, math.exp(rng.uniform(lo, hi))))
    return out


def _set_speeds(gpu: Gpu, speed_of: Callable[[list[str], int], float]) -> None:
    types = gpu.types
    for i, r in enumerate(gpu.jobs):
        r.speed = max(1e-6, speed_of(types, i))


def run_fleet(
    jobs: Sequence[Job],
    n_gpus: int,
    policy: Policy,
    speed_of: Callable[[list[str], int], float],
    fits: Callable[[list[str]], bool],
    gpu_names: Sequence[str] | None = None,
) -> list[JobResult]:
    """Run the arrival sequence to completion under ``policy``; one result per job, in finishing order.

    ``speed_of(types, i)``: speed fraction of job ``i`` among the ``types`` sharing a GPU;
    ``fits(types)``: whether those job types can share one GPU (memory, could run together).
    """
    gpus = [Gpu(name) for name in (gpu_names or [f"gpu-{i}" for i in range(n_gpus)])]
    pending = sorted(jobs, key=lambda j: j.arrival_s)
    queue: list[Job] = []
    results: list[JobResult] = []
    now = 0.0
    nxt = 0

    def place(job: Job) -> bool:
        candidates = [g for g in gpus if fits([*g.types, job.job_type])]
        if not candidates:
            return False
        gpu = policy.choose(job, candidates)
        gpu.jobs.append(Running(job, now, job.work_s))
        _set_speeds(gpu, speed_of)
        policy.started(gpu, job, now)
        return True

    while nxt < len(pending) or queue or any(g.jobs for g in gpus):
        t_arrival = pending[nxt].arrival_s if nxt < len(pending) else math.inf
        t_finish, first = math.inf, None
        for g in gpus:
            for r in g.jobs:
                t = now + r.remaining_s / r.speed
                if t < t_finish:
                    t_finish, first = t, (g, r)
        t_next = min(t_arrival, t_finish)
        if math.isinf(t_next):
            raise RuntimeError(f"{len(queue)} queued jobs can never be placed (does `fits` accept a single job?)")
        for g in gpus:
            for r in g.jobs:
                r.remaining_s -= r.speed * (t_next - now)
        now = t_next
        if first is not None and t_finish <= t_arrival:
            g, r = first
            g.jobs.remove(r)
            _set_speeds(g, speed_of)
            results.append(JobResult(r.job.job_id, r.job.job_type, g.name, r.job.arrival_s, r.start_s, now, r.job.work_s))
            policy.finished(g, r.job, now)
            queue = [j for j in queue if not place(j)]
        else:
            job = pending[nxt]
            nxt += 1
            if queue or not place(job):
                queue.append(job)
    return results


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100).

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50), percentile([5.0], 95)
    (2.5, 5.0)
    """
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary(results: Sequence[JobResult]) -> dict[str, float]:
    """Mean and p95 slowdown (%) and mean queue wait (s) of a run."""
    slow = [r.slowdown_pct for r in results]
    return {
        "mean_slowdown_pct": sum(slow) / len(slow) if slow else math.nan,
        "p95_slowdown_pct": percentile(slow, 95.0),
        "mean_wait_s": sum(r.wait_s for r in results) / len(results) if results else math.nan,
        "jobs": float(len(results)),
    }

"""The placement experiment: what are the predictions worth to a scheduler?

On a simulated fleet of V100s (throughputs measured by Gavel, solo profiles from
MISO, as in :mod:`producers.sim`) the same job arrival sequence is placed three
times: at random, on the least-loaded GPU, and where the scheduler client
(:class:`clients.SchedulerClient`) predicts the least interference.

No peeking: the client is fed :class:`events.Prediction` records whose what-if
entries come from :class:`models.environment.EnvironmentModels` trained only on the
measured observations of a *different* simulated fleet (the training period,
:class:`producers.sim.Simulator` with its own seed).  The true slowdowns of the
evaluated runs come from Gavel's measured pairs.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clients.scheduler import SchedulerClient
from events import JobEvent, Observation, Prediction, WhatIf
from placement.fleet import Gpu, Job, LeastLoaded, Policy, RandomPolicy, arrivals, run_fleet, summary
from producers import calibration as cal
from producers.sim import MIN_SPEED_FRACTION, Simulator

EPOCH_S = 1_700_000_000.0
"""Simulated time 0 as an epoch timestamp (records need real-looking timestamps)."""


@dataclass(frozen=True)
class Setup:
    gpu_model: str = "v100"
    gpus: int = 8
    jobs: int = 160
    load_jobs_per_gpu: float = 1.0
    """Mean number of jobs in the system per GPU if every job ran at solo speed."""
    work_s: tuple[float, float] = (300.0, 3000.0)
    train_seed: int = 10_000
    train_gpus: int = 16
    train_duration_s: float = 3600.0
    label_noise_pct: float = 0.5
    """Measurement noise of the training labels (step times, as stage 1 measures them)."""
    unseen_families: tuple[str, ...] = ()
    """Job families (:func:`models.features.parse_job_type`) the training fleet never runs: no training
    observation involves them, while the evaluated arrivals do (their solo profiles are known, as for any
    job that has run alone once)."""
    learning: bool = False
    """Also run the policies whose models learn every co-location they make (``guided_learning``,
    ``guided_explore``: :class:`LearningService`)."""


def family(job_type: str) -> str:
    """The job type without its batch size.

    >>> family("ResNet-50 (batch size 64)")
    'resnet-50'
    """
    from models.features import parse_job_type

    return parse_job_type(job_type)[0]


class Truth:
    """Ground truth of one GPU model: speed fractions from Gavel, feasibility as :class:`producers.sim.Simulator` has it."""

    def __init__(self, gpu_model: str) -> None:
        self.gpu_model = gpu_model
        self.table = cal.gavel_table(gpu_model)
        self.types = sorted(self.table)
        self.profiles = {t: cal.solo_profile(gpu_model, t) for t in self.types}
        self.mem_total_mb = cal.GPUS[gpu_model].mem_total_mb
        self._fits: dict[tuple[str, ...], bool] = {}

    def speed(self, types: list[str], i: int) -> float:
        frac = cal.speed_fraction(self.table, types[i], [t for k, t in enumerate(types) if k != i])
        return 1.0 if frac is None else frac

    def fits(self, types: list[str]) -> bool:
        """Memory fits and every job keeps at least :data:`MIN_SPEED_FRACTION` (the simulator's rule), at most 3 jobs."""
        key = tuple(sorted(types))
        cached = self._fits.get(key)
        if cached is None:
            cached = len(types) <= 3 and sum(self.profiles[t].mem_used_mb for t in types) <= 0.95 * self.mem_total_mb
            for i, t in enumerate(types):
                frac = cal.speed_fraction(self.table, t, [o for k, o in enumerate(types) if k != i])
                if cached and (frac is None or frac < MIN_SPEED_FRACTION):
                    cached = False
            self._fits[key] = cached
        return cached

    def solo(self, job_type: str) -> dict[str, float | None]:
        """The solo profile a stream worker would have learned (keys E T S V R W M throughput)."""
        p = self.profiles[job_type]
        m = cal.combine(self.gpu_model, [p], [1.0])
        return {
            "E": m["power_w"], "T": cal.steady_temp_c(self.gpu_model, m["power_w"]), "S": m["sm_util_pct"],
            "V": m["mem_util_pct"], "R": m["pcie_rx_kbps"], "W": m["pcie_tx_kbps"], "M": m["mem_used_mb"],
            "throughput": p.throughput,
        }  # fmt: skip


def training_observations(setup: Setup, truth: Truth) -> list[Observation]:
    """Measured observations of the training fleet (its own seed): what stage 1 would have published."""
    sim = Simulator(setup.train_gpus, setup.gpu_model, seed=setup.train_seed, start_ts=EPOCH_S, duration_s=setup.train_duration_s)
    rng = random.Random(setup.train_seed)
    out = []
    hidden = set(setup.unseen_families)
    for row in sim.ground_truth:
        if hidden and {family(t) for t in (row["job_type"], *row["co_job_types"])} & hidden:
            continue
        speed = row["colocated_throughput"] * (1.0 + rng.gauss(0.0, setup.label_noise_pct / 100.0))
        out.append(
            Observation(
                window_start=row["start_ts"], window_end=row["end_ts"], gpu_uuid=row["gpu_uuid"], environment=setup.gpu_model,
                job_id=row["job_id"], job_type=row["job_type"], co_job_types=row["co_job_types"], co_job_ids=row["co_job_ids"],
                solo=truth.solo(row["job_type"]), co_solo=[truth.solo(t) for t in row["co_job_types"]],
                interference_pct=cal.interference_pct(row["solo_throughput"], speed),
            )
        )  # fmt: skip
    return out


def train_models(setup: Setup, truth: Truth, progress: Callable[[str], None] = lambda m: None) -> Any:
    """EnvironmentModels of the environment, trained on the training fleet's observations, refitted once."""
    from models.environment import EnvironmentModels

    models = EnvironmentModels(setup.gpu_model, seed=setup.train_seed)
    observations = training_observations(setup, truth)
    progress(f"training on {len(observations)} observations of the training fleet (seed {setup.train_seed})")
    for obs in observations:
        models.learn(obs)
    if models.refit_due():
        models.refit_now()
    progress(f"trained; selected {models.selected().get('placement:all', '-')} for placement:all")
    return models


class WhatIfService:
    """Plays stage 2's part for the experiment: what-if entries per running job set, from the trained models."""

    def __init__(self, models: Any, truth: Truth, *, withhold_novel: bool = False) -> None:
        self.models = models
        self.truth = truth
        self.withhold_novel = withhold_novel
        """Leave out the entries of job types never measured (regime ``novel``): what a scheduler that ignores them sees."""
        self._cache: dict[tuple[str, ...], list[WhatIf]] = {}
        self.predictions_made = 0

    def _predict(self, job_type: str, co_types: Sequence[str]) -> Any:
        self.predictions_made += 1
        return self.models.predict_placement(
            job_type, self.truth.solo(job_type), list(co_types), [self.truth.solo(t) for t in co_types]
        )

    def what_if(self, running: Sequence[str]) -> list[WhatIf]:
        key = tuple(sorted(running))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        entries = []
        for t in self.truth.types:
            if not self.truth.fits([*key, t]):
                continue  # the scheduler would not offer this GPU anyway
            newcomer = self._predict(t, key)
            if newcomer is None or (self.withhold_novel and newcomer.regime == "novel"):
                continue
            existing, regime = 0.0, newcomer.regime
            for i, rt in enumerate(key):
                v = self._predict(rt, [*key[:i], *key[i + 1 :], t])
                existing += 0.0 if v is None else float(v.interference_pct)
                if v is not None and v.regime == "novel":  # a running job of a type never measured
                    regime = "novel"
            interval = None if newcomer.interval_pct is None else list(newcomer.interval_pct)
            entries.append(
                WhatIf(
                    job_type=t, newcomer_pct=float(newcomer.interference_pct), existing_pct=existing, interval_pct=interval,
                    regime=regime,
                )
            )
        self._cache[key] = entries
        return entries


class LearningService(WhatIfService):
    """A :class:`WhatIfService` whose models keep learning during the evaluated run, as a stream worker's would:
    every co-location a policy makes is measured (:meth:`measure`: each job's true slowdown, with the training
    fleet's label noise) and learned, and the entries are recomputed.  Its own copy of the models, so that one
    policy's measurements never reach another's."""

    def __init__(self, models: Any, truth: Truth, setup: Setup, seed: int) -> None:
        import copy

        super().__init__(copy.deepcopy(models), truth)
        self.rng = random.Random(seed)
        self.noise_pct = setup.label_noise_pct
        self.environment = setup.gpu_model
        self.measured = 0

    def measure(self, gpu: str, job_ids: Sequence[str], types: Sequence[str], now_s: float) -> None:
        if len(types) < 2:
            return
        for i, t in enumerate(types):
            co = [*types[:i], *types[i + 1 :]]
            speed = self.truth.speed(list(types), i) * (1.0 + self.rng.gauss(0.0, self.noise_pct / 100.0))
            self.models.learn(
                Observation(
                    window_start=EPOCH_S + now_s, window_end=EPOCH_S + now_s + 10.0, gpu_uuid=gpu, environment=self.environment,
                    job_id=job_ids[i], job_type=t, co_job_types=co, co_job_ids=[*job_ids[:i], *job_ids[i + 1 :]],
                    solo=self.truth.solo(t), co_solo=[self.truth.solo(c) for c in co],
                    interference_pct=slowdown_pct(speed),
                )
            )  # fmt: skip
            self.measured += 1
        self._cache.clear()  # what was learned changes the entries


class TruthService:
    """What-if entries from the ground truth itself, built as :class:`WhatIfService` builds them: the
    newcomer's true slowdown and the true summed slowdown of the jobs already there.  Guided placement on
    these (the ``oracle`` policy) is what perfect predictions would be worth to the same scheduler."""

    def __init__(self, truth: Truth) -> None:
        self.truth = truth
        self._cache: dict[tuple[str, ...], list[WhatIf]] = {}

    def what_if(self, running: Sequence[str]) -> list[WhatIf]:
        key = tuple(sorted(running))
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = [
                WhatIf(
                    job_type=t,
                    newcomer_pct=slowdown_pct(self.truth.speed([*key, t], len(key))),
                    existing_pct=sum(slowdown_pct(self.truth.speed([*key, t], i)) for i in range(len(key))),
                )
                for t in self.truth.types
                if self.truth.fits([*key, t])
            ]
        return cached


def slowdown_pct(speed_fraction: float) -> float:
    """The interference rate of a job running at ``speed_fraction`` of its solo speed.

    >>> slowdown_pct(0.5), slowdown_pct(1.0)
    (100.0, 0.0)
    """
    return (1.0 / speed_fraction - 1.0) * 100.0


class Guided:
    """Prediction-guided placement: every decision goes through :class:`SchedulerClient`."""

    def __init__(
        self, service: WhatIfService | TruthService, environment: str, risk: str = "expected", name: str | None = None,
        **client: Any,
    ) -> None:  # fmt: skip
        self.service = service
        self.environment = environment
        self.risk = risk
        self.name = name or ("guided" if risk == "expected" else f"guided_{risk}")
        self.client = SchedulerClient(max_age_s=float("inf"), clock=lambda: EPOCH_S, **client)
        """``client``: the scheduler client's ranking rules (``novel_risk``, ``explore_margin_pct``, ...)."""
        self._announced = False

    def choose(self, job: Job, candidates: Sequence[Gpu]) -> Gpu:
        if not self._announced:  # the scheduler knows its fleet starts idle
            self._announced = True
            self.client.mark_idle(*(g.name for g in candidates if not g.jobs))
        by_name = {g.name: g for g in candidates}
        best = self.client.best_gpu(job.job_type, list(by_name), risk=self.risk)
        return by_name[best] if best is not None else candidates[0]

    def _publish(self, gpu: Gpu, job: Job, kind: str, now_s: float) -> None:
        ts = EPOCH_S + now_s
        if isinstance(self.service, LearningService) and kind == "started":  # the new job set runs: it is measured
            self.service.measure(gpu.name, [r.job.job_id for r in gpu.jobs], gpu.types, now_s)
        self.client.on_job_event(
            JobEvent(ts=ts, kind=kind, job_id=job.job_id, job_type=job.job_type, gpu_uuid=gpu.name, host="sim")
        )
        if gpu.jobs:
            first = gpu.jobs[0].job
            self.client.update(
                Prediction(
                    ts=ts, gpu_uuid=gpu.name, environment=self.environment, job_id=first.job_id, job_type=first.job_type,
                    job_set=gpu.types, mode="placement", interference_pct=0.0, model="aip", category="all",
                    what_if=self.service.what_if(gpu.types),
                )
            )  # fmt: skip

    def started(self, gpu: Gpu, job: Job, now_s: float) -> None:
        self._publish(gpu, job, "started", now_s)

    def finished(self, gpu: Gpu, job: Job, now_s: float) -> None:
        self._publish(gpu, job, "finished", now_s)


EXPLORE_MARGIN_PCT = 10.0
"""The exploration margin of the ``guided_explore`` policy (points of predicted cost)."""


def run_seed(
    seed: int, setup: Setup, truth: Truth, service: WhatIfService, withheld: WhatIfService | None = None
) -> dict[str, dict[str, float]]:
    """One arrival sequence, placed by each policy (``oracle``: guided by the true slowdowns,
    :class:`TruthService`; with ``setup.unseen_families``, also ``guided_withheld``, guided by ``withheld``'s entries,
    which leave out novel job types, and ``guided_novel_expected``, novel entries ranked by their
    expected slowdown instead of their upper end; with ``setup.learning``, ``guided_learning`` and ``guided_explore``, whose models
    learn every co-location they make (:class:`LearningService`), the second exploring within
    :data:`EXPLORE_MARGIN_PCT`); per policy the :func:`placement.fleet.summary`, and with
    ``setup.unseen_families`` also ``<policy>.seen`` / ``<policy>.unseen``: the summaries of the jobs of families
    the training fleet ran / never ran."""
    mean_work = (setup.work_s[1] - setup.work_s[0]) / (_log(setup.work_s[1]) - _log(setup.work_s[0]))
    rate = setup.load_jobs_per_gpu * setup.gpus / mean_work
    jobs = arrivals(seed, setup.jobs, truth.types, rate, setup.work_s)
    names = [f"GPU-s{seed}-{i:02d}" for i in range(setup.gpus)]
    policies: list[Policy] = [
        RandomPolicy(seed), LeastLoaded(), Guided(service, setup.gpu_model), Guided(service, setup.gpu_model, "upper"),
        Guided(TruthService(truth), setup.gpu_model, name="oracle"),
    ]  # fmt: skip
    if setup.unseen_families:
        policies += [
            Guided(withheld or WhatIfService(service.models, truth, withhold_novel=True), setup.gpu_model, name="guided_withheld"),
            Guided(service, setup.gpu_model, name="guided_novel_expected", novel_risk="expected"),
        ]  # fmt: skip
    if setup.learning:
        policies += [
            Guided(LearningService(service.models, truth, setup, seed), setup.gpu_model, name="guided_learning"),
            Guided(
                LearningService(service.models, truth, setup, seed), setup.gpu_model, name="guided_explore",
                explore_margin_pct=EXPLORE_MARGIN_PCT,
            ),
        ]  # fmt: skip
    out = {}
    for policy in policies:
        results = run_fleet(jobs, setup.gpus, policy, truth.speed, truth.fits, gpu_names=names)
        out[policy.name] = summary(results)
        if setup.unseen_families:
            hidden = set(setup.unseen_families)
            out[f"{policy.name}.seen"] = summary([r for r in results if family(r.job_type) not in hidden])
            out[f"{policy.name}.unseen"] = summary([r for r in results if family(r.job_type) in hidden])
    return out


def _log(x: float) -> float:
    import math

    return math.log(x)


def aggregate(per_seed: Sequence[Mapping[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """Mean over seeds of each policy's figures.

    >>> aggregate([{"a": {"mean_slowdown_pct": 10.0}}, {"a": {"mean_slowdown_pct": 20.0}}])
    {'a': {'mean_slowdown_pct': 15.0}}
    """
    out: dict[str, dict[str, float]] = {}
    for policy in per_seed[0]:
        keys = per_seed[0][policy]
        out[policy] = {k: sum(s[policy][k] for s in per_seed) / len(per_seed) for k in keys}
    return out


def reduction_pct(guided: float, other: float) -> float:
    """How much lower ``guided`` is than ``other``, in percent of ``other``.

    >>> reduction_pct(30.0, 40.0)
    25.0
    """
    return (1.0 - guided / other) * 100.0 if other else 0.0


def run_experiment(seeds: Sequence[int], setup: Setup, progress: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    truth = Truth(setup.gpu_model)
    models = train_models(setup, truth, progress)
    service = WhatIfService(models, truth)
    withheld = WhatIfService(models, truth, withhold_novel=True)
    per_seed = []
    for seed in seeds:
        result = run_seed(seed, setup, truth, service, withheld)
        per_seed.append(result)
        progress(
            f"seed {seed}: mean slowdown " + ", ".join(f"{p} {r['mean_slowdown_pct']:.1f} %" for p, r in result.items())
            + f" ({service.predictions_made} predictions so far)"
        )  # fmt: skip
    overall = aggregate(per_seed)
    wins = sum(
        1
        for r in per_seed
        if r["guided"]["mean_slowdown_pct"] < min(r["random"]["mean_slowdown_pct"], r["least_loaded"]["mean_slowdown_pct"])
    )
    split: dict[str, Any] = {}
    learning = ("guided_learning", "guided_explore") if setup.learning else ()
    if setup.unseen_families:
        split["unseen_families"] = list(setup.unseen_families)
        for guided in ("guided", "guided_upper", "oracle", "guided_withheld", "guided_novel_expected", *learning):
            for part in ("seen", "unseen"):
                for other in ("least_loaded", "random"):
                    split[f"{guided}_beats_{other}_{part}_in_seeds"] = sum(
                        1
                        for r in per_seed
                        if r[f"{guided}.{part}"]["mean_slowdown_pct"] < r[f"{other}.{part}"]["mean_slowdown_pct"]
                    )
        pairs = [("guided", "guided_withheld"), ("guided", "guided_novel_expected")]
        pairs += [("guided_explore", "guided_learning")] if setup.learning else []
        for a, b in pairs:
            for part in ("seen", "unseen"):
                split[f"{a}_beats_{b}_{part}_in_seeds"] = sum(
                    1 for r in per_seed if r[f"{a}.{part}"]["mean_slowdown_pct"] < r[f"{b}.{part}"]["mean_slowdown_pct"]
                )
    return {
        "placement": {
            **{p: {k: round(v, 2) for k, v in r.items()} for p, r in overall.items()},
            **split,
            "guided_reduction_vs_random_pct": round(
                reduction_pct(overall["guided"]["mean_slowdown_pct"], overall["random"]["mean_slowdown_pct"]), 1
            ),
            "guided_reduction_vs_least_loaded_pct": round(
                reduction_pct(overall["guided"]["mean_slowdown_pct"], overall["least_loaded"]["mean_slowdown_pct"]), 1
            ),
            "guided_best_in_seeds": wins,
            "gpus": setup.gpus,
            "jobs_per_seed": setup.jobs,
            "training_observations_seed": setup.train_seed,
        },
        "seeds": len(seeds),
    }

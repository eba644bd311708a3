"""Interference per GPU as Prometheus series, fed from what stage 2 publishes (docs/OPERATIONS.md lists them).

:class:`InterferenceMetrics` keeps the latest state of every (GPU, job) stage 2 heard of
and renders it at scrape time.  Labels are bounded: environment, GPU UUID, job type
(and the served model, mode and regime where a prediction has them); never a job id,
so two jobs of one type on one GPU share a series (the larger value is shown).

Per pod (``aip produce nvml --kubernetes``): the SM utilisation of each pod's processes on each GPU, from the
samples stage 1 reads (:meth:`InterferenceMetrics.observe_samples`); a GPU's pods are those of its latest
sample, and a GPU without a sample for ``horizon_s`` of wall time loses its series.

A job's series go away when a newer window of its GPU no longer lists it, and a GPU's
when its last window is more than ``horizon_s`` of event time behind the newest window
of its environment (it went idle, solo, or away) or was received more than
``stale_after_s`` of wall time ago (its observations stopped reaching this worker).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from events import Alert, MetricSample, Observation, Prediction
from streams.hysteresis import alert_value

ENV_GPU = ["environment", "gpu_uuid"]
HORIZON_WINDOWS = 6
"""A GPU whose last window is this many windows of event time behind its environment's newest is gone."""


@dataclass
class JobState:
    """The latest of one job on one GPU."""

    environment: str
    job_type: str
    co_job_types: tuple[str, ...]
    window_start: float
    value_pct: float | None = None  # the rate the alert hysteresis judged: measured, else the observed prediction
    source: str = ""
    measured_pct: float | None = None
    predicted: dict[str, tuple[float, str, str]] = field(default_factory=dict)  # mode -> (pct, model, regime)
    raised: bool = False


@dataclass
class GpuState:
    environment: str
    window_start: float
    window_end: float
    received_s: float
    what_if: dict[str, float] = field(default_factory=dict)  # job type -> newcomer + existing slowdown, %


def max_by(rows: Iterable[tuple[tuple[str, ...], float]]) -> dict[tuple[str, ...], float]:
    """The largest value per label tuple.

    >>> max_by([(("a",), 1.0), (("a",), 3.0), (("b",), 2.0)])
    {('a',): 3.0, ('b',): 2.0}
    """
    out: dict[tuple[str, ...], float] = {}
    for labels, value in rows:
        if labels not in out or value > out[labels]:
            out[labels] = value
    return out


def gauge(name: str, documentation: str, labels: list[str], values: Mapping[tuple[str, ...], float]) -> GaugeMetricFamily:
    """A gauge with one sample per label tuple of ``values``, in the tuples' order.

    >>> [(s.labels, s.value) for s in gauge("g", "doc", ["a"], {("y",): 2, ("x",): 1.5}).samples]
    [({'a': 'x'}, 1.5), ({'a': 'y'}, 2.0)]
    """
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for label_values, v in sorted(values.items()):
        family.add_metric(list(label_values), float(v))
    return family


class InterferenceMetrics:
    """A prometheus_client collector of per-GPU interference (register it in a worker's registry)."""

    def __init__(
        self,
        threshold_pct: float,
        clear_pct: float,
        *,
        horizon_s: float = 60.0,
        stale_after_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold_pct = threshold_pct
        self.clear_pct = clear_pct
        self.horizon_s = horizon_s
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.jobs: dict[tuple[str, str], JobState] = {}  # (gpu, job id) -> latest
        self.job_ids: dict[str, set[str]] = {}  # gpu -> its job ids in ``jobs`` (a GPU's jobs without a scan of all)
        self.gpus: dict[str, GpuState] = {}
        self.newest_end: dict[str, float] = {}  # environment -> newest window end seen
        self.predictions: Counter[tuple[str, str, str]] = Counter()  # (environment, mode, regime)
        self.error_sum: dict[tuple[str, str, str], float] = {}  # |predicted - measured|, points
        self.error_count: Counter[tuple[str, str, str]] = Counter()
        self.pod_sm: dict[str, tuple[float, dict[tuple[str, str, str], float]]] = {}
        """GPU -> (received, (namespace, pod, container) -> SM %) of its latest sample with pods."""

    # ------------------------------------------------------------------ input
    def observe(self, obs: Observation, predictions: Iterable[Prediction], alerts: Iterable[Alert]) -> None:
        """Stage 2's outputs for one observation (``predictions`` and ``alerts`` as published)."""
        predictions = list(predictions)
        env, gpu = obs.environment, obs.gpu_uuid
        for p in predictions:
            served: tuple[str, str, str] = (env, p.mode, p.regime or "")
            self.predictions[served] += 1
            if p.measured_pct is not None:
                self.error_sum[served] = self.error_sum.get(served, 0.0) + abs(p.interference_pct - p.measured_pct)
                self.error_count[served] += 1
        g = self.gpus.get(gpu)
        if g is None or obs.window_start > g.window_start or g.environment != env:
            current = {obs.job_id, *obs.co_job_ids}
            ids = self.job_ids.get(gpu, set())
            for gone in [j for j in ids if j not in current]:
                del self.jobs[(gpu, gone)]
                ids.discard(gone)
            g = self.gpus[gpu] = GpuState(env, obs.window_start, obs.window_end, self.clock())
        else:
            g.received_s = self.clock()
        self.newest_end[env] = max(self.newest_end.get(env, obs.window_end), obs.window_end)
        job = self.jobs.get((gpu, obs.job_id))
        if job is None:
            job = self.jobs[(gpu, obs.job_id)] = JobState(env, obs.job_type, tuple(sorted(obs.co_job_types)), obs.window_start)
            self.job_ids.setdefault(gpu, set()).add(obs.job_id)
        for a in alerts:  # the hysteresis state, exactly as on the alerts topic
            job.raised = a.state == "raised"
        if obs.window_start < job.window_start:
            return  # an older window than the one shown: the alert state above was all it changes
        job.window_start = obs.window_start
        job.co_job_types = tuple(sorted(obs.co_job_types))
        value, source = alert_value(obs, predictions)
        if value is not None:
            job.value_pct, job.source = value, source
        job.measured_pct = obs.interference_pct
        for p in predictions:
            job.predicted[p.mode] = (p.interference_pct, p.model, p.regime or "")
            if p.mode == "placement" and obs.window_start >= g.window_start:
                g.what_if = {w.job_type: w.newcomer_pct + w.existing_pct for w in p.what_if}

    def observe_samples(self, samples: Iterable[MetricSample]) -> None:
        """Per-pod SM utilisation of each GPU's latest sample (its processes that name a pod)."""
        now = self.clock()
        for s in samples:
            if s.processes is None:
                continue  # the process list could not be read: keep the last one
            by_pod: dict[tuple[str, str, str], float] = {}
            for p in s.processes:
                if p.pod is not None and p.sm_util_pct is not None:
                    key = (p.namespace or "", p.pod, p.container or "")
                    by_pod[key] = min(100.0, by_pod.get(key, 0.0) + p.sm_util_pct)
            if by_pod:
                self.pod_sm[s.gpu_uuid] = (now, by_pod)
            else:
                self.pod_sm.pop(s.gpu_uuid, None)

    def prune(self) -> None:
        """Forget GPUs gone quiet (event time behind their environment, or nothing received for a while)."""
        now = self.clock()
        gone = {
            gpu
            for gpu, g in self.gpus.items()
            if g.window_end < self.newest_end.get(g.environment, g.window_end) - self.horizon_s
            or now - g.received_s > self.stale_after_s
        }
        for gpu in gone:
            del self.gpus[gpu]
            for job_id in self.job_ids.pop(gpu, ()):
                del self.jobs[(gpu, job_id)]
        for gpu in [g for g, (received, _) in self.pod_sm.items() if now - received > self.horizon_s]:
            del self.pod_sm[gpu]

    def raised_gpus(self) -> set[str]:
        """GPUs with at least one job in raised state (what the interference alert rule fires on)."""
        self.prune()
        return {gpu for (gpu, _), j in self.jobs.items() if j.raised}

    # ----------------------------------------------------------------- output
    def collect(self) -> Iterator[Any]:
        self.prune()
        labels: tuple[str, ...]
        threshold = GaugeMetricFamily("aip_alert_threshold_percent", "interference at which an alert is raised, %")
        threshold.add_metric([], self.threshold_pct)
        yield threshold
        clear = GaugeMetricFamily("aip_alert_clear_percent", "interference below which a raised alert clears, %")
        clear.add_metric([], self.clear_pct)
        yield clear

        value = GaugeMetricFamily(
            "aip_gpu_interference_percent",
            "latest slowdown of the GPU's jobs of this type, as the alerts topic judges it (measured, else the observed"
            " prediction), %",
            labels=[*ENV_GPU, "job_type", "source"],
        )
        best: dict[tuple[str, ...], tuple[float, str]] = {}
        for (gpu, _), j in self.jobs.items():
            labels = (j.environment, gpu, j.job_type)
            if j.value_pct is not None and (labels not in best or j.value_pct > best[labels][0]):
                best[labels] = (j.value_pct, j.source)
        for labels, (v, source) in sorted(best.items()):
            value.add_metric([*labels, source], v)
        yield value

        yield gauge(
            "aip_gpu_interference_measured_percent",
            "latest measured slowdown of the GPU's jobs of this type (from their progress reports), %",
            [*ENV_GPU, "job_type"],
            max_by(
                ((j.environment, gpu, j.job_type), j.measured_pct)
                for (gpu, _), j in self.jobs.items()
                if j.measured_pct is not None
            ),
        )

        yield gauge(
            "aip_gpu_interference_predicted_percent",
            "latest predicted slowdown of the GPU's jobs of this type, by mode, with the served model and regime, %",
            [*ENV_GPU, "job_type", "mode", "model", "regime"],
            max_by(
                ((j.environment, gpu, j.job_type, mode, model, regime), pct)
                for (gpu, _), j in self.jobs.items()
                for mode, (pct, model, regime) in j.predicted.items()
            ),
        )

        counts: Counter[tuple[str, ...]] = Counter()
        for (gpu, _), j in self.jobs.items():
            counts[(j.environment, gpu)] += int(j.raised)
        yield gauge(
            "aip_gpu_interference_alerts_raised",
            "jobs on the GPU whose interference alert is raised (the alerts topic's hysteresis state)",
            ENV_GPU,
            counts,
        )

        jobs_of: Counter[tuple[str, ...]] = Counter((j.environment, gpu) for (gpu, _), j in self.jobs.items())
        yield gauge("aip_gpu_colocated_jobs", "co-located jobs stage 2 last saw on the GPU", ENV_GPU, jobs_of)

        yield gauge(
            "aip_job_set_interference_percent",
            "largest latest slowdown of a job type next to these co-runner types (joined by +) on any GPU now, %",
            ["environment", "job_type", "co_job_types"],
            max_by(
                ((j.environment, j.job_type, "+".join(j.co_job_types)), j.value_pct)
                for j in self.jobs.values()
                if j.value_pct is not None
            ),
        )

        what_if = GaugeMetricFamily(
            "aip_gpu_whatif_cost_percent",
            "predicted cost of adding one job of this type to the GPU: its own slowdown plus the summed slowdown of the"
            " jobs there, %",
            labels=[*ENV_GPU, "job_type"],
        )
        for gpu, g in sorted(self.gpus.items()):
            for jt, cost in sorted(g.what_if.items()):
                what_if.add_metric([g.environment, gpu, jt], cost)
        yield what_if

        yield gauge(
            "aip_pod_sm_util_pct",
            "SM utilisation of the pod's processes on the GPU in its latest sample (nvmlDeviceGetProcessUtilization), %",
            ["gpu_uuid", "namespace", "pod", "container"],
            {(gpu, *pod): pct for gpu, (_, pods) in self.pod_sm.items() for pod, pct in pods.items()},
        )

        count = CounterMetricFamily(
            "aip_predictions", "predictions published, by environment, mode and regime", labels=["environment", "mode", "regime"]
        )
        for labels, n in sorted(self.predictions.items()):
            count.add_metric(list(labels), float(n))
        yield count

        error = SummaryMetricFamily(
            "aip_served_error_points",
            "absolute error of each published prediction whose job's slowdown was measured, points of interference rate",
            labels=["environment", "mode", "regime"],
        )
        for labels, n in sorted(self.error_count.items()):
            error.add_metric(list(labels), count_value=n, sum_value=self.error_sum[labels])
        yield error

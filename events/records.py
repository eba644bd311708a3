"""One record class per topic (see DESIGN.md, "Topics and records").

Units are in the field names.  Optional fields are ``None`` when unknown or
unsupported by the hardware: never 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from events.schema import SCHEMA_VERSION, TS_MAX_S, TS_MIN_S, RecordError, spec

PARAMETERS = ("E", "T", "S", "V", "R", "W")
"""The six GPU parameters of the paper: power, temperature, SM utilisation,
memory utilisation, read (PCIe RX) and write (PCIe TX) bandwidth."""

PARAMETER_FIELDS = {
    "E": "power_w",
    "T": "temp_c",
    "S": "sm_util_pct",
    "V": "mem_util_pct",
    "R": "pcie_rx_kbps",
    "W": "pcie_tx_kbps",
}
"""Which MetricSample field measures each parameter."""

CATEGORIES = {"1": ("E", "T"), "2": ("S", "V"), "3": ("R", "W"), "all": PARAMETERS}
JOB_KINDS = ("started", "progress", "finished")
ALERT_STATES = ("raised", "cleared")
ALERT_SOURCES = ("measured", "predicted")
MODES = ("observed", "placement")
REGIMES = ("seen", "new")
MODEL_KINDS = ("online", "batch", "baseline")
RW_SOURCES = ("dram_bw_util_pct", "pcie_kbps")
"""Where an observation's R and W came from: GPM DRAM bandwidth utilisation (%, one counter for both
directions) where the samples carry it, else the PCIe RX/TX counters (KB/s)."""


def _ts(optional: bool = False) -> Any:
    return spec("float", lo=TS_MIN_S, hi=TS_MAX_S, optional=optional)


def _pct(optional: bool = True) -> Any:
    return spec("float", lo=0.0, hi=100.0, optional=optional)


def _nonneg(optional: bool = True) -> Any:
    return spec("float", lo=0.0, optional=optional)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One compute process on a GPU.  ``sm_util_pct`` and ``mem_util_pct`` are its own SM and memory
    utilisation over the last sampling interval (``nvmlDeviceGetProcessUtilization``): null when the
    driver had no sample in the interval, or does not support the call (then named in the sample's
    ``unavailable`` as ``processes.sm_util_pct``, ``processes.mem_util_pct``)."""

    pid: int = spec("int", lo=0)
    used_mem_mb: float | None = _nonneg()
    sm_util_pct: float | None = _pct()
    mem_util_pct: float | None = _pct()


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One NVML sample of one GPU (or MIG instance).  Topic ``gpu.metrics``, key ``gpu_uuid``.

    ``seq`` counts samples per (producer, gpu_uuid) from 0 so consumers detect gaps
    and duplicates; ``producer_id`` tells producer restarts apart.  ``unavailable`` names
    the fields (``processes.<field>`` for per-process ones) the device does not support.

    GPM metrics (Hopper and later, over the interval since the previous sample):
    ``dram_bw_util_pct``, ``sm_occupancy_pct`` (active warps vs the maximum),
    ``gpm_sm_util_pct`` (busy SMs) and ``pcie_rx_bytes_per_s`` / ``pcie_tx_bytes_per_s``.
    """

    ts: float = _ts()
    host: str = spec("str")
    gpu_uuid: str = spec("str")
    gpu_index: int = spec("int", lo=0)
    gpu_model: str = spec("str")
    seq: int = spec("int", lo=0)
    power_w: float | None = _nonneg()
    temp_c: float | None = spec("float", lo=-50.0, hi=200.0, optional=True)
    sm_util_pct: float | None = _pct()
    mem_util_pct: float | None = _pct()
    mem_used_mb: float | None = _nonneg()
    mem_total_mb: float | None = _nonneg()
    pcie_rx_kbps: float | None = _nonneg()
    pcie_tx_kbps: float | None = _nonneg()
    energy_mj: float | None = _nonneg()
    dram_bw_util_pct: float | None = _pct()
    processes: list[GpuProcess] | None = spec("list_record", record=GpuProcess, optional=True)
    producer_id: str | None = spec("str", optional=True)
    parent_uuid: str | None = spec("str", optional=True)
    unavailable: list[str] | None = spec("list_str", optional=True)
    sm_occupancy_pct: float | None = _pct()
    gpm_sm_util_pct: float | None = _pct()
    pcie_rx_bytes_per_s: float | None = _nonneg()
    pcie_tx_bytes_per_s: float | None = _nonneg()
    schema_version: int = SCHEMA_VERSION

    @property
    def key(self) -> str:
        return self.gpu_uuid


@dataclass(frozen=True, slots=True)
class JobEvent:
    """A job's lifecycle on one GPU.  Topic ``jobs.lifecycle``, key ``gpu_uuid``.

    ``progress`` carries the cumulative ``steps`` and the mean ``step_time_s``
    since the previous progress event.
    """

    ts: float = _ts()
    kind: str = spec("enum", choices=JOB_KINDS)
    job_id: str = spec("str")
    job_type: str = spec("str")
    gpu_uuid: str = spec("str")
    host: str = spec("str")
    pid: int | None = spec("int", lo=0, optional=True)
    batch_size: int | None = spec("int", lo=1, optional=True)
    steps: int | None = spec("int", lo=0, optional=True)
    step_time_s: float | None = spec("float", lo=0.0, optional=True)
    exit_code: int | None = spec("int", optional=True)
    seq: int | None = spec("int", lo=0, optional=True)
    producer_id: str | None = spec("str", optional=True)
    schema_version: int = SCHEMA_VERSION

    @property
    def key(self) -> str:
        return self.gpu_uuid

    def check(self) -> None:
        if self.kind == "progress" and (self.steps is None or self.step_time_s is None):
            raise RecordError("progress: steps and step_time_s are required")


@dataclass(frozen=True, slots=True)
class Observation:
    """One job in one co-located window.  Topic ``interference.observations``, key ``environment``.

    ``*_pct`` are the percent changes of the six parameters against the job's solo
    profile; ``window_means`` the raw means of the window (keys E..W, M memory MB);
    ``solo`` the job's solo profile and ``co_solo`` those of its co-runners (same
    keys plus ``throughput`` in steps/s).  ``interference_pct`` is the measured
    slowdown, null when the job reports no progress.
    """

    window_start: float = _ts()
    window_end: float = _ts()
    gpu_uuid: str = spec("str")
    environment: str = spec("str")
    job_id: str = spec("str")
    job_type: str = spec("str")
    co_job_types: list[str] = spec("list_str")
    co_job_ids: list[str] = spec("list_str", default=[])
    E_pct: float | None = spec("float", optional=True)
    T_pct: float | None = spec("float", optional=True)
    S_pct: float | None = spec("float", optional=True)
    V_pct: float | None = spec("float", optional=True)
    R_pct: float | None = spec("float", optional=True)
    W_pct: float | None = spec("float", optional=True)
    window_means: dict[str, float | None] = spec("dict_float", default={})
    solo: dict[str, float | None] = spec("dict_float", default={})
    co_solo: list[dict[str, float | None]] = spec("list_dict_float", default=[])
    interference_pct: float | None = spec("float", lo=-100.0, optional=True)
    throughput_steps_per_s: float | None = _nonneg()
    samples: int = spec("int", lo=0, default=0)
    proc_sm_util_pct: float | None = _pct()
    """The job's own SM utilisation in the window (mean of its process's per-process samples)."""
    proc_mem_util_pct: float | None = _pct()
    """The job's own memory utilisation in the window, likewise."""
    sm_share_pct: float | None = _pct()
    """The job's share of the SM utilisation of all the window's jobs (null unless every job has its own)."""
    rw_source: str | None = spec("enum", choices=RW_SOURCES, optional=True)
    """What ``R_pct``/``W_pct`` and ``window_means`` R/W were computed from (see :data:`RW_SOURCES`)."""
    schema_version: int = SCHEMA_VERSION

    @property
    def key(self) -> str:
        return self.environment

    @property
    def observation_id(self) -> str:
        """Deterministic identity: the same window of the same job is the same observation."""
        return f"{self.gpu_uuid}|{self.window_start:.3f}|{self.job_id}"

    def pct(self, parameter: str) -> float | None:
        value: float | None = getattr(self, f"{parameter}_pct")
        return value


@dataclass(frozen=True, slots=True)
class WhatIf:
    """Predicted effect of adding one job of ``job_type`` to a GPU.

    ``newcomer_pct``: the newcomer's own slowdown; ``existing_pct``: the sum of the
    slowdowns of the jobs already there once it joins.
    """

    job_type: str = spec("str")
    newcomer_pct: float = spec("float")
    existing_pct: float = spec("float")
    interval_pct: list[float] | None = spec("interval", optional=True)
    """90 % interval ``[lo, hi]`` of ``newcomer_pct`` (absent from producers before it existed)."""


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted interference of one job.  Topic ``interference.predictions``, key ``gpu_uuid``."""

    ts: float = _ts()
    gpu_uuid: str = spec("str")
    environment: str = spec("str")
    job_id: str = spec("str")
    job_type: str = spec("str")
    job_set: list[str] = spec("list_str")
    mode: str = spec("enum", choices=MODES)
    interference_pct: float = spec("float")
    model: str = spec("str")
    category: str = spec("enum", choices=tuple(CATEGORIES))
    expected_error_pct: float | None = _nonneg()
    measured_pct: float | None = spec("float", optional=True)
    what_if: list[WhatIf] = spec("list_record", record=WhatIf, default=[])
    window_end: float | None = _ts(optional=True)
    regime: str | None = spec("enum", choices=REGIMES, optional=True)
    """``seen``: this job next to these co-runners was measured before (the model was chosen by its error on
    measured job sets); ``new``: never measured (chosen by its error on job sets left out of training)."""
    interval_pct: list[float] | None = spec("interval", optional=True)
    """90 % interval ``[lo, hi]`` of ``interference_pct``: conformal (batch models, from out-of-fold residuals) or
    rolling prequential residual quantiles (online learners, baselines); null until enough residuals.  An
    additive optional field: ``schema_version`` stays 1, since readers of version 1 ignore unknown keys and
    decode a record without it, while a new version would make every such reader reject every record."""
    schema_version: int = SCHEMA_VERSION

    @property
    def key(self) -> str:
        return self.gpu_uuid


@dataclass(frozen=True, slots=True)
class Alert:
    """Interference crossed a threshold (raised) or fell below the clear level (cleared).

    Topic ``interference.alerts``, key ``gpu_uuid``.
    """

    ts: float = _ts()
    state: str = spec("enum", choices=ALERT_STATES)
    gpu_uuid: str = spec("str")
    job_id: str = spec("str")
    interference_pct: float = spec("float")
    threshold: float = spec("float")
    source: str = spec("enum", choices=ALERT_SOURCES)
    clear_level: float | None = spec("float", optional=True)
    job_type: str | None = spec("str", optional=True)
    environment: str | None = spec("str", optional=True)
    schema_version: int = SCHEMA_VERSION

    @property
    def key(self) -> str:
        return self.gpu_uuid


@dataclass(frozen=True, slots=True)
class LeaderboardEntry:
    model: str = spec("str")
    category: str = spec("enum", choices=tuple(CATEGORIES))
    mode: str = spec("enum", choices=MODES)
    kind: str = spec("enum", choices=MODEL_KINDS)
    samples: int = spec("int", lo=0)
    """Prequential predictions scored on job sets measured before (``mae`` is their rolling MAE)."""
    mae: float | None = _nonneg()
    relative_error: float | None = _nonneg()
    """The paper's relative error of the grouped cross-validation (batch models)."""
    cv_mae: float | None = _nonneg()
    """Grouped-CV MAE of the last refit: the error expected on job sets never measured."""
    cv_samples: int | None = spec("int", lo=0, optional=True)
    new_mae: float | None = _nonneg()
    """Prequential MAE on first observations of a job set (job and co-runners never measured before)."""
    new_samples: int | None = spec("int", lo=0, optional=True)


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What a mode serves in a regime, and the error it was chosen by."""

    mode: str = spec("enum", choices=MODES)
    regime: str = spec("enum", choices=REGIMES)
    model: str = spec("str")
    category: str = spec("enum", choices=tuple(CATEGORIES))
    error_pct: float | None = _nonneg()


@dataclass(frozen=True, slots=True)
class Leaderboard:
    """Errors of every model per category and mode, and the selection.

    Topic ``models.leaderboard``, key ``environment``.  ``selected`` maps
    ``"<mode>:<category>"`` to a model name.
    """

    ts: float = _ts()
    environment: str = spec("str")
    entries: list[LeaderboardEntry] = spec("list_record", record=LeaderboardEntry)
    selected: dict[str, str] = spec("dict_str", default={})
    observations: int = spec("int", lo=0, default=0)
    last_refit: float | None = _ts(optional=True)
    selection_seconds: float | None = _nonneg()
    served: list[ServedModel] = spec("list_record", record=ServedModel, default=[])
    schema_version: int = SCHEMA_VERSION

    @property
    def key(self) -> str:
        return self.environment


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record some stage could not use, with the reason.  Topic ``aip.deadletter``."""

    ts: float = _ts()
    source_topic: str = spec("str")
    partition: int = spec("int", lo=-1)
    offset: int = spec("int", lo=-1)
    payload_b64: str = spec("str", max_len=4_000_000)
    error: str = spec("str", max_len=2000)
    key: str | None = spec("str", optional=True, max_len=4096)
    stage: str | None = spec("str", optional=True)
    schema_version: int = SCHEMA_VERSION


@dataclass(frozen=True, slots=True)
class ProfileSource:
    """One input partition's share of a solo profile: its running means and counts.

    ``source`` names the stage-1 input partition whose GPUs ran the solo windows
    (its owner is the only writer of this entry); ``means`` and ``counts`` are keyed
    by parameter (E, T, S, V, R, W, M, throughput), each with its own count.
    """

    source: str = spec("str")
    windows: int = spec("int", lo=0)
    means: dict[str, float | None] = spec("dict_float")
    counts: dict[str, float | None] = spec("dict_float")
    updated_ts: float = _ts()


@dataclass(frozen=True, slots=True)
class SoloProfile:
    """The solo profile of one job type in one environment.  Topic ``interference.profiles`` (compacted),
    key ``"<environment>|<job_type>"``.

    ``E``..``W`` are the means of the six parameters over every solo window, ``M`` the
    memory used (MB), ``throughput_steps_per_s`` the solo throughput (null while no solo
    window had progress reports), ``windows`` the number of solo windows.  ``sources``
    holds each input partition's share; the means are their count-weighted mean.
    """

    environment: str = spec("str")
    job_type: str = spec("str")
    updated_ts: float = _ts()
    E: float | None = spec("float", optional=True)
    T: float | None = spec("float", optional=True)
    S: float | None = spec("float", optional=True)
    V: float | None = spec("float", optional=True)
    R: float | None = spec("float", optional=True)
    W: float | None = spec("float", optional=True)
    M: float | None = spec("float", optional=True)
    throughput_steps_per_s: float | None = _nonneg()
    windows: int = spec("int", lo=0, default=0)
    sources: list[ProfileSource] = spec("list_record", record=ProfileSource, default=[])
    schema_version: int = SCHEMA_VERSION

    @property
    def key(self) -> str:
        return profile_key(self.environment, self.job_type)


def profile_key(environment: str, job_type: str) -> str:
    """The key of a solo profile on ``interference.profiles``.

    >>> profile_key("NVIDIA H200", "resnet50-64")
    'NVIDIA H200|resnet50-64'
    """
    return f"{environment}|{job_type}"

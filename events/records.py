"""One record class per topic (``events.topics.RECORD_OF``; docs/INTEGRATION.md describes them for other readers).

Each record is a frozen msgspec Struct whose annotations carry its constraints
(``msgspec.Meta`` bounds and lengths, ``Literal`` choices): decoding, encoding,
validation and the JSON Schemas (:mod:`events.jsonschema`) all come from them.
Rules between fields are small functions beside the records, run by
``__post_init__`` (so on decoding and on construction alike).

Units are in the field names.  Optional fields are ``None`` when unknown or
unsupported by the hardware: never 0.
"""

from __future__ import annotations

import sys
from typing import Annotated, ClassVar, Final, Literal, get_args

import msgspec
from msgspec import Meta

SCHEMA_VERSION: Final = 1
"""The version every record carries.  A reader rejects any other; a record without the field is read as this one."""

# Timestamps are epoch seconds; anything outside this range is a unit or clock error.
TS_MIN_S = 946_684_800.0  # 2000-01-01
TS_MAX_S = 4_102_444_800.0  # 2100-01-01
MAX_STR_LEN = 256
MAX_LIST_LEN = 1024
FLOAT_MAX = sys.float_info.max
"""Bounds on every float: msgspec accepts NaN and infinities unless a field is bounded."""
INT_MAX = 2**63 - 1
"""Integers are 64-bit signed, as most JSON readers outside Python expect."""


class RecordError(ValueError):
    """Raised for any record that cannot be decoded or does not validate (one line naming the field)."""


Finite = Annotated[float, Meta(ge=-FLOAT_MAX, le=FLOAT_MAX)]
Ts = Annotated[float, Meta(ge=TS_MIN_S, le=TS_MAX_S)]
Pct = Annotated[float, Meta(ge=0.0, le=100.0)]
NonNeg = Annotated[float, Meta(ge=0.0, le=FLOAT_MAX)]
Int = Annotated[int, Meta(ge=-INT_MAX - 1, le=INT_MAX)]
Count = Annotated[int, Meta(ge=0, le=INT_MAX)]
Str = Annotated[str, Meta(max_length=MAX_STR_LEN)]
Strs = Annotated[list[Str], Meta(max_length=MAX_LIST_LEN)]
Floats = Annotated[dict[Annotated[str, Meta(max_length=64)], Finite | None], Meta(max_length=MAX_LIST_LEN)]
"""Values per parameter name (E, T, S, V, R, W, M, throughput): null where unknown."""
StrMap = Annotated[dict[Str, Str], Meta(max_length=MAX_LIST_LEN)]
Interval = Annotated[list[Finite], Meta(min_length=2, max_length=2)]
"""``[lo, hi]``."""
OpenInterval = Annotated[list[Finite | None], Meta(min_length=2, max_length=2)]
"""``[lo, hi]``, ``hi`` null where nothing bounds it (``lo`` never null): a what-if entry's interval."""
Version = Literal[1]  # SCHEMA_VERSION

JobKind = Literal["started", "progress", "finished"]
AlertState = Literal["raised", "cleared"]
AlertSource = Literal["measured", "predicted"]
Mode = Literal["observed", "placement"]
Regime = Literal["seen", "new", "novel"]
"""``seen``: the job set was measured before; ``new``: never, but each of its job types was; ``novel``: one of its
job types was never measured in the environment (predicted from its solo profile)."""
ModelKind = Literal["online", "batch", "baseline"]
RwSource = Literal["dram_bw_util_pct", "pcie_kbps"]
"""Where an observation's R and W came from: GPM DRAM bandwidth utilisation (%, one counter for both
directions) where the samples carry it, else the PCIe RX/TX counters (KB/s)."""
Category = Literal["1", "2", "3", "all"]
Occupancy = Literal["colocated", "solo", "idle"]
"""What ran on the GPU in a window: two or more jobs, one job, none (see :class:`Observation`, :class:`Prediction`)."""

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

CATEGORIES: dict[str, tuple[str, ...]] = {"1": ("E", "T"), "2": ("S", "V"), "3": ("R", "W"), "all": PARAMETERS}
"""The parameters of each :data:`Category`."""
JOB_KINDS: tuple[str, ...] = get_args(JobKind)
ALERT_STATES: tuple[str, ...] = get_args(AlertState)
ALERT_SOURCES: tuple[str, ...] = get_args(AlertSource)
MODES: tuple[str, ...] = get_args(Mode)
REGIMES: tuple[str, ...] = tuple(r for r in get_args(Regime) if r != "novel")
"""The regimes a candidate is judged and selected in; a ``novel`` prediction is served by ``new``'s choice."""
MODEL_KINDS: tuple[str, ...] = get_args(ModelKind)
RW_SOURCES: tuple[str, ...] = get_args(RwSource)
OCCUPANCIES: tuple[str, ...] = get_args(Occupancy)


class Record(msgspec.Struct, frozen=True, gc=False):
    """Base of every record: immutable, and not tracked by the garbage collector (records hold no cycles)."""


class GpuProcess(Record, frozen=True):
    """One compute process on a GPU.  ``sm_util_pct`` and ``mem_util_pct`` are its own SM and memory
    utilisation over the last sampling interval (``nvmlDeviceGetProcessUtilization``): null when the
    driver had no sample in the interval, or does not support the call (then named in the sample's
    ``unavailable`` as ``processes.sm_util_pct``, ``processes.mem_util_pct``).

    On Kubernetes (``aip produce nvml --kubernetes``) ``namespace``, ``pod`` and ``container`` name the
    process's pod and container; null when unknown or outside a pod."""

    pid: Count
    used_mem_mb: NonNeg | None = None
    sm_util_pct: Pct | None = None
    mem_util_pct: Pct | None = None
    namespace: Str | None = None
    pod: Str | None = None
    container: Str | None = None


class MetricSample(Record, frozen=True):
    """One NVML sample of one GPU (or MIG instance).  Topic ``gpu.metrics``, key ``host``.

    Producers send a host's samples of one tick together, as one :class:`HostMetrics`; a
    MetricSample alone on the topic (older producers, ``aip produce --per-gpu``) is read the same.

    ``seq`` counts samples per (producer, gpu_uuid) from 0 so consumers detect gaps
    and duplicates; ``producer_id`` tells producer restarts apart.  ``unavailable`` names
    the fields (``processes.<field>`` for per-process ones) the device does not support.

    GPM metrics (Hopper and later, over the interval since the previous sample):
    ``dram_bw_util_pct``, ``sm_occupancy_pct`` (active warps vs the maximum),
    ``gpm_sm_util_pct`` (busy SMs) and ``pcie_rx_bytes_per_s`` / ``pcie_tx_bytes_per_s``.
    """

    ts: Ts
    host: Str
    gpu_uuid: Str
    gpu_index: Count
    gpu_model: Str
    seq: Count
    power_w: NonNeg | None = None
    temp_c: Annotated[float, Meta(ge=-50.0, le=200.0)] | None = None
    sm_util_pct: Pct | None = None
    mem_util_pct: Pct | None = None
    mem_used_mb: NonNeg | None = None
    mem_total_mb: NonNeg | None = None
    pcie_rx_kbps: NonNeg | None = None
    pcie_tx_kbps: NonNeg | None = None
    energy_mj: NonNeg | None = None
    dram_bw_util_pct: Pct | None = None
    processes: Annotated[list[GpuProcess], Meta(max_length=MAX_LIST_LEN)] | None = None
    producer_id: Str | None = None
    parent_uuid: Str | None = None
    unavailable: Strs | None = None
    sm_occupancy_pct: Pct | None = None
    gpm_sm_util_pct: Pct | None = None
    pcie_rx_bytes_per_s: NonNeg | None = None
    pcie_tx_bytes_per_s: NonNeg | None = None
    schema_version: Version = SCHEMA_VERSION

    @property
    def key(self) -> str:
        """The host, as :class:`JobEvent`'s: a GPU's samples and job events share a partition."""
        return self.host


MAX_GPUS_PER_HOST = MAX_LIST_LEN
"""Samples in one :class:`HostMetrics` (GPUs and MIG instances of one host)."""


class HostBatch(Record, frozen=True):
    """Base of the batches of one host and tick (:class:`HostMetrics`, :class:`HostJobEvents`): ``ts`` and ``host``
    first, then the list named by ``list_field``, every record of which is of the batch's host (the key its partition
    was chosen by)."""

    list_field: ClassVar[str]
    ts: Ts
    host: Str

    def __post_init__(self) -> None:
        for i, record in enumerate(getattr(self, self.list_field)):
            if record.host != self.host:
                raise RecordError(
                    f"{self.list_field}[{i}]: host {record.host!r} is not the batch's host {self.host!r} - at `$.host`"
                )

    @property
    def key(self) -> str:
        return self.host


class HostMetrics(HostBatch, frozen=True):
    """The samples of all GPUs of one host at one sampling tick.  Topic ``gpu.metrics``, key ``host``.

    One record instead of one per GPU: a consumer pays its per-message cost once per host and
    tick.  ``ts`` is the tick (its latest sample's ``ts``); each sample keeps its own ``ts``, ``seq``
    and ``producer_id``.  It shares ``gpu.metrics`` with per-GPU :class:`MetricSample` records: a
    record with ``samples`` is a batch.  A reader that finds one invalid sample in a batch keeps
    the others (stage 1 dead-letters that sample's payload alone, with the reason).
    """

    list_field = "samples"
    samples: Annotated[list[MetricSample], Meta(min_length=1, max_length=MAX_GPUS_PER_HOST)]
    producer_id: Str | None = None
    schema_version: Version = SCHEMA_VERSION


def progress_has_steps(event: JobEvent) -> None:
    """A ``progress`` event carries ``steps`` and ``step_time_s``."""
    if event.kind == "progress" and (event.steps is None or event.step_time_s is None):
        raise RecordError("progress: steps and step_time_s are required")


def interval_ordered(interval: list[float] | list[float | None] | None) -> None:
    """An ``interval_pct`` is ``[lo, hi]`` with ``lo <= hi``; ``hi`` may be null (unbounded), ``lo`` may not."""
    if interval is None:
        return
    lo, hi = interval
    if lo is None:
        raise RecordError(f"`interval_pct` [lo, hi] = {interval} has no lower end")
    if hi is not None and lo > hi:
        raise RecordError(f"`interval_pct` [lo, hi] = {interval} has lo > hi")


class JobEvent(Record, frozen=True):
    """A job's lifecycle on one GPU.  Topic ``jobs.lifecycle``, key ``host`` (as the GPU's samples).

    ``progress`` carries the cumulative ``steps`` and the mean ``step_time_s``
    since the previous progress event.
    """

    ts: Ts
    kind: JobKind
    job_id: Str
    job_type: Str
    gpu_uuid: Str
    host: Str
    pid: Count | None = None
    batch_size: Annotated[int, Meta(ge=1, le=INT_MAX)] | None = None
    steps: Count | None = None
    step_time_s: NonNeg | None = None
    exit_code: Int | None = None
    seq: Count | None = None
    producer_id: Str | None = None
    schema_version: Version = SCHEMA_VERSION

    def __post_init__(self) -> None:
        progress_has_steps(self)

    @property
    def key(self) -> str:
        return self.host


MAX_EVENTS_PER_HOST_BATCH = MAX_LIST_LEN
"""Job events in one :class:`HostJobEvents`."""


class HostJobEvents(HostBatch, frozen=True):
    """Job events of one host sent together (one sampling tick's).  Topic ``jobs.lifecycle``, key ``host``.

    As :class:`HostMetrics` for samples: one record instead of one per event, so a consumer pays its
    per-message cost once per host and tick.  ``ts`` is the latest event's; each event keeps its own
    ``ts``, ``seq`` and ``producer_id``, and the events are in the order they happened.  It shares
    ``jobs.lifecycle`` with single :class:`JobEvent` records: a record with ``events`` is a batch.  A
    reader that finds one invalid event in a batch keeps the others.
    """

    list_field = "events"
    events: Annotated[list[JobEvent], Meta(min_length=1, max_length=MAX_EVENTS_PER_HOST_BATCH)]
    producer_id: Str | None = None
    schema_version: Version = SCHEMA_VERSION


class Observation(Record, frozen=True):
    """One job in one co-located window (or, with ``occupancy`` ``solo``, a job alone in its window).
    Topic ``interference.observations``, key ``environment``.

    ``*_pct`` are the percent changes of the six parameters against the job's solo
    profile; ``window_means`` the raw means of the window (keys E..W, M memory MB);
    ``solo`` the job's solo profile and ``co_solo`` those of its co-runners (same
    keys plus ``throughput`` in steps/s).  ``interference_pct`` is the measured
    slowdown, null when the job reports no progress.
    """

    window_start: Ts
    window_end: Ts
    gpu_uuid: Str
    environment: Str
    job_id: Str
    job_type: Str
    co_job_types: Strs
    co_job_ids: Strs = []
    E_pct: Finite | None = None
    T_pct: Finite | None = None
    S_pct: Finite | None = None
    V_pct: Finite | None = None
    R_pct: Finite | None = None
    W_pct: Finite | None = None
    window_means: Floats = {}
    solo: Floats = {}
    co_solo: Annotated[list[Floats], Meta(max_length=MAX_LIST_LEN)] = []
    interference_pct: Annotated[float, Meta(ge=-100.0, le=FLOAT_MAX)] | None = None
    throughput_steps_per_s: NonNeg | None = None
    samples: Count = 0
    proc_sm_util_pct: Pct | None = None
    """The job's own SM utilisation in the window (mean of its process's per-process samples)."""
    proc_mem_util_pct: Pct | None = None
    """The job's own memory utilisation in the window, likewise."""
    sm_share_pct: Pct | None = None
    """The job's share of the SM utilisation of all the window's jobs (null unless every job has its own)."""
    rw_source: RwSource | None = None
    """What ``R_pct``/``W_pct`` and ``window_means`` R/W were computed from (see :data:`RW_SOURCES`)."""
    occupancy: Occupancy | None = None
    """``solo``: the job ran alone in the window (``co_job_types`` empty, ``interference_pct`` null: not a
    measurement of interference, never a training row; stage 2 answers the scheduler's question for the GPU
    from it); null or ``colocated``: a co-located window (every record before the field existed).  Additive
    and optional: ``schema_version`` stays 1 (see :attr:`Prediction.interval_pct`)."""
    schema_version: Version = SCHEMA_VERSION

    @property
    def key(self) -> str:
        return self.environment

    @property
    def colocated(self) -> bool:
        """A co-located window: a measurement of interference (a solo window is not)."""
        return self.occupancy is None or self.occupancy == "colocated"

    @property
    def observation_id(self) -> str:
        """Deterministic identity: the same window of the same job is the same observation."""
        return f"{self.gpu_uuid}|{self.window_start:.3f}|{self.job_id}"

    def pct(self, parameter: str) -> float | None:
        value: float | None = getattr(self, f"{parameter}_pct")
        return value


MAX_OBSERVATIONS_PER_BATCH = MAX_LIST_LEN
"""Observations in one :class:`ObservationBatch`."""


def all_of_environment(environment: str, observations: list[Observation]) -> None:
    """Every observation of a batch is of its environment (the key its partition was chosen by)."""
    for i, obs in enumerate(observations):
        if obs.environment != environment:
            raise RecordError(
                f"observations[{i}]: environment {obs.environment!r} is not the batch's {environment!r} - at `$.environment`"
            )


class ObservationBatch(Record, frozen=True):
    """Observations of one environment that a stage-1 worker made from one batch of its input, sent together.
    Topic ``interference.observations``, key ``environment``.

    As :class:`HostMetrics` for samples: one record instead of one per observation, so the worker that makes them
    pays the producer's per-message cost once per environment and input batch, and stage 2 its consumer's.  The
    observations are in the order they were made.  It shares the topic with single :class:`Observation` records (a
    record with ``observations`` is a batch); every reader of the topic reads both.  A reader that finds one invalid
    observation in a batch keeps the others (stage 2 dead-letters that observation's payload alone, with the
    reason).
    """

    environment: Str
    observations: Annotated[list[Observation], Meta(min_length=1, max_length=MAX_OBSERVATIONS_PER_BATCH)]
    schema_version: Version = SCHEMA_VERSION

    def __post_init__(self) -> None:
        all_of_environment(self.environment, self.observations)

    @property
    def key(self) -> str:
        return self.environment


class WhatIf(Record, frozen=True):
    """Predicted effect of adding one job of ``job_type`` to a GPU.

    ``newcomer_pct``: the newcomer's own slowdown; ``existing_pct``: the sum of the
    slowdowns of the jobs already there once it joins.
    """

    job_type: Str
    newcomer_pct: Finite
    existing_pct: Finite
    interval_pct: OpenInterval | None = None
    """90 % interval ``[lo, hi]`` of ``newcomer_pct`` (absent from producers before it existed); ``hi`` null
    (unbounded) for a ``novel`` entry where nothing the environment measured bounds the newcomer's slowdown."""
    regime: Regime | None = None
    """The regime of the ``newcomer_pct`` prediction (as :attr:`Prediction.regime`): whether the newcomer next
    to these jobs was measured before.  Null from producers before it existed, and on an idle GPU."""

    def __post_init__(self) -> None:
        interval_ordered(self.interval_pct)


class Prediction(Record, frozen=True):
    """Predicted interference of one job.  Topic ``interference.predictions``, key ``gpu_uuid``."""

    ts: Ts
    gpu_uuid: Str
    environment: Str
    job_id: Str
    job_type: Str
    job_set: Strs
    mode: Mode
    interference_pct: Finite
    model: Str
    category: Category
    expected_error_pct: NonNeg | None = None
    measured_pct: Finite | None = None
    what_if: Annotated[list[WhatIf], Meta(max_length=MAX_LIST_LEN)] = []
    window_end: Ts | None = None
    regime: Regime | None = None
    """``seen``: this job next to these co-runners was measured before (the model was chosen by its error on
    measured job sets); ``new``: never measured (chosen by its error on job sets left out of training)."""
    interval_pct: Interval | None = None
    """90 % interval ``[lo, hi]`` of ``interference_pct``: conformal (batch models, from out-of-fold residuals) or
    rolling prequential residual quantiles (online learners, baselines); null until enough residuals.  An
    additive optional field: ``schema_version`` stays 1, since readers of version 1 ignore unknown keys and
    decode a record without it, while a new version would make every such reader reject every record."""
    occupancy: Occupancy | None = None
    """What ran on the GPU in the window: null or ``colocated`` (every record before the field existed), the
    prediction of a co-located job; ``solo``: the GPU runs this one job (``job_set`` is its type,
    ``interference_pct`` 0, ``model`` ``"solo"``), published every window for its what-if entries; ``idle``: the
    GPU runs nothing (``job_id`` and ``job_type`` empty, ``job_set`` empty, ``model`` ``"idle"``, every what-if
    entry 0 with interval ``[0, 0]``: a newcomer there runs alone).  Additive and optional, as ``interval_pct``."""
    full: bool | None = None
    """The GPU runs as many jobs as it may (``max_jobs_per_gpu``): it takes no other job, and its prediction carries
    no what-if entries.  Null from producers before the field existed; additive and optional, as ``interval_pct``."""
    schema_version: Version = SCHEMA_VERSION

    def __post_init__(self) -> None:
        interval_ordered(self.interval_pct)

    @property
    def key(self) -> str:
        return self.gpu_uuid


class Alert(Record, frozen=True):
    """Interference crossed a threshold (raised) or fell below the clear level (cleared).

    Topic ``interference.alerts``, key ``gpu_uuid``.
    """

    ts: Ts
    state: AlertState
    gpu_uuid: Str
    job_id: Str
    interference_pct: Finite
    threshold: Finite
    source: AlertSource
    clear_level: Finite | None = None
    job_type: Str | None = None
    environment: Str | None = None
    schema_version: Version = SCHEMA_VERSION

    @property
    def key(self) -> str:
        return self.gpu_uuid


class LeaderboardEntry(Record, frozen=True):
    """The errors of one model in one category and mode."""

    model: Str
    category: Category
    mode: Mode
    kind: ModelKind
    samples: Count
    """Prequential predictions scored on job sets measured before (``mae`` is their rolling MAE)."""
    mae: NonNeg | None = None
    relative_error: NonNeg | None = None
    """The paper's relative error of the grouped cross-validation (batch models)."""
    cv_mae: NonNeg | None = None
    """Grouped-CV MAE of the last refit: the error expected on job sets never measured."""
    cv_samples: Count | None = None
    new_mae: NonNeg | None = None
    """Prequential MAE on first observations of a job set (job and co-runners never measured before)."""
    new_samples: Count | None = None


class ServedModel(Record, frozen=True):
    """What a mode serves in a regime, and the error it was chosen by."""

    mode: Mode
    regime: Regime
    model: Str
    category: Category
    error_pct: NonNeg | None = None


class Leaderboard(Record, frozen=True):
    """Errors of every model per category and mode, and the selection.

    Topic ``models.leaderboard``, key ``environment``.  ``selected`` maps
    ``"<mode>:<category>"`` to a model name.
    """

    ts: Ts
    environment: Str
    entries: Annotated[list[LeaderboardEntry], Meta(max_length=MAX_LIST_LEN)]
    selected: StrMap = {}
    observations: Count = 0
    last_refit: Ts | None = None
    selection_seconds: NonNeg | None = None
    served: Annotated[list[ServedModel], Meta(max_length=MAX_LIST_LEN)] = []
    schema_version: Version = SCHEMA_VERSION

    @property
    def key(self) -> str:
        return self.environment


class DeadLetter(Record, frozen=True):
    """A record some stage could not use, with the reason.  Topic ``aip.deadletter``."""

    ts: Ts
    source_topic: Str
    partition: Annotated[int, Meta(ge=-1, le=INT_MAX)]
    offset: Annotated[int, Meta(ge=-1, le=INT_MAX)]
    payload_b64: Annotated[str, Meta(max_length=4_000_000)]
    error: Annotated[str, Meta(max_length=2000)]
    key: Annotated[str, Meta(max_length=4096)] | None = None
    stage: Str | None = None
    schema_version: Version = SCHEMA_VERSION


class ProfileSource(Record, frozen=True):
    """One input partition's share of a solo profile: its running means and counts.

    ``source`` names the stage-1 input partition whose GPUs ran the solo windows
    (its owner is the only writer of this entry); ``means`` and ``counts`` are keyed
    by parameter (E, T, S, V, R, W, M, throughput), each with its own count.
    """

    source: Str
    windows: Count
    means: Floats
    counts: Floats
    updated_ts: Ts


class SoloProfile(Record, frozen=True):
    """The solo profile of one job type in one environment.  Topic ``interference.profiles`` (compacted),
    key ``"<environment>|<job_type>"``.

    ``E``..``W`` are the means of the six parameters over every solo window, ``M`` the
    memory used (MB), ``throughput_steps_per_s`` the solo throughput (null while no solo
    window had progress reports), ``windows`` the number of solo windows.  ``sources``
    holds each input partition's share; the means are their count-weighted mean.
    """

    environment: Str
    job_type: Str
    updated_ts: Ts
    E: Finite | None = None
    T: Finite | None = None
    S: Finite | None = None
    V: Finite | None = None
    R: Finite | None = None
    W: Finite | None = None
    M: Finite | None = None
    throughput_steps_per_s: NonNeg | None = None
    windows: Count = 0
    sources: Annotated[list[ProfileSource], Meta(max_length=MAX_LIST_LEN)] = []
    schema_version: Version = SCHEMA_VERSION

    @property
    def key(self) -> str:
        return profile_key(self.environment, self.job_type)


def profile_key(environment: str, job_type: str) -> str:
    """The key of a solo profile on ``interference.profiles``.

    >>> profile_key("NVIDIA H200", "resnet50-64")
    'NVIDIA H200|resnet50-64'
    """
    return f"{environment}|{job_type}"

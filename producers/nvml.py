"""The NVML sampler: one MetricSample per GPU (and per MIG instance) per interval, published as one HostMetrics.

The NVML module is an argument (``nvml=``); the default is nvidia-ml-py's
``pynvml``.  Calls (docs/ARCHITECTURE.md, "NVML mapping"): ``nvmlDeviceGetPowerUsage`` (mW),
``nvmlDeviceGetTotalEnergyConsumption`` (mJ), ``nvmlDeviceGetTemperatureV``
(falling back to ``nvmlDeviceGetTemperature``), ``nvmlDeviceGetUtilizationRates``
(.gpu, .memory), ``nvmlDeviceGetMemoryInfo`` (bytes), ``nvmlDeviceGetPcieThroughput``
(RX, TX in KB/s), ``nvmlDeviceGetComputeRunningProcesses`` with each process's own SM and
memory utilisation from ``nvmlDeviceGetProcessUtilization``, and the GPM metrics of
:mod:`producers.gpm` where ``nvmlGpmQueryDeviceSupport`` says the device has them.

Per-process utilisation: each round asks for the samples newer than the last one seen (the first
round: the last ``process_lookback_s``).  A process gets the mean of its samples; a running process without a
sample had none above zero (NVML returns only processes with non-zero utilisation), so it reads
0; when NVML has no new sample at all (``NVMLError_NotFound``) every process's utilisation is null
for that round.  Not supported (MIG instances, older GPUs) -> null, with ``processes.sm_util_pct``
and ``processes.mem_util_pct`` in ``unavailable``.

Errors, per field: ``NVMLError_NotSupported`` -> the field is null and named in
``unavailable`` (never 0); any other NVML error -> null, counted by kind in
``aip_producer_nvml_errors_total``; ``NVMLError_GpuIsLost`` also stops reading
that device for this round.  The sample is published with what could be read
and the other GPUs are sampled as usual.
"""

from __future__ import annotations

import importlib
import socket
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from events import GpuProcess, MetricSample
from events.topics import LIFECYCLE, METRICS
from producers.batching import host_job_events, host_metrics
from producers.gpm import GpmReader
from producers.metrics import ProducerMetrics

MIB = 1024.0 * 1024.0
PROCESS_UTIL_FIELDS = ("processes.sm_util_pct", "processes.mem_util_pct")


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine (no driver or library); the message names what is missing."""


@dataclass(frozen=True)
class Device:
    handle: Any
    uuid: str
    index: int
    name: str
    parent_uuid: str | None = None
    parent_handle: Any = None  # of a MIG instance: its GPU (GPM is read through it)
    gpu_instance_id: int | None = None  # of a MIG instance


def error_kind(exc: BaseException) -> str:
    """A short name for an NVML error class.

    >>> class NVMLError_GpuIsLost(Exception): ...
    >>> error_kind(NVMLError_GpuIsLost())
    'GpuIsLost'
    """
    return type(exc).__name__.removeprefix("NVMLError_") or "NVMLError"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Reader:
    """Reads fields of one device, turning NVML errors into nulls and counts."""

    def __init__(self, nvml: Any, metrics: ProducerMetrics) -> None:
        self.nvml = nvml
        self.metrics = metrics
        self.unavailable: list[str] = []
        self.lost = False

    def call(self, fields: tuple[str, ...], fn: Callable[..., Any], *args: Any) -> Any:
        if self.lost:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError_NotSupported:
            self.unavailable.extend(fields)
        except self.nvml.NVMLError as exc:
            self.count(exc)
        return None

    def count(self, exc: BaseException) -> None:
        self.count_kind(error_kind(exc))
        if isinstance(exc, self.nvml.NVMLError_GpuIsLost):
            self.lost = True

    def count_kind(self, kind: str) -> None:
        self.metrics.nvml_errors.labels(kind=kind).inc()


class NvmlSampler:
    """Sample every GPU of this host through ``nvml`` (default: the real ``pynvml``)."""

    def __init__(
        self,
        nvml: Any = None,
        *,
        host: str = "",
        producer_id: str | None = None,
        clock: Callable[[], float] = time.time,
        metrics: ProducerMetrics | None = None,
        rediscover_s: float = 60.0,
        process_lookback_s: float = 2.0,
        attribution: Any = None,
    ) -> None:
        self.nvml = nvml if nvml is not None else importlib.import_module("pynvml")
        self.host = host or socket.gethostname()
        self.producer_id = producer_id or f"nvml-{uuidlib.uuid4().hex[:12]}"
        self.clock = clock
        self.metrics = metrics or ProducerMetrics()
        self.rediscover_s = rediscover_s
        self.process_lookback_s = process_lookback_s
        self.attribution = attribution
        """Gives each round's processes their pods (``producers.kubernetes.attribution``); None: off."""
        self.devices: list[Device] = []
        self.gpm = GpmReader(self.nvml)
        self._seq: dict[str, int] = {}
        self._process_seen_us: dict[str, int] = {}  # gpu_uuid -> newest per-process sample timestamp (us)
        self._discovered_at = -1e18

    # ------------------------------------------------------------------ setup
    def open(self) -> NvmlSampler:
        nv = self.nvml
        try:
            nv.nvmlInit()
        except (nv.NVMLError_LibraryNotFound, nv.NVMLError_DriverNotLoaded) as exc:
            raise NvmlUnavailable(
                f"NVML library libnvidia-ml.so.1 not usable ({error_kind(exc)}): install the NVIDIA driver, or use `aip produce sim`"
            ) from None
        except nv.NVMLError as exc:
            raise NvmlUnavailable(f"NVML failed to initialise ({error_kind(exc)}: {exc})") from None
        self.discover()
        return self

    def close(self) -> None:
        self.gpm.close()
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass

    def discover(self) -> list[Device]:
        """Find every GPU and MIG instance; devices that fail are counted and skipped this time."""
        nv = self.nvml
        reader = _Reader(nv, self.metrics)
        devices: list[Device] = []
        count = reader.call((), nv.nvmlDeviceGetCount) or 0
        for i in range(count):
            r = _Reader(nv, self.metrics)
            handle = r.call((), nv.nvmlDeviceGetHandleByIndex, i)
            if handle is None:
                continue
            uuid = r.call((), nv.nvmlDeviceGetUUID, handle)
            if uuid is None:
                continue
            name = r.call((), nv.nvmlDeviceGetName, handle)
            parent = Device(handle, _text(uuid), i, _text(name) if name is not None else "unknown")
            devices.append(parent)
            devices.extend(self._mig_instances(parent))
        self.devices = devices
        self.gpm.retain(d.uuid for d in devices)
        for d in devices:
            self.gpm.prime(d, _Reader(nv, self.metrics))
        self._discovered_at = time.monotonic()
        return devices

    def _mig_instances(self, parent: Device) -> list[Device]:
        nv = self.nvml
        r = _Reader(nv, self.metrics)
        r.unavailable = []
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(parent.handle)
        except nv.NVMLError:  # NotSupported on GPUs without MIG: nothing to count
            return []
        if current != getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1):
            return []
        out = []
        for j in range(r.call((), nv.nvmlDeviceGetMaxMigDeviceCount, parent.handle) or 0):
            try:
                handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, j)
            except nv.NVMLError_NotFound:
                continue
            except nv.NVMLError as exc:
                self.metrics.nvml_errors.labels(kind=error_kind(exc)).inc()
                continue
            uuid = r.call((), nv.nvmlDeviceGetUUID, handle)
            if uuid is None:
                continue
            gi = r.call((), nv.nvmlDeviceGetGpuInstanceId, handle) if hasattr(nv, "nvmlDeviceGetGpuInstanceId") else None
            out.append(
                Device(
                    handle,
                    _text(uuid),
                    parent.index,
                    f"{parent.name} MIG",
                    parent_uuid=parent.uuid,
                    parent_handle=parent.handle,
                    gpu_instance_id=int(gi) if gi is not None else None,
                )
            )
        return out

    # ------------------------------------------------------------------ sampling
    def sample(self) -> list[MetricSample]:
        """One sample per device; never raises for NVML errors."""
        if time.monotonic() - self._discovered_at >= self.rediscover_s or not self.devices:
            self.discover()
        t0 = time.perf_counter()
        out = [self.sample_device(d) for d in self.devices]
        if self.attribution is not None:
            out = self.attribution.attribute(out)
        self.metrics.sample_seconds.observe(time.perf_counter() - t0)
        self.metrics.samples_taken.inc(len(out))
        return out

    def sample_device(self, d: Device) -> MetricSample:
        nv = self.nvml
        r = _Reader(nv, self.metrics)
        h = d.handle
        power_mw = r.call(("power_w",), nv.nvmlDeviceGetPowerUsage, h)
        energy = r.call(("energy_mj",), nv.nvmlDeviceGetTotalEnergyConsumption, h)
        temp = r.call(("temp_c",), self._temperature, h)
        util = r.call(("sm_util_pct", "mem_util_pct"), nv.nvmlDeviceGetUtilizationRates, h)
        mem = r.call(("mem_used_mb", "mem_total_mb"), nv.nvmlDeviceGetMemoryInfo, h)
        rx = r.call(("pcie_rx_kbps",), nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_RX_BYTES)
        tx = r.call(("pcie_tx_kbps",), nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_TX_BYTES)
        procs = r.call(("processes",), nv.nvmlDeviceGetComputeRunningProcesses, h)
        proc_util = self._process_util(d, r) if procs is not None else None
        gpm = self.gpm.read(d, r)
        seq = self._seq.get(d.uuid, 0)
        self._seq[d.uuid] = seq + 1
        return MetricSample(
            ts=self.clock(),
            host=self.host,
            gpu_uuid=d.uuid,
            gpu_index=d.index,
            gpu_model=d.name,
            seq=seq,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            temp_c=float(temp) if temp is not None else None,
            sm_util_pct=float(util.gpu) if util is not None else None,
            mem_util_pct=float(util.memory) if util is not None else None,
            mem_used_mb=mem.used / MIB if mem is not None else None,
            mem_total_mb=mem.total / MIB if mem is not None else None,
            pcie_rx_kbps=float(rx) if rx is not None else None,
            pcie_tx_kbps=float(tx) if tx is not None else None,
            energy_mj=float(energy) if energy is not None else None,
            processes=[_process(p, proc_util) for p in procs] if procs is not None else None,
            producer_id=self.producer_id,
            parent_uuid=d.parent_uuid,
            unavailable=sorted(set(r.unavailable)),
            dram_bw_util_pct=gpm["dram_bw_util_pct"],
            sm_occupancy_pct=gpm["sm_occupancy_pct"],
            gpm_sm_util_pct=gpm["gpm_sm_util_pct"],
            pcie_rx_bytes_per_s=gpm["pcie_rx_bytes_per_s"],
            pcie_tx_bytes_per_s=gpm["pcie_tx_bytes_per_s"],
        )

    def _process_util(self, d: Device, r: _Reader) -> dict[int, tuple[float | None, float | None]] | None:
        """pid -> (SM %, memory %), the mean of each process's samples since the last round (a running
        process missing from it reads 0); None when unknown: unsupported, an error, or no new sample."""
        nv = self.nvml
        since_us = self._process_seen_us.get(d.uuid)
        if since_us is None:  # first round of this device; then every sample newer than the last one seen
            since_us = int((self.clock() - self.process_lookback_s) * 1e6)

        def get() -> list[Any] | None:
            try:
                return list(nv.nvmlDeviceGetProcessUtilization(d.handle, since_us))
            except nv.NVMLError_NotFound:
                return None  # no sample newer than since_us: nothing measured this round

        samples = r.call(PROCESS_UTIL_FIELDS, get)
        if not samples:
            return None
        sums: dict[int, list[float]] = {}
        for s in samples:
            acc = sums.setdefault(int(s.pid), [0.0, 0.0, 0.0, 0.0])
            for i, v in ((0, s.smUtil), (2, s.memUtil)):
                if 0 <= v <= 100:  # out-of-range readings are dropped, never clamped to a number
                    acc[i] += float(v)
                    acc[i + 1] += 1
        self._process_seen_us[d.uuid] = max(int(s.timeStamp) for s in samples)
        return {pid: (a[0] / a[1] if a[1] else None, a[2] / a[3] if a[3] else None) for pid, a in sums.items()}

    def _temperature(self, handle: Any) -> Any:
        nv = self.nvml
        get_v = getattr(nv, "nvmlDeviceGetTemperatureV", None)
        if get_v is not None:
            try:
                return get_v(handle, nv.NVML_TEMPERATURE_GPU)
            except (nv.NVMLError_FunctionNotFound, nv.NVMLError_ArgumentVersionMismatch):
                pass  # older driver: the classic call below
        return nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)


def _process(p: Any, util: dict[int, tuple[float | None, float | None]] | None) -> GpuProcess:
    used = getattr(p, "usedGpuMemory", None)
    pid = int(p.pid)
    sm, mem = (None, None) if util is None else util.get(pid, (0.0, 0.0))
    return GpuProcess(
        pid=pid,
        used_mem_mb=used / MIB if isinstance(used, int | float) and used >= 0 else None,
        sm_util_pct=sm,
        mem_util_pct=mem,
    )


def run_sampler(
    sampler: NvmlSampler,
    publish: Callable[[str, Any], None],
    interval_s: float,
    stop: threading.Event,
    *,
    tracker: Any = None,
    max_rounds: int | None = None,
    clock: Callable[[], float] = time.monotonic,
    per_gpu: bool = False,
) -> int:
    """Sample every ``interval_s`` until ``stop`` is set; publish each round's samples as one :class:`HostMetrics`,
    then the job events discovered in it as one :class:`HostJobEvents` (with ``per_gpu``: one record each, for
    consumers older than batches). Returns rounds, also when interrupted (Ctrl-C, or SIGTERM made an interrupt)."""
    rounds = 0
    next_t = clock()
    try:
        while not stop.is_set() and (max_rounds is None or rounds < max_rounds):
            _sample_round(sampler, publish, tracker, per_gpu)
            rounds += 1
            next_t += interval_s
            now = clock()
            if next_t < now:  # fell behind (slow NVML): skip, do not burst
                next_t = now
            stop.wait(next_t - now)
    except KeyboardInterrupt:
        stop.set()
    return rounds


def _sample_round(sampler: NvmlSampler, publish: Callable[[str, Any], None], tracker: Any, per_gpu: bool) -> None:
    """One round: sample every device, publish the samples and the job events they reveal."""
    samples = sampler.sample()
    if samples and not per_gpu:
        publish(METRICS, host_metrics(samples))
    events = []
    for s in samples:
        if per_gpu:
            publish(METRICS, s)
        if tracker is not None:
            events.extend(tracker.update(s))
    if per_gpu:
        for ev in events:
            publish(LIFECYCLE, ev)
    elif events:
        publish(LIFECYCLE, host_job_events(events))

"""The NVML sampler: one MetricSample per GPU (and per MIG instance) per interval.

The NVML module is an argument (``nvml=``); the default is nvidia-ml-py's
``pynvml``.  Calls (DESIGN.md's mapping): ``nvmlDeviceGetPowerUsage`` (mW),
``nvmlDeviceGetTotalEnergyConsumption`` (mJ), ``nvmlDeviceGetTemperatureV``
(falling back to ``nvmlDeviceGetTemperature``), ``nvmlDeviceGetUtilizationRates``
(.gpu, .memory), ``nvmlDeviceGetMemoryInfo`` (bytes), ``nvmlDeviceGetPcieThroughput``
(RX, TX in KB/s) and ``nvmlDeviceGetComputeRunningProcesses``.

Errors, per field: ``NVMLError_NotSupported`` -> the field is null and named in
``unavailable`` (never 0); any other NVML error -> null, counted by kind in
``aip_producer_nvml_errors_total``; ``NVMLError_GpuIsLost`` also stops reading
that device for this round.  The sample is published with what could be read
and the other GPUs are sampled as usual.  ``dram_bw_util_pct`` (GPM) is not
sampled yet and is always listed as unavailable.
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
from producers.metrics import ProducerMetrics

MIB = 1024.0 * 1024.0
NOT_SAMPLED = ("dram_bw_util_pct",)


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine (no driver or library); the message names what is missing."""


@dataclass(frozen=True)
class Device:
    handle: Any
    uuid: str
    index: int
    name: str
    parent_uuid: str | None = None


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
            self.metrics.nvml_errors.labels(kind=error_kind(exc)).inc()
            if isinstance(exc, self.nvml.NVMLError_GpuIsLost):
                self.lost = True
        return None


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
    ) -> None:
        self.nvml = nvml if nvml is not None else importlib.import_module("pynvml")
        self.host = host or socket.gethostname()
        self.producer_id = producer_id or f"nvml-{uuidlib.uuid4().hex[:12]}"
        self.clock = clock
        self.metrics = metrics or ProducerMetrics()
        self.rediscover_s = rediscover_s
        self.devices: list[Device] = []
        self._seq: dict[str, int] = {}
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
            if uuid is not None:
                out.append(Device(handle, _text(uuid), parent.index, f"{parent.name} MIG", parent_uuid=parent.uuid))
        return out

    # ------------------------------------------------------------------ sampling
    def sample(self) -> list[MetricSample]:
        """One sample per device; never raises for NVML errors."""
        if time.monotonic() - self._discovered_at >= self.rediscover_s or not self.devices:
            self.discover()
        t0 = time.perf_counter()
        out = [self.sample_device(d) for d in self.devices]
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
            dram_bw_util_pct=None,
            processes=[_process(p) for p in procs] if procs is not None else None,
            producer_id=self.producer_id,
            parent_uuid=d.parent_uuid,
            unavailable=sorted({*r.unavailable, *NOT_SAMPLED}),
        )

    def _temperature(self, handle: Any) -> Any:
        nv = self.nvml
        get_v = getattr(nv, "nvmlDeviceGetTemperatureV", None)
        if get_v is not None:
            try:
                return get_v(handle, nv.NVML_TEMPERATURE_GPU)
            except (nv.NVMLError_FunctionNotFound, nv.NVMLError_ArgumentVersionMismatch):
                pass  # older driver: the classic call below
        return nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)


def _process(p: Any) -> GpuProcess:
    used = getattr(p, "usedGpuMemory", None)
    return GpuProcess(pid=int(p.pid), used_mem_mb=used / MIB if isinstance(used, int | float) and used >= 0 else None)


def run_sampler(
    sampler: NvmlSampler,
    publish: Callable[[str, Any], None],
    interval_s: float,
    stop: threading.Event,
    *,
    tracker: Any = None,
    max_rounds: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Sample every ``interval_s`` until ``stop`` is set; publish samples (and discovered job events). Returns rounds."""
    rounds = 0
    next_t = clock()
    while not stop.is_set() and (max_rounds is None or rounds < max_rounds):
        for s in sampler.sample():
            publish(METRICS, s)
            if tracker is not None:
                for ev in tracker.update(s):
                    publish(LIFECYCLE, ev)
        rounds += 1
        next_t += interval_s
        now = clock()
        if next_t < now:  # fell behind (slow NVML): skip, do not burst
            next_t = now
        stop.wait(next_t - now)
    return rounds

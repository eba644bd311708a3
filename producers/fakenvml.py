"""A fake ``pynvml`` module for tests and benchmarks (no GPU needed).

It has the names the sampler uses, with nvidia-ml-py's error classes and
units (mW, mJ, bytes, KB/s, GPM PCIe in MiB/s).  Each :class:`FakeGpu` can declare
calls that are not supported, calls that fail with a given error, a lost GPU,
MIG children, per-process utilisation samples and GPM metrics (``gpm``: None is a
GPU without GPM, as ``nvmlGpmQueryDeviceSupport`` reports pre-Hopper GPUs).

>>> nv = FakeNvml([FakeGpu("GPU-a", unsupported={"nvmlDeviceGetPowerUsage"})])
>>> nv.nvmlInit(); h = nv.nvmlDeviceGetHandleByIndex(0)
>>> nv.nvmlDeviceGetUUID(h)
'GPU-a'
>>> nv.nvmlDeviceGetPowerUsage(h)
Traceback (most recent call last):
...
producers.fakenvml.NVMLError_NotSupported: Not Supported
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


def _error(name: str, text: str) -> type[NVMLError]:
    cls = type(f"NVMLError_{name}", (NVMLError,), {"__str__": lambda self: text, "__module__": __name__})
    globals()[cls.__name__] = cls
    return cls


NVMLError_NotSupported = _error("NotSupported", "Not Supported")
NVMLError_GpuIsLost = _error("GpuIsLost", "GPU is lost")
NVMLError_LibraryNotFound = _error("LibraryNotFound", "NVML Shared Library Not Found")
NVMLError_DriverNotLoaded = _error("DriverNotLoaded", "Driver Not Loaded")
NVMLError_NotFound = _error("NotFound", "Not Found")
NVMLError_NoPermission = _error("NoPermission", "Insufficient Permissions")
NVMLError_Unknown = _error("Unknown", "Unknown Error")
NVMLError_Timeout = _error("Timeout", "Timeout")
NVMLError_FunctionNotFound = _error("FunctionNotFound", "Function Not Found")
NVMLError_ArgumentVersionMismatch = _error("ArgumentVersionMismatch", "Argument Version Mismatch")
NVMLError_InvalidArgument = _error("InvalidArgument", "Invalid Argument")

NVML_ERROR_NOT_SUPPORTED = 3
GPM_METRIC_IDS = {"SM_UTIL": 2, "SM_OCCUPANCY": 3, "DRAM_BW_UTIL": 10, "PCIE_TX_PER_SEC": 20, "PCIE_RX_PER_SEC": 21}
"""nvidia-ml-py's ``NVML_GPM_METRIC_<name>`` ids of the metrics the fake knows."""


def hopper_gpm() -> dict[str, float]:
    """GPM readings of a busy Hopper GPU (percent; PCIe in MiB/s, as NVML reports them)."""
    return {"SM_UTIL": 64.0, "SM_OCCUPANCY": 31.5, "DRAM_BW_UTIL": 42.25, "PCIE_TX_PER_SEC": 2.0, "PCIE_RX_PER_SEC": 8.0}


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H200"
    power_mw: int = 250_000
    energy_mj: int = 1_000_000
    temp_c: int = 55
    sm_util_pct: int = 70
    mem_util_pct: int = 40
    mem_used_b: int = 8 * 1024**3
    mem_total_b: int = 80 * 1024**3
    pcie_rx_kbps: int = 120_000
    pcie_tx_kbps: int = 30_000
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes or None)
    unsupported: set[str] = field(default_factory=set)  # nvml function names raising NotSupported
    errors: dict[str, Exception] = field(default_factory=dict)  # function name -> error to raise
    lost: bool = False
    mig: list[FakeGpu] | None = None  # MIG instances (MIG mode on when not None)
    process_util: dict[int, tuple[int, int]] = field(default_factory=dict)  # pid -> (SM %, memory %) this interval
    gpm: dict[str, float] | None = None  # GPM metric name (GPM_METRIC_IDS) -> value; None: no GPM on this GPU
    gpu_instance_id: int = 0  # of a MIG instance


@dataclass
class FakeGpmSample:
    """What ``nvmlGpmSampleAlloc`` returns: filled by a sample-get call, with the device and a sequence number."""

    gpu: FakeGpu | None = None
    seq: int = -1
    freed: bool = False


class FakeGpmMetricsGet:
    """``c_nvmlGpmMetricsGet_t``: version, numMetrics, sample1, sample2 and ``metrics[i]`` (metricId, nvmlReturn, value)."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(len(GPM_METRIC_IDS))]


class FakeNvml:
    """Module-like fake of ``pynvml`` over a list of :class:`FakeGpu`."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_Unknown = NVMLError_Unknown
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_ArgumentVersionMismatch = NVMLError_ArgumentVersionMismatch
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = GPM_METRIC_IDS["SM_UTIL"]
    NVML_GPM_METRIC_SM_OCCUPANCY = GPM_METRIC_IDS["SM_OCCUPANCY"]
    NVML_GPM_METRIC_DRAM_BW_UTIL = GPM_METRIC_IDS["DRAM_BW_UTIL"]
    NVML_GPM_METRIC_PCIE_TX_PER_SEC = GPM_METRIC_IDS["PCIE_TX_PER_SEC"]
    NVML_GPM_METRIC_PCIE_RX_PER_SEC = GPM_METRIC_IDS["PCIE_RX_PER_SEC"]
    c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet
    NVML_TEMPERATURE_GPU = 0
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, gpus: list[FakeGpu], *, library_missing: bool = False) -> None:
        self.gpus = gpus
        self.library_missing = library_missing
        self.calls = 0
        self.process_util_since: list[int] = []  # the lastSeenTimeStamp of every nvmlDeviceGetProcessUtilization call
        self.gpm_samples: list[FakeGpmSample] = []  # every sample allocated (``freed`` tells the live ones)
        self._clock_us = 1_700_000_000_000_000

    def _check(self, gpu: FakeGpu, fn: str) -> FakeGpu:
        self.calls += 1
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        if fn in gpu.unsupported:
            raise NVMLError_NotSupported()
        if fn in gpu.errors:
            raise gpu.errors[fn]
        return gpu

    def nvmlInit(self) -> None:
        if self.library_missing:
            raise NVMLError_LibraryNotFound()

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self._check(self.gpus[i], "nvmlDeviceGetHandleByIndex")

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return self._check(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return self._check(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return self._check(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        return self._check(h, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetTemperatureV(self, h: FakeGpu, sensor: int) -> int:
        return self._check(h, "nvmlDeviceGetTemperatureV").temp_c

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        return self._check(h, "nvmlDeviceGetTemperature").temp_c

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        g = self._check(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.sm_util_pct, memory=g.mem_util_pct)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        g = self._check(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=g.mem_used_b, total=g.mem_total_b, free=g.mem_total_b - g.mem_used_b)

    def nvmlDeviceGetPcieThroughput(self, h: FakeGpu, counter: int) -> int:
        g = self._check(h, "nvmlDeviceGetPcieThroughput")
        return g.pcie_rx_kbps if counter == self.NVML_PCIE_UTIL_RX_BYTES else g.pcie_tx_kbps

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        g = self._check(h, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in g.processes]

    def nvmlDeviceGetProcessUtilization(self, h: FakeGpu, timeStamp: int) -> list[Any]:
        """One sample per process with non-zero utilisation, newer than ``timeStamp`` (NotFound when none)."""
        g = self._check(h, "nvmlDeviceGetProcessUtilization")
        self.process_util_since.append(timeStamp)
        self._clock_us = max(self._clock_us, timeStamp) + 1
        busy = [(pid, sm, mem) for pid, (sm, mem) in g.process_util.items() if sm or mem]
        if not busy:
            raise NVMLError_NotFound()
        return [
            SimpleNamespace(pid=pid, timeStamp=self._clock_us, smUtil=sm, memUtil=mem, encUtil=0, decUtil=0)
            for pid, sm, mem in busy
        ]

    def nvmlDeviceGetGpuInstanceId(self, h: FakeGpu) -> int:
        return self._check(h, "nvmlDeviceGetGpuInstanceId").gpu_instance_id

    # ------------------------------------------------------------------ GPM
    def nvmlGpmQueryDeviceSupport(self, h: FakeGpu) -> Any:
        g = self._check(h, "nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(version=1, isSupportedDevice=int(g.gpm is not None))

    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:
        s = FakeGpmSample()
        self.gpm_samples.append(s)
        return s

    def nvmlGpmSampleFree(self, s: FakeGpmSample) -> None:
        if s.freed:
            raise NVMLError_InvalidArgument()
        s.freed = True

    def _fill(self, g: FakeGpu, s: FakeGpmSample) -> FakeGpmSample:
        if g.gpm is None:
            raise NVMLError_NotSupported()
        if s.freed:
            raise NVMLError_InvalidArgument()
        s.gpu, s.seq = g, self.calls
        return s

    def nvmlGpmSampleGet(self, h: FakeGpu, s: FakeGpmSample) -> FakeGpmSample:
        return self._fill(self._check(h, "nvmlGpmSampleGet"), s)

    def nvmlGpmMigSampleGet(self, h: FakeGpu, gpuInstanceId: int, s: FakeGpmSample) -> FakeGpmSample:
        g = self._check(h, "nvmlGpmMigSampleGet")
        if g.gpm is None:
            raise NVMLError_NotSupported()
        for m in g.mig or []:
            if m.gpu_instance_id == gpuInstanceId:
                return self._fill(m, s)
        raise NVMLError_NotFound()

    def nvmlGpmMetricsGet(self, req: FakeGpmMetricsGet) -> FakeGpmMetricsGet:
        a, b = req.sample1, req.sample2
        self.calls += 1
        if req.version != self.NVML_GPM_METRICS_GET_VERSION:
            raise NVMLError_ArgumentVersionMismatch()
        if a.freed or b.freed or a.gpu is None or a.gpu is not b.gpu or not a.seq < b.seq:
            raise NVMLError_InvalidArgument()  # two samples of one device, in order
        g = a.gpu
        if "nvmlGpmMetricsGet" in g.errors:
            raise g.errors["nvmlGpmMetricsGet"]
        names = {v: k for k, v in GPM_METRIC_IDS.items()}
        for m in req.metrics[: req.numMetrics]:
            value = (g.gpm or {}).get(names.get(m.metricId, ""))
            m.nvmlReturn, m.value = (0, value) if value is not None else (NVML_ERROR_NOT_SUPPORTED, 0.0)
        return req

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> tuple[int, int]:
        g = self._check(h, "nvmlDeviceGetMigMode")
        if g.mig is None:
            raise NVMLError_NotSupported()
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        return 7 if self._check(h, "nvmlDeviceGetMaxMigDeviceCount").mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, j: int) -> FakeGpu:
        g = self._check(h, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not g.mig or j >= len(g.mig):
            raise NVMLError_NotFound()
        return g.mig[j]


def mig_instance(uuid: str, mem_total_b: int = 10 * 1024**3, gpu_instance_id: int = 0) -> FakeGpu:
    """A MIG instance as NVML shows it: memory and processes, but no utilisation (device or per process),
    power, temperature or PCIe; GPM through its parent (``nvmlGpmMigSampleGet``) without the PCIe metrics."""
    return FakeGpu(
        uuid=uuid,
        mem_total_b=mem_total_b,
        mem_used_b=mem_total_b // 4,
        unsupported={
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetTemperatureV",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetPcieThroughput",
            "nvmlDeviceGetProcessUtilization",
            "nvmlGpmQueryDeviceSupport",
            "nvmlGpmSampleGet",
        },
        gpm={"SM_UTIL": 20.0, "SM_OCCUPANCY": 10.0, "DRAM_BW_UTIL": 12.5},
        gpu_instance_id=gpu_instance_id,
    )


def fleet(n: int, **kwargs: Any) -> FakeNvml:
    """``n`` healthy fake GPUs."""
    return FakeNvml([FakeGpu(uuid=f"GPU-fake-{i:04d}", **kwargs) for i in range(n)])

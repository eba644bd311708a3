"""A fake ``pynvml`` module for tests and benchmarks (no GPU needed).

It has the names the sampler uses, with nvidia-ml-py's error classes and
units (mW, mJ, bytes, KB/s).  Each :class:`FakeGpu` can declare calls that are
not supported, calls that fail with a given error, a lost GPU and MIG children.

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
    NVML_TEMPERATURE_GPU = 0
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, gpus: list[FakeGpu], *, library_missing: bool = False) -> None:
        self.gpus = gpus
        self.library_missing = library_missing
        self.calls = 0

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


def mig_instance(uuid: str, mem_total_b: int = 10 * 1024**3) -> FakeGpu:
    """A MIG instance as NVML shows it: memory and processes, but no utilisation, power, temperature or PCIe."""
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
        },
    )


def fleet(n: int, **kwargs: Any) -> FakeNvml:
    """``n`` healthy fake GPUs."""
    return FakeNvml([FakeGpu(uuid=f"GPU-fake-{i:04d}", **kwargs) for i in range(n)])

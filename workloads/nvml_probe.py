"""Which NVML fields and GPM metrics a GPU supports, and what they read now.

    python -m workloads.nvml_probe [--gpu-index 0] [--gpm-interval 1.0] > probe.json

Every call of the NVML mapping (docs/ARCHITECTURE.md) is tried once; each answer is
``{"supported": true, "value": ...}`` or ``{"supported": false, "error": KIND}``
(NotSupported, NoPermission, FunctionNotFound, ...; per-process utilisation reads
NotFound when no process was busy in the last second).  On GPUs with GPM (Hopper
and later) the metrics SM_UTIL, SM_OCCUPANCY, DRAM_BW_UTIL and PCIE_TX/RX_PER_SEC
are read from two samples ``--gpm-interval`` seconds apart.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

GPM_METRICS = ("SM_UTIL", "SM_OCCUPANCY", "DRAM_BW_UTIL", "PCIE_TX_PER_SEC", "PCIE_RX_PER_SEC")


def _kind(exc: BaseException) -> str:
    return type(exc).__name__.removeprefix("NVMLError_")


def _plain(value: Any) -> Any:
    """NVML answers as JSON: bytes decoded, structures as dicts of their fields."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    fields = getattr(value, "_fields_", None)
    if fields is not None:
        return {name: _plain(getattr(value, name)) for name, *_ in fields}
    if hasattr(value, "__dict__"):
        return {k: _plain(v) for k, v in vars(value).items() if not k.startswith("_")}
    return str(value)


def attempt(nvml: Any, fn: Callable[[], Any]) -> dict[str, Any]:
    """One call: its value, or the NVML error kind (a missing function counts as FunctionNotFound)."""
    try:
        return {"supported": True, "value": _plain(fn())}
    except AttributeError:
        return {"supported": False, "error": "FunctionNotFound"}
    except nvml.NVMLError as exc:
        return {"supported": False, "error": _kind(exc)}


def field_calls(nvml: Any, h: Any) -> dict[str, Callable[[], Any]]:
    """The calls behind each MetricSample field (docs/ARCHITECTURE.md, "NVML mapping"), plus context."""
    return {
        "power_w <- nvmlDeviceGetPowerUsage (mW)": lambda: nvml.nvmlDeviceGetPowerUsage(h),
        "energy_mj <- nvmlDeviceGetTotalEnergyConsumption": lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h),
        "temp_c <- nvmlDeviceGetTemperatureV": lambda: nvml.nvmlDeviceGetTemperatureV(h, nvml.NVML_TEMPERATURE_GPU),
        "temp_c <- nvmlDeviceGetTemperature": lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
        "sm_util_pct, mem_util_pct <- nvmlDeviceGetUtilizationRates": lambda: nvml.nvmlDeviceGetUtilizationRates(h),
        "mem_used_mb, mem_total_mb <- nvmlDeviceGetMemoryInfo (bytes)": lambda: nvml.nvmlDeviceGetMemoryInfo(h),
        "pcie_rx_kbps <- nvmlDeviceGetPcieThroughput RX": lambda: nvml.nvmlDeviceGetPcieThroughput(
            h, nvml.NVML_PCIE_UTIL_RX_BYTES
        ),
        "pcie_tx_kbps <- nvmlDeviceGetPcieThroughput TX": lambda: nvml.nvmlDeviceGetPcieThroughput(
            h, nvml.NVML_PCIE_UTIL_TX_BYTES
        ),
        "processes <- nvmlDeviceGetComputeRunningProcesses": lambda: nvml.nvmlDeviceGetComputeRunningProcesses(h),
        "processes.sm_util_pct, .mem_util_pct <- nvmlDeviceGetProcessUtilization (last 1 s)": lambda: (
            nvml.nvmlDeviceGetProcessUtilization(h, int((time.time() - 1.0) * 1e6))
        ),
        "mig mode <- nvmlDeviceGetMigMode": lambda: nvml.nvmlDeviceGetMigMode(h),
        "power limit (mW) <- nvmlDeviceGetEnforcedPowerLimit": lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h),
        "SM clock (MHz) <- nvmlDeviceGetClockInfo SM": lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
    }


def gpm(nvml: Any, h: Any, interval_s: float, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """GPM support and the GPM metrics docs/ARCHITECTURE.md's "NVML mapping" names, from two samples ``interval_s`` apart."""
    support = attempt(nvml, lambda: nvml.nvmlGpmQueryDeviceSupport(h))
    if not support["supported"] or not support["value"].get("isSupportedDevice"):
        return {"supported": False, "query": support}
    out: dict[str, Any] = {"supported": True, "interval_s": interval_s, "metrics": {}}
    try:
        s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
        nvml.nvmlGpmSampleGet(h, s1)
        sleep(interval_s)
        nvml.nvmlGpmSampleGet(h, s2)
        req = nvml.c_nvmlGpmMetricsGet_t()
        req.version = nvml.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(GPM_METRICS)
        req.sample1, req.sample2 = s1, s2
        for i, name in enumerate(GPM_METRICS):
            req.metrics[i].metricId = getattr(nvml, f"NVML_GPM_METRIC_{name}")
        nvml.nvmlGpmMetricsGet(req)
        for i, name in enumerate(GPM_METRICS):
            m = req.metrics[i]
            ok = int(m.nvmlReturn) == 0
            out["metrics"][name] = (
                {"supported": ok, "value": float(m.value)} if ok else {"supported": False, "nvml_return": int(m.nvmlReturn)}
            )
        nvml.nvmlGpmSampleFree(s1)
        nvml.nvmlGpmSampleFree(s2)
    except nvml.NVMLError as exc:
        out["error"] = _kind(exc)
    return out


def probe(nvml: Any, index: int = 0, gpm_interval_s: float = 1.0, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Everything above for the GPU at ``index``, with driver and NVML versions."""
    nvml.nvmlInit()
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        return {
            "ts": time.time(),
            "gpu_index": index,
            "name": attempt(nvml, lambda: nvml.nvmlDeviceGetName(h)).get("value"),
            "uuid": attempt(nvml, lambda: nvml.nvmlDeviceGetUUID(h)).get("value"),
            "driver_version": attempt(nvml, lambda: nvml.nvmlSystemGetDriverVersion()).get("value"),
            "nvml_version": attempt(nvml, lambda: nvml.nvmlSystemGetNVMLVersion()).get("value"),
            "fields": {name: attempt(nvml, fn) for name, fn in field_calls(nvml, h).items()},
            "gpm": gpm(nvml, h, gpm_interval_s, sleep),
        }
    finally:
        nvml.nvmlShutdown()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workloads.nvml_probe", description="Which NVML fields and GPM metrics this GPU supports."
    )
    p.add_argument("--gpu-index", type=int, default=0)
    p.add_argument("--gpm-interval", type=float, default=1.0, help="seconds between the two GPM samples (default 1)")
    args = p.parse_args(argv)
    try:
        nvml = importlib.import_module("pynvml")
        report = probe(nvml, args.gpu_index, args.gpm_interval)
    except ModuleNotFoundError:
        print("nvml_probe: error: nvidia-ml-py (module pynvml) is not installed", file=sys.stderr)
        return 2
    except Exception as exc:  # NVMLError_LibraryNotFound and friends: one line, no traceback
        print(f"nvml_probe: error: NVML unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

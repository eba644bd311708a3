"""GPM metrics (Hopper and later) for the NVML sampler: one reading per device per sampling round.

GPM metrics are computed between two samples (``nvmlGpmSampleAlloc`` / ``nvmlGpmSampleGet``,
``nvmlGpmMigSampleGet`` for a MIG instance through its parent); this reader keeps each device's
previous sample, so every round reads the interval since the round before.  A device is read only
where ``nvmlGpmQueryDeviceSupport`` says ``isSupportedDevice`` (asked once per device; of the
parent for a MIG instance).  Per metric, ``nvmlReturn`` NOT_SUPPORTED makes that field null and
unavailable; any other failure is null and counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MIB = 1024.0 * 1024.0

GPM_FIELDS = {
    "gpm_sm_util_pct": "SM_UTIL",
    "sm_occupancy_pct": "SM_OCCUPANCY",
    "dram_bw_util_pct": "DRAM_BW_UTIL",
    "pcie_tx_bytes_per_s": "PCIE_TX_PER_SEC",
    "pcie_rx_bytes_per_s": "PCIE_RX_PER_SEC",
}
"""MetricSample field -> ``NVML_GPM_METRIC_<name>``."""

_SCALE = {"pcie_tx_bytes_per_s": MIB, "pcie_rx_bytes_per_s": MIB}  # GPM reports PCIe in MiB/s
_NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED


def gpm_value(field: str, raw: float) -> float:
    """A GPM reading in the record's unit: bytes/s for PCIe, percent (clamped to 0-100) otherwise.

    >>> gpm_value("pcie_rx_bytes_per_s", 2.0), gpm_value("dram_bw_util_pct", 100.000001)
    (2097152.0, 100.0)
    """
    if field in _SCALE:
        return max(0.0, raw * _SCALE[field])
    return min(100.0, max(0.0, raw))


class GpmReader:
    """Previous GPM samples and GPM support per device; :meth:`read` fills the GPM fields of one sample."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._supported: dict[str, bool] = {}
        self._prev: dict[str, Any] = {}

    def supported(self, device: Any, reader: Any) -> bool | None:
        """Whether the device has GPM (None: the query failed this time, ask again next round)."""
        known = self._supported.get(device.uuid)
        if known is not None:
            return known
        nv = self.nvml
        query = getattr(nv, "nvmlGpmQueryDeviceSupport", None)
        handle = device.parent_handle if device.parent_uuid is not None else device.handle
        if query is None or handle is None or (device.parent_uuid is not None and device.gpu_instance_id is None):
            self._supported[device.uuid] = False
            return False
        try:
            ok = bool(query(handle).isSupportedDevice)
        except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
            ok = False
        except nv.NVMLError as exc:
            reader.count(exc)
            return None
        if ok and device.parent_uuid is not None and not hasattr(nv, "nvmlGpmMigSampleGet"):
            ok = False
        self._supported[device.uuid] = ok
        return ok

    def _take(self, device: Any) -> Any:
        nv = self.nvml
        s = nv.nvmlGpmSampleAlloc()
        try:
            if device.parent_uuid is not None:
                nv.nvmlGpmMigSampleGet(device.parent_handle, device.gpu_instance_id, s)
            else:
                nv.nvmlGpmSampleGet(device.handle, s)
        except BaseException:
            nv.nvmlGpmSampleFree(s)
            raise
        return s

    def _metrics(self, first: Any, second: Any) -> Any:
        nv = self.nvml
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(GPM_FIELDS)
        req.sample1, req.sample2 = first, second
        for i, name in enumerate(GPM_FIELDS.values()):
            req.metrics[i].metricId = getattr(nv, f"NVML_GPM_METRIC_{name}")
        return nv.nvmlGpmMetricsGet(req)

    def prime(self, device: Any, reader: Any) -> None:
        """Take a device's first sample (at discovery), so that its first round already has an interval."""
        if device.uuid not in self._prev and self.supported(device, reader):
            s = reader.call((), self._take, device)
            if s is not None:
                self._prev[device.uuid] = s

    def read(self, device: Any, reader: Any) -> dict[str, float | None]:
        """The GPM fields of one sample; fields the device does not support go to ``reader.unavailable``.

        The first reading of a device that was not primed is null (one sample is no interval)."""
        out: dict[str, float | None] = dict.fromkeys(GPM_FIELDS)
        if reader.lost:
            return out
        ok = self.supported(device, reader)
        if not ok:
            if ok is False:
                reader.unavailable.extend(GPM_FIELDS)
            return out
        new = reader.call(tuple(GPM_FIELDS), self._take, device)
        if new is None:
            return out
        prev = self._prev.get(device.uuid)
        self._prev[device.uuid] = new
        if prev is None:
            return out
        try:
            req = reader.call(tuple(GPM_FIELDS), self._metrics, prev, new)
        finally:
            self._free(prev)
        if req is None:
            return out
        for i, field in enumerate(GPM_FIELDS):
            m = req.metrics[i]
            code = int(m.nvmlReturn)
            if code == 0:
                out[field] = gpm_value(field, float(m.value))
            elif code == getattr(self.nvml, "NVML_ERROR_NOT_SUPPORTED", _NOT_SUPPORTED):
                reader.unavailable.append(field)
            else:
                reader.count_kind(f"GpmMetric{code}")
        return out

    def _free(self, s: Any) -> None:
        try:
            self.nvml.nvmlGpmSampleFree(s)
        except self.nvml.NVMLError:
            pass

    def retain(self, uuids: Iterable[str]) -> None:
        """Forget devices that are gone (their samples freed)."""
        keep = set(uuids)
        for uuid in [u for u in self._prev if u not in keep]:
            self._free(self._prev.pop(uuid))
        for uuid in [u for u in self._supported if u not in keep]:
            del self._supported[uuid]

    def close(self) -> None:
        self.retain(())

"""The NVML probe on the fake NVML: supported fields read, unsupported ones named, no GPM on the fake."""

from __future__ import annotations

from producers.fakenvml import FakeGpu, FakeNvml
from workloads.nvml_probe import main, probe


def test_probe_names_supported_and_unsupported_fields() -> None:
    gpu = FakeGpu("GPU-p", unsupported={"nvmlDeviceGetPcieThroughput"}, processes=[(42, 1024**3)])
    report = probe(FakeNvml([gpu]), gpm_interval_s=0.0, sleep=lambda s: None)
    fields = report["fields"]
    assert report["uuid"] == "GPU-p" and report["name"] == "NVIDIA H200"
    assert fields["power_w <- nvmlDeviceGetPowerUsage (mW)"] == {"supported": True, "value": 250_000}
    assert fields["sm_util_pct, mem_util_pct <- nvmlDeviceGetUtilizationRates"]["value"] == {"gpu": 70, "memory": 40}
    assert fields["pcie_rx_kbps <- nvmlDeviceGetPcieThroughput RX"] == {"supported": False, "error": "NotSupported"}
    assert fields["processes <- nvmlDeviceGetComputeRunningProcesses"]["value"] == [{"pid": 42, "usedGpuMemory": 1024**3}]
    assert fields["SM clock (MHz) <- nvmlDeviceGetClockInfo SM"] == {"supported": False, "error": "FunctionNotFound"}
    assert report["gpm"]["supported"] is False


def test_probe_without_a_driver_is_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    import importlib.util

    if importlib.util.find_spec("pynvml") is None:
        return
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return  # a real GPU here: nothing to check
    except pynvml.NVMLError:
        pass
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nvml_probe: error: NVML unavailable")

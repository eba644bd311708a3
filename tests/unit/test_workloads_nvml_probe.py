"""The NVML probe on the fake NVML: supported fields read, unsupported ones named, no GPM on the fake."""

from __future__ import annotations

import sys

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


def test_probe_without_a_driver_is_one_line(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu("GPU-p")], library_missing=True))
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nvml_probe: error: NVML unavailable: NVMLError_LibraryNotFound")


def test_probe_without_nvidia_ml_py_is_one_line(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "pynvml", None)  # an import of it raises ModuleNotFoundError
    assert main([]) == 2
    assert capsys.readouterr().err == "nvml_probe: error: nvidia-ml-py (module pynvml) is not installed\n"


def test_probe_prints_the_report_of_the_fake_gpu(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import json

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu("GPU-p")]))
    assert main(["--gpm-interval", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["uuid"] == "GPU-p" and report["gpu_index"] == 0

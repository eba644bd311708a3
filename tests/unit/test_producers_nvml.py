"""The NVML sampler against the fake pynvml: every error path."""

from __future__ import annotations

import subprocess
import sys
import threading

from events import MetricSample, decode, encode
from producers.discovery import ProcessTracker
from producers.fakenvml import FakeGpu, FakeNvml, NVMLError_Timeout, NVMLError_Unknown, fleet, mig_instance
from producers.metrics import ProducerMetrics
from producers.nvml import NvmlSampler, NvmlUnavailable, run_sampler


def sampler(nv: FakeNvml, **kw) -> NvmlSampler:
    return NvmlSampler(nv, host="h1", producer_id="p1", clock=lambda: 1_700_000_000.0, metrics=ProducerMetrics(), **kw).open()


def test_healthy_gpus_map_nvml_units_to_record_fields() -> None:
    nv = fleet(2, processes=[(42, 512 * 1024**2)])
    (a, b) = sampler(nv).sample()
    assert (a.gpu_uuid, b.gpu_uuid, a.gpu_index, b.gpu_index) == ("GPU-fake-0000", "GPU-fake-0001", 0, 1)
    assert a.power_w == 250.0 and a.energy_mj == 1_000_000.0 and a.temp_c == 55.0
    assert (a.sm_util_pct, a.mem_util_pct) == (70.0, 40.0)
    assert (a.mem_used_mb, a.mem_total_mb) == (8192.0, 81920.0)
    assert (a.pcie_rx_kbps, a.pcie_tx_kbps) == (120_000.0, 30_000.0)
    assert [(p.pid, p.used_mem_mb) for p in a.processes] == [(42, 512.0)]
    assert a.gpu_model == "NVIDIA H200" and a.producer_id == "p1" and a.unavailable == ["dram_bw_util_pct"]
    assert decode(MetricSample, encode(a)) == a


def test_seq_counts_per_gpu_from_zero() -> None:
    s = sampler(fleet(2))
    rounds = [s.sample() for _ in range(3)]
    assert [[x.seq for x in r] for r in rounds] == [[0, 0], [1, 1], [2, 2]]


def test_not_supported_field_is_null_and_named_others_intact() -> None:
    gpu = FakeGpu("GPU-x", unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetPcieThroughput"})
    m = ProducerMetrics()
    (s,) = NvmlSampler(FakeNvml([gpu]), host="h", metrics=m).open().sample()
    assert s.power_w is None and s.pcie_rx_kbps is None and s.pcie_tx_kbps is None
    assert s.power_w != 0 and s.temp_c == 55.0 and s.sm_util_pct == 70.0 and s.energy_mj == 1_000_000.0
    assert set(s.unavailable) == {"power_w", "pcie_rx_kbps", "pcie_tx_kbps", "dram_bw_util_pct"}
    assert m.value("aip_producer_nvml_errors_total", kind="NotSupported") == 0  # not an error


def test_driver_error_on_one_field_is_counted_and_the_rest_published() -> None:
    gpu = FakeGpu(
        "GPU-x",
        errors={
            "nvmlDeviceGetUtilizationRates": NVMLError_Unknown(),
            "nvmlDeviceGetComputeRunningProcesses": NVMLError_Timeout(),
        },
    )
    m = ProducerMetrics()
    (s,) = NvmlSampler(FakeNvml([gpu]), host="h", metrics=m).open().sample()
    assert s.sm_util_pct is None and s.mem_util_pct is None and s.processes is None
    assert "sm_util_pct" not in s.unavailable  # an error is not "unsupported"
    assert s.power_w == 250.0 and s.mem_used_mb == 8192.0
    assert m.value("aip_producer_nvml_errors_total", kind="Unknown") == 1
    assert m.value("aip_producer_nvml_errors_total", kind="Timeout") == 1


def test_lost_gpu_is_counted_and_other_gpus_keep_being_sampled() -> None:
    nv = fleet(3)
    m = ProducerMetrics()
    s = NvmlSampler(nv, host="h", metrics=m).open()
    s.sample()
    nv.gpus[1].lost = True
    for _ in range(2):
        a, lost, c = s.sample()
        assert a.power_w == 250.0 and c.power_w == 250.0
        assert lost.gpu_uuid == "GPU-fake-0001" and lost.power_w is None and lost.temp_c is None
    assert m.value("aip_producer_nvml_errors_total", kind="GpuIsLost") == 2  # one per round, not per field
    assert m.value("aip_producer_samples_taken_total") == 9


def test_gpu_lost_at_discovery_is_skipped_and_counted() -> None:
    nv = fleet(2)
    nv.gpus[0].errors["nvmlDeviceGetHandleByIndex"] = nv.NVMLError_GpuIsLost()
    m = ProducerMetrics()
    samples = NvmlSampler(nv, host="h", metrics=m).open().sample()
    assert [x.gpu_uuid for x in samples] == ["GPU-fake-0001"]
    assert m.value("aip_producer_nvml_errors_total", kind="GpuIsLost") >= 1


def test_mig_instances_are_sampled_with_their_parent_and_unavailable_fields() -> None:
    parent = FakeGpu("GPU-parent", mig=[mig_instance("MIG-a"), mig_instance("MIG-b")])
    samples = sampler(FakeNvml([parent, FakeGpu("GPU-plain")])).sample()
    by = {x.gpu_uuid: x for x in samples}
    assert set(by) == {"GPU-parent", "MIG-a", "MIG-b", "GPU-plain"}
    mig = by["MIG-a"]
    assert mig.parent_uuid == "GPU-parent" and by["GPU-plain"].parent_uuid is None
    assert mig.mem_total_mb == 10240.0 and mig.power_w is None and mig.sm_util_pct is None
    assert {"power_w", "temp_c", "sm_util_pct", "mem_util_pct", "pcie_rx_kbps"} <= set(mig.unavailable)
    assert by["GPU-parent"].power_w == 250.0


def test_temperature_falls_back_to_the_classic_call() -> None:
    gpu = FakeGpu("GPU-x", errors={"nvmlDeviceGetTemperatureV": FakeNvml.NVMLError_FunctionNotFound()}, temp_c=61)
    (s,) = sampler(FakeNvml([gpu])).sample()
    assert s.temp_c == 61.0


def test_missing_library_is_a_clear_error() -> None:
    try:
        NvmlSampler(FakeNvml([], library_missing=True)).open()
    except NvmlUnavailable as exc:
        assert "libnvidia-ml" in str(exc)
    else:
        raise AssertionError("expected NvmlUnavailable")


def test_processes_that_appear_and_disappear_become_job_events() -> None:
    nv = fleet(1)
    s = sampler(nv)
    tracker = ProcessTracker("p1")
    published = []
    stop = threading.Event()
    nv.gpus[0].processes = [(7, None)]
    run_sampler(s, lambda t, r: published.append((t, r)), 0.0, stop, tracker=tracker, max_rounds=2)
    nv.gpus[0].processes = []
    run_sampler(s, lambda t, r: published.append((t, r)), 0.0, stop, tracker=tracker, max_rounds=1)
    life = [(r.kind, r.pid, r.job_type) for t, r in published if t == "jobs.lifecycle"]
    assert life == [("started", 7, "unknown"), ("finished", 7, "unknown")]
    assert sum(t == "gpu.metrics" for t, _ in published) == 3


def test_cli_without_driver_exits_2_with_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "aip.cli", "produce", "nvml"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "libnvidia-ml" in lines[0] and "Traceback" not in proc.stderr

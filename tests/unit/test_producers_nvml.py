"""The NVML sampler against the fake pynvml: every error path."""

from __future__ import annotations

import subprocess
import sys
import threading

from events import MetricSample, decode, encode
from producers.discovery import ProcessTracker
from producers.fakenvml import FakeGpu, FakeNvml, NVMLError_Timeout, NVMLError_Unknown, fleet, hopper_gpm, mig_instance
from producers.gpm import GPM_FIELDS
from producers.metrics import ProducerMetrics
from producers.nvml import PROCESS_UTIL_FIELDS, NvmlSampler, NvmlUnavailable, run_sampler

MIB = 1024.0 * 1024.0
NOW_S = 1_700_000_000.0


def sampler(nv: FakeNvml, **kw) -> NvmlSampler:
    kw.setdefault("metrics", ProducerMetrics())
    return NvmlSampler(nv, host="h1", producer_id="p1", clock=lambda: NOW_S, **kw).open()


def test_healthy_gpus_map_nvml_units_to_record_fields() -> None:
    nv = fleet(2, processes=[(42, 512 * 1024**2)])
    (a, b) = sampler(nv).sample()
    assert (a.gpu_uuid, b.gpu_uuid, a.gpu_index, b.gpu_index) == ("GPU-fake-0000", "GPU-fake-0001", 0, 1)
    assert a.power_w == 250.0 and a.energy_mj == 1_000_000.0 and a.temp_c == 55.0
    assert (a.sm_util_pct, a.mem_util_pct) == (70.0, 40.0)
    assert (a.mem_used_mb, a.mem_total_mb) == (8192.0, 81920.0)
    assert (a.pcie_rx_kbps, a.pcie_tx_kbps) == (120_000.0, 30_000.0)
    assert [(p.pid, p.used_mem_mb) for p in a.processes] == [(42, 512.0)]
    assert a.gpu_model == "NVIDIA H200" and a.producer_id == "p1" and a.unavailable == sorted(GPM_FIELDS)  # no GPM
    assert a.dram_bw_util_pct is None and a.sm_occupancy_pct is None
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
    assert set(s.unavailable) == {"power_w", "pcie_rx_kbps", "pcie_tx_kbps", *GPM_FIELDS}
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
    assert m.value("aip_producer_nvml_errors_total", kind="GpuIsLost") == 1


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
    batches = [r for t, r in published if t == "jobs.lifecycle"]  # one per round that found any
    life = [[(e.kind, e.pid, e.job_type) for e in r.events] for r in batches]
    assert life == [[("started", 7, "unknown")], [("finished", 7, "unknown")]]
    assert sum(t == "gpu.metrics" for t, _ in published) == 3


def test_cli_without_driver_exits_2_with_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "aip.cli", "produce", "nvml"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "libnvidia-ml" in lines[0] and "Traceback" not in proc.stderr


# ------------------------------------------------------------------ per-process utilisation
def test_process_utilisation_is_attached_to_each_process_by_pid() -> None:
    gpu = FakeGpu("GPU-x", processes=[(7, 1024**3), (8, None), (9, None)], process_util={7: (60, 30), 8: (25, 10)})
    nv = FakeNvml([gpu])
    m = ProducerMetrics()
    s = sampler(nv, metrics=m, process_lookback_s=2.0)
    (a,) = s.sample()
    by = {p.pid: p for p in a.processes}
    assert (by[7].sm_util_pct, by[7].mem_util_pct, by[7].used_mem_mb) == (60.0, 30.0, 1024.0)
    assert (by[8].sm_util_pct, by[8].mem_util_pct) == (25.0, 10.0)
    assert (by[9].sm_util_pct, by[9].mem_util_pct) == (0.0, 0.0)  # running, no non-zero sample: measured idle
    assert not set(PROCESS_UTIL_FIELDS) & set(a.unavailable)
    assert decode(MetricSample, encode(a)) == a
    (b,) = s.sample()
    first_since, second_since = nv.process_util_since
    assert first_since == int((NOW_S - 2.0) * 1e6)  # the first round looks back process_lookback_s
    assert second_since > first_since  # then only samples newer than the last one seen
    assert {p.pid: p.sm_util_pct for p in b.processes} == {7: 60.0, 8: 25.0, 9: 0.0}
    assert m.value("aip_producer_nvml_errors_total", kind="NotFound") == 0


def test_no_new_process_sample_leaves_utilisation_null_not_zero() -> None:
    m = ProducerMetrics()
    (a,) = sampler(FakeNvml([FakeGpu("GPU-x", processes=[(7, None)])]), metrics=m).sample()  # NVML: NotFound
    assert a.processes[0].sm_util_pct is None and a.processes[0].mem_util_pct is None
    assert not set(PROCESS_UTIL_FIELDS) & set(a.unavailable)  # supported, just nothing measured this round
    assert m.value("aip_producer_nvml_errors_total", kind="NotFound") == 0


def test_process_utilisation_not_supported_is_null_and_named() -> None:
    gpu = FakeGpu("GPU-x", processes=[(7, 1024**3)], process_util={7: (50, 5)}, unsupported={"nvmlDeviceGetProcessUtilization"})
    m = ProducerMetrics()
    (a,) = sampler(FakeNvml([gpu]), metrics=m).sample()
    assert a.processes[0].sm_util_pct is None and a.processes[0].sm_util_pct != 0 and a.processes[0].used_mem_mb == 1024.0
    assert set(PROCESS_UTIL_FIELDS) <= set(a.unavailable)
    assert m.value("aip_producer_nvml_errors_total", kind="NotSupported") == 0


def test_process_utilisation_error_is_counted_not_unsupported() -> None:
    gpu = FakeGpu(
        "GPU-x", processes=[(7, None)], process_util={7: (50, 5)}, errors={"nvmlDeviceGetProcessUtilization": NVMLError_Unknown()}
    )
    m = ProducerMetrics()
    (a,) = sampler(FakeNvml([gpu]), metrics=m).sample()
    assert a.processes[0].sm_util_pct is None and not set(PROCESS_UTIL_FIELDS) & set(a.unavailable)
    assert m.value("aip_producer_nvml_errors_total", kind="Unknown") == 1


# ------------------------------------------------------------------ GPM
def test_gpm_metrics_on_a_supported_gpu_from_the_first_round() -> None:
    nv = FakeNvml([FakeGpu("GPU-h", gpm=hopper_gpm())])
    s = sampler(nv)
    for _ in range(3):
        (a,) = s.sample()
        assert (a.dram_bw_util_pct, a.sm_occupancy_pct, a.gpm_sm_util_pct) == (42.25, 31.5, 64.0)
        assert (a.pcie_rx_bytes_per_s, a.pcie_tx_bytes_per_s) == (8 * MIB, 2 * MIB)  # GPM's MiB/s in bytes/s
        assert not set(GPM_FIELDS) & set(a.unavailable)
        assert a.pcie_rx_kbps == 120_000.0  # the PCIe counters are still read
    assert decode(MetricSample, encode(a)) == a
    assert sum(not x.freed for x in nv.gpm_samples) == 1  # only the previous sample is kept
    s.close()
    assert all(x.freed for x in nv.gpm_samples)


def test_gpu_without_gpm_has_null_gpm_fields_named_unavailable() -> None:
    m = ProducerMetrics()
    plain = FakeGpu("GPU-v100", name="Tesla V100")  # isSupportedDevice 0
    old_driver = FakeGpu("GPU-old", gpm=hopper_gpm(), errors={"nvmlGpmQueryDeviceSupport": FakeNvml.NVMLError_FunctionNotFound()})
    nv = FakeNvml([plain, old_driver])
    for x in sampler(nv, metrics=m).sample():
        assert all(getattr(x, f) is None for f in GPM_FIELDS)
        assert set(GPM_FIELDS) <= set(x.unavailable)
    assert nv.gpm_samples == []
    assert m.value("aip_producer_nvml_errors_total", kind="FunctionNotFound") == 0


def test_gpm_metric_not_supported_alone_is_null_and_the_rest_read() -> None:
    (a,) = sampler(FakeNvml([FakeGpu("GPU-h", gpm={"DRAM_BW_UTIL": 50.0, "SM_OCCUPANCY": 20.0})])).sample()
    assert a.dram_bw_util_pct == 50.0 and a.sm_occupancy_pct == 20.0
    assert a.pcie_rx_bytes_per_s is None and a.gpm_sm_util_pct is None
    assert {"pcie_rx_bytes_per_s", "pcie_tx_bytes_per_s", "gpm_sm_util_pct"} <= set(a.unavailable)
    assert "dram_bw_util_pct" not in a.unavailable


def test_gpm_error_is_counted_and_no_sample_leaks() -> None:
    gpu = FakeGpu("GPU-h", gpm=hopper_gpm(), errors={"nvmlGpmMetricsGet": NVMLError_Timeout()})
    nv = FakeNvml([gpu])
    m = ProducerMetrics()
    s = sampler(nv, metrics=m)
    for _ in range(2):
        (a,) = s.sample()
        assert a.dram_bw_util_pct is None and not set(GPM_FIELDS) & set(a.unavailable)
        assert a.power_w == 250.0
    assert m.value("aip_producer_nvml_errors_total", kind="Timeout") == 2
    assert sum(not x.freed for x in nv.gpm_samples) == 1
    del gpu.errors["nvmlGpmMetricsGet"]
    (a,) = s.sample()
    assert a.dram_bw_util_pct == 42.25  # recovers on the next round


def test_mig_gpm_through_the_parent_and_no_per_process_utilisation() -> None:
    migs = [
        mig_instance("MIG-a", gpu_instance_id=1),
        mig_instance("MIG-b", gpu_instance_id=2),
    ]
    migs[0].processes = [(7, 1024**3)]
    migs[0].process_util = {7: (80, 20)}  # what NVML would not report per process under MIG
    migs[1].gpm = {"SM_UTIL": 5.0, "SM_OCCUPANCY": 2.0, "DRAM_BW_UTIL": 1.5}
    parent = FakeGpu("GPU-parent", gpm=hopper_gpm(), mig=migs)
    by = {x.gpu_uuid: x for x in sampler(FakeNvml([parent])).sample()}
    a, b = by["MIG-a"], by["MIG-b"]
    assert a.processes[0].sm_util_pct is None and set(PROCESS_UTIL_FIELDS) <= set(a.unavailable)
    assert (a.dram_bw_util_pct, a.sm_occupancy_pct, a.gpm_sm_util_pct) == (12.5, 10.0, 20.0)
    assert (b.dram_bw_util_pct, b.sm_occupancy_pct) == (1.5, 2.0)  # each instance its own GPU instance id
    assert a.pcie_rx_bytes_per_s is None and {"pcie_rx_bytes_per_s", "pcie_tx_bytes_per_s"} <= set(a.unavailable)
    assert by["GPU-parent"].dram_bw_util_pct == 42.25


def test_mig_on_a_parent_without_gpm_lists_gpm_unavailable() -> None:
    parent = FakeGpu("GPU-parent", mig=[mig_instance("MIG-a", gpu_instance_id=1)])  # parent: no GPM
    by = {x.gpu_uuid: x for x in sampler(FakeNvml([parent])).sample()}
    assert by["MIG-a"].dram_bw_util_pct is None and set(GPM_FIELDS) <= set(by["MIG-a"].unavailable)


def test_each_round_is_one_host_batch_unless_per_gpu() -> None:
    from events import HostMetrics, MetricSample

    s = sampler(fleet(3))
    published: list = []
    run_sampler(s, lambda t, r: published.append((t, r)), 0.0, threading.Event(), max_rounds=2)
    assert [(t, type(r), len(r.samples)) for t, r in published] == [("gpu.metrics", HostMetrics, 3)] * 2
    assert [x.gpu_index for x in published[0][1].samples] == [0, 1, 2] and published[0][1].host == "h1"
    assert [x.seq for _t, r in published for x in r.samples] == [0, 0, 0, 1, 1, 1]
    published.clear()
    run_sampler(s, lambda t, r: published.append((t, r)), 0.0, threading.Event(), max_rounds=1, per_gpu=True)
    assert [type(r) for _t, r in published] == [MetricSample] * 3


def test_a_rounds_job_events_are_one_host_batch_unless_per_gpu() -> None:
    from events import HostJobEvents, JobEvent

    for per_gpu, expected in ((False, [HostJobEvents]), (True, [JobEvent, JobEvent])):
        nv = fleet(2)
        nv.gpus[0].processes, nv.gpus[1].processes = [(7, None)], [(8, None)]
        published: list = []
        run_sampler(
            sampler(nv), lambda t, r, out=published: out.append((t, r)), 0.0, threading.Event(),
            tracker=ProcessTracker("p1"), max_rounds=1, per_gpu=per_gpu,
        )  # fmt: skip
        life = [r for t, r in published if t == "jobs.lifecycle"]
        assert [type(r) for r in life] == expected
        events = life[0].events if not per_gpu else life
        assert [(e.kind, e.pid) for e in events] == [("started", 7), ("started", 8)]


def test_an_interrupted_sampler_stops_and_counts_the_rounds_it_finished() -> None:
    """SIGTERM reaches `aip produce nvml` as KeyboardInterrupt; its summary must still say how many rounds ran."""
    published: list = []
    stop = threading.Event()

    def publish(topic: str, record: object) -> None:
        if len(published) == 3:
            raise KeyboardInterrupt
        published.append(record)

    assert run_sampler(sampler(fleet(2)), publish, 0.0, stop) == 3
    assert stop.is_set() and len(published) == 3

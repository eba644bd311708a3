"""The per-pod SM utilisation series of a worker's /metrics (``aip_pod_sm_util_pct``): fed from the samples
stage 1 reads, one series per (GPU, pod, container), the series of pods gone dropped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_stream_agents import settle

from events import GpuProcess, MetricSample
from streams.interference_metrics import InterferenceMetrics

TS = 1_700_000_000.0


def sample(gpu: str, *procs: GpuProcess, seq: int = 0) -> MetricSample:
    return MetricSample(ts=TS + seq, host="node-1", gpu_uuid=gpu, gpu_index=0, gpu_model="H200", seq=seq, processes=list(procs))


def proc(pid: int, pod: str | None, sm: float | None, container: str = "train") -> GpuProcess:
    return GpuProcess(pid=pid, sm_util_pct=sm, namespace="ml" if pod else None, pod=pod, container=container if pod else None)


def pod_series(m: InterferenceMetrics) -> dict[tuple[str, str, str, str], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(m)
    text = generate_latest(registry).decode()
    return {
        (s.labels["gpu_uuid"], s.labels["namespace"], s.labels["pod"], s.labels["container"]): s.value
        for f in text_string_to_metric_families(text)
        if f.name == "aip_pod_sm_util_pct"
        for s in f.samples
    }


def test_pods_sharing_a_gpu_each_get_their_own_series_and_gone_pods_are_dropped() -> None:
    now = [0.0]
    m = InterferenceMetrics(50.0, 35.0, horizon_s=60.0, clock=lambda: now[0])
    m.observe_samples(
        [
            sample("GPU-a", proc(1, "a0", 30.0), proc(2, "a1", 45.0), proc(3, "a1", 10.0), proc(4, None, 5.0)),
            sample("GPU-b", proc(5, "b0", 70.0, container="worker"), proc(6, "b1", None)),
        ]
    )
    assert pod_series(m) == {
        ("GPU-a", "ml", "a0", "train"): 30.0,
        ("GPU-a", "ml", "a1", "train"): 55.0,  # a pod's processes add up; a host process has no series
        ("GPU-b", "ml", "b0", "worker"): 70.0,  # b1 had no utilisation sample: no series, never 0
    }
    m.observe_samples([sample("GPU-a", proc(1, "a0", 20.0), seq=1)])  # a1 left GPU-a
    assert pod_series(m) == {("GPU-a", "ml", "a0", "train"): 20.0, ("GPU-b", "ml", "b0", "worker"): 70.0}
    m.observe_samples([sample("GPU-a", proc(4, None, 5.0), seq=2)])  # no pod left on GPU-a
    now[0] = 61.0  # and GPU-b sent nothing for longer than the horizon
    assert pod_series(m) == {}


def test_a_sample_whose_process_list_failed_keeps_the_last_pods() -> None:
    m = InterferenceMetrics(50.0, 35.0)
    m.observe_samples([sample("GPU-a", proc(1, "a0", 30.0))])
    m.observe_samples([MetricSample(ts=TS, host="node-1", gpu_uuid="GPU-a", gpu_index=0, gpu_model="H200", seq=1)])
    assert pod_series(m) == {("GPU-a", "ml", "a0", "train"): 30.0}


def test_a_workers_metrics_show_the_pods_of_the_samples_stage_1_reads(tmp_path) -> None:
    import asyncio

    from config import Settings
    from events import encode
    from producers.batching import host_metrics
    from streams.app import create_app

    streams = create_app(Settings(topic_prefix="unit.", state_dir=str(tmp_path)), web=False)
    real = streams.inputs.handle_input

    def handle(event):  # test_context delivers on its own channel: this is gpu.metrics
        event.message.topic = streams.topics.metrics
        return real(event)

    streams.inputs.handle_input = handle  # type: ignore[method-assign]
    batch = host_metrics([sample("GPU-a", proc(1, "a0", 30.0), proc(2, "a1", 45.0)), sample("GPU-b", proc(3, "b0", 60.0))])

    async def go() -> None:
        async with streams.agents[0].test_context() as agent:
            await agent.put(encode(batch), key=b"node-1")
            await settle(lambda: bool(streams.interference.pod_sm))  # until stage 1 has read it

    asyncio.run(go())
    text = generate_latest(streams.metrics.registry).decode()
    got = {
        (s.labels["gpu_uuid"], s.labels["pod"]): s.value
        for f in text_string_to_metric_families(text)
        if f.name == "aip_pod_sm_util_pct"
        for s in f.samples
    }
    assert got == {("GPU-a", "a0"): 30.0, ("GPU-a", "a1"): 45.0, ("GPU-b", "b0"): 60.0}

"""Stage 1 fed host batches publishes what it publishes fed the same fleet as per-GPU records, through the
worker's own input path (``Inputs.stage1_batch``, no broker), and what a plain :class:`Stage1` finds."""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

import msgspec
import pytest
from records import Event, Message

from config import Settings
from events import encode
from events.topics import LIFECYCLE, METRICS
from producers.batching import host_batches
from producers.sim import Simulator
from streams.app import create_app
from streams.features import FIELDS, KEYS
from streams.stage1 import Stage1

TS = 1_700_000_000.0


def _fleet() -> list[tuple[str, Any]]:
    """12 simulated GPUs on 3 hosts for 400 s, with what the simulator has not: GPM DRAM bandwidth and per-process
    utilisation on one host's GPUs, and resends (every 41st record again at once, every 53rd again 7 records later)."""
    events = list(Simulator(12, seed=5, start_ts=TS, duration_s=400, gpus_per_host=4).events())
    first_host = events[0][1].host
    out: list[tuple[str, Any]] = []
    for i, (topic, record) in enumerate(events):
        if topic == METRICS and record.host == first_host:
            procs = [
                msgspec.structs.replace(p, sm_util_pct=20.0 + i % 50, mem_util_pct=5.0 + i % 7) for p in record.processes or []
            ]
            record = msgspec.structs.replace(record, dram_bw_util_pct=30.0 + i % 40, processes=procs)
        out.append((topic, record))
        if i % 41 == 0:
            out.append((topic, record))
        if i % 53 == 0 and i >= 7:
            out.append(events[i - 7])
    return out


def _through_the_worker(records: list[tuple[str, Any]], tmp_path: Any, name: str) -> tuple[list[Any], dict[str, int]]:
    """The observations and stage-1 counters of a worker's stage 1 fed ``records`` in batches of 200 events."""
    streams = create_app(Settings(topic_prefix="unit.", partitions=4, state_dir=str(tmp_path / name)), web=False)
    emitted: list[Any] = []
    streams.publisher.emit_observations = emitted.extend  # type: ignore[method-assign]
    streams.out["predictions"].send_soon = lambda **_: None  # type: ignore[method-assign,assignment]
    offsets: dict[tuple[str, int], int] = {}
    events = []
    for topic, record in records:
        partition = zlib.crc32(record.host.encode()) % 4
        offset = offsets[topic, partition] = offsets.get((topic, partition), -1) + 1
        events.append(Event(Message(streams.topics.name(topic), partition, offset, key=record.host.encode()), encode(record)))

    async def go() -> None:
        for i in range(0, len(events), 200):
            await streams.inputs.stage1_batch(events[i : i + 200])

    asyncio.run(go())
    assert streams.metrics.dead_letters == {}
    return emitted, dict(streams.stage1.counters)


def test_host_batches_and_per_gpu_records_give_the_same_observations(tmp_path: Any) -> None:
    fleet = _fleet()
    batched = list(host_batches(fleet))
    assert len(batched) < len(fleet) / 3  # most records travel in a batch of their host
    per_gpu, per_gpu_counters = _through_the_worker(fleet, tmp_path, "per-gpu")
    host, host_counters = _through_the_worker(batched, tmp_path, "batched")

    def content(observations: list[Any]) -> list[bytes]:
        return sorted(encode(o) for o in observations)

    assert len(per_gpu) > 100 and content(host) == content(per_gpu)
    assert host_counters == per_gpu_counters
    c = per_gpu_counters
    assert c["duplicate_metrics"] > 10 and c["duplicate_lifecycle"] > 10 and c["windows_colocated"] > 10
    assert any(o.rw_source == "dram_bw_util_pct" for o in per_gpu) and any(o.proc_sm_util_pct is not None for o in per_gpu)

    s = Settings()
    reference = Stage1.from_settings(s, every_window=True)
    expected = []
    for topic, record in fleet:  # lifecycle pending, as the worker without a consumer sees it
        expected += reference.on_metric(record, True) if topic == METRICS else reference.on_job(record, True)
    assert {o.observation_id for o in expected} == {o.observation_id for o in per_gpu}


def test_window_means_are_the_means_of_the_window_samples(tmp_path: Any) -> None:
    """Each observation's E, T, S, V and M are the plain means of its GPU's samples in its window (each sample once)."""
    fleet = _fleet()
    observations, _ = _through_the_worker(list(host_batches(fleet)), tmp_path, "means")
    samples: dict[tuple[str, float], dict[float, Any]] = {}
    for topic, r in fleet:
        if topic == METRICS:
            samples.setdefault((r.gpu_uuid, r.ts // 10.0 * 10.0), {})[r.ts] = r  # a resend counts once
    assert observations
    for o in observations:
        window = list(samples[o.gpu_uuid, o.window_start].values())
        assert o.samples == len(window)
        for key, field in zip(KEYS, FIELDS, strict=True):
            if key in ("R", "W"):
                continue  # DRAM bandwidth or PCIe, per environment (Stage1._rw)
            values = [getattr(r, field) for r in window if getattr(r, field) is not None]
            assert o.window_means[key] == pytest.approx(sum(values) / len(values), rel=1e-12), (o.observation_id, key)
    assert LIFECYCLE in {t for t, _ in fleet}

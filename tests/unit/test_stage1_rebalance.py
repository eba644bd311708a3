"""Held job-windows taken over in a rebalance: the worker that gets the partition publishes them at its next batch."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from records import Event, Message, sample

from config import Settings
from events import encode
from streams import changelog
from streams.app import create_app
from streams.checkpoint import TopicPartition
from streams.features import KEYS
from streams.stage1 import HeldWindow, Stage1
from streams.state import Stage1State

TS = 1_700_000_000.0


def _held(job_id: str) -> HeldWindow:
    return HeldWindow(
        window_start=TS, window_end=TS + 10, gpu_uuid="GPU-x", environment="v100", job_id=job_id, job_type="new-type",
        co_job_types=["other"], co_job_ids=["k"], window_means={k: 40.0 for k in KEYS}, throughput_steps_per_s=1.0,
        samples=10,
    )  # fmt: skip


def _last_owner_log(tmp_path: Path) -> list[tuple[bytes, bytes, int]]:
    """What the partition's last owner wrote to changelog partition 0: GPU-x, two job-windows held for 'new-type'."""
    log: list[tuple[bytes, bytes, int]] = []
    old = Stage1State(Stage1(10.0, 5.0, 120.0), tmp_path / "old.json", send=lambda k, v, p: log.append((k, v, p)))
    old.assign({0})
    old.stage1.state("GPU-x")
    for job_id in ("j1", "j2"):
        old.stage1._hold(_held(job_id))
    old.read_from("GPU-x", 0)
    old.offsets.store(TopicPartition("gpu.metrics", 0), 41)
    assert old.publish_changelog() == 2  # the GPU, then the positions
    return log


@pytest.mark.parametrize("batch", [1, 1000], ids=["event-by-event", "batched"])
def test_held_windows_taken_over_are_published_at_the_next_batch(tmp_path: Path, batch: int) -> None:
    log = _last_owner_log(tmp_path)
    streams = create_app(Settings(topic_prefix="unit.", state_dir=str(tmp_path / "new"), stage1_batch=batch), web=False)
    emitted: list[Any] = []
    streams.publisher.emit_observations = emitted.extend  # type: ignore[method-assign]
    streams.state.read = lambda p: changelog.fold([(k, v) for k, v, q in log if q == p])
    # this worker knows new-type's solo profile (interference.profiles carries every worker's shares)
    streams.stage1.profiles.add("v100", "new-type", {**{k: 50.0 for k in KEYS}, "throughput": 2.0}, source="1", ts=TS)
    record = sample(gpu_uuid="GPU-x", gpu_model="v100", ts=TS + 30.0, seq=1, producer_id="p")
    event = Event(Message(streams.topics.metrics, 0, 42, encode(record)), encode(record))

    async def go() -> None:
        streams.state.enabled = True
        streams.on_partitions_assigned(None, assigned=[Message(streams.topics.metrics, 0, 0, b"")])
        await asyncio.sleep(0)  # the restore runs; nothing is published before the partition's first batch
        assert emitted == []
        if batch == 1:
            await streams.inputs.stage1_event(event)
        else:
            await streams.inputs.stage1_batch([event])

    asyncio.run(go())
    released = [o for o in emitted if o.job_type == "new-type"]
    assert sorted(o.job_id for o in released) == ["j1", "j2"]
    assert all(o.gpu_uuid == "GPU-x" and o.interference_pct == pytest.approx(100.0) for o in released)  # 2 steps/s solo, 1 here
    assert streams.metrics.published["observations"] == len(emitted)
    c = streams.stage1.counters
    assert c["changelog_restored_gpus"] == 1 and c["changelog_adopted_held"] == 2 and c["held_released"] == 2
    assert streams.stage1.held_count() == 0 and streams.state.released == []
    assert streams.state.positions == {TopicPartition("gpu.metrics", 0): 42}  # the last owner's 41, then this event

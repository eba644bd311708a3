"""A partition's stage-1 state through the changelog records: its next owner continues exactly (no broker)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from events.topics import METRICS
from producers.sim import Simulator
from streams import changelog
from streams.checkpoint import TopicPartition
from streams.stage1 import HeldWindow, Stage1
from streams.state import Stage1State


def _events() -> list[tuple[str, Any]]:
    return list(Simulator(gpus=3, gpu_model="v100", seed=4, start_ts=1_700_000_000.0, duration_s=500).events())


def _apply(state: Stage1State, offset: int, topic: str, record: Any) -> list[Any]:
    """What the worker does per event (Inputs.handle_input), all GPUs in input partition 0."""
    state.read_from(record.gpu_uuid, 0)
    assert state.offsets.store(TopicPartition(topic, 0), offset)
    stage1 = state.stage1
    return stage1.on_metric(record) if topic == METRICS else stage1.on_job(record)


def _state(tmp: Path, name: str, **kw: Any) -> Stage1State:
    return Stage1State(Stage1(10.0, 5.0, 120.0), tmp / f"{name}.json", **kw)


def _writing(tmp: Path, name: str, **kw: Any) -> tuple[Stage1State, list[tuple[bytes, bytes, int]]]:
    """A state whose changelog writes (key, value, partition) go to the list returned with it."""
    log: list[tuple[bytes, bytes, int]] = []
    return _state(tmp, name, send=lambda k, v, p: log.append((k, v, p)), **kw), log


def _replay(state: Stage1State, events: list[tuple[str, Any]], start: int, stop: int | None = None) -> None:
    """_apply each of ``events[start:stop]`` at its own offset."""
    for i, (topic, record) in enumerate(events[start:stop], start=start):
        _apply(state, i, topic, record)


@pytest.mark.parametrize("buckets", [0, 1, 32])
def test_the_next_owner_continues_the_partition_as_if_nothing_moved(tmp_path: Path, buckets: int) -> None:
    """One record per GPU (0, as workers before buckets wrote), or per bucket (every GPU of it in each)."""
    events = _events()
    cut = len(events) // 2
    old, log = _writing(tmp_path, "old", writer_id="old", buckets=buckets)
    old.assigned = {0}
    _replay(old, events, 0, cut)
    gpus = sorted(old.stage1.gpus)
    records = len({changelog.bucket_of(g, buckets) for g in gpus}) if buckets else len(gpus)
    assert old.publish_changelog() == records + 1  # the GPUs' records, then the positions
    assert {p for _k, _v, p in log} == {0}
    new = _state(tmp_path, "new", read=lambda p: changelog.fold([(k, v) for k, v, q in log if q == p]), writer_id="new")
    for env, jt in old.stage1.profiles.known():  # what interference.profiles carries
        new.stage1.merge_profile(old.stage1.profiles.record(env, jt))
    assert asyncio.run(new.restore_partition(0)) == 3
    assert new.positions == old.positions
    assert not any(new.offsets.store(tp, offset) for tp, offset in old.positions.items())  # applied: replays
    assert {g: s.to_dict() for g, s in new.stage1.gpus.items()} == {g: s.to_dict() for g, s in old.stage1.gpus.items()}
    both = [[], []]
    for i, (topic, record) in enumerate(events[cut:], start=cut):
        for out, st in zip(both, (old, new), strict=True):
            out.extend(o.observation_id for o in _apply(st, i, topic, record))
    assert both[0] and sorted(both[0]) == sorted(both[1])


def test_a_worker_keeps_its_own_state_when_the_changelog_is_not_beyond_it(tmp_path: Path) -> None:
    events = _events()[:400]
    own, log = _writing(tmp_path, "own")
    own.assigned = {0}
    _replay(own, events, 0, 200)
    own.publish_changelog()  # what the changelog holds: the state at offset 199
    _replay(own, events, 200)  # the worker's own state went further (its checkpoint, say)
    before = {g: s.to_dict() for g, s in own.stage1.gpus.items()}
    own.read = lambda p: changelog.fold([(k, v) for k, v, _ in log])
    assert asyncio.run(own.restore_partition(0)) == 0
    assert {g: s.to_dict() for g, s in own.stage1.gpus.items()} == before


def test_lost_partitions_are_forgotten_and_held_windows_move_with_their_gpu(tmp_path: Path) -> None:
    window = HeldWindow(environment="v100", job_type="new-type", gpu_uuid="GPU-x", window_start=1.7e9, window_end=1.7e9 + 10,
                        job_id="j", co_job_types=["other"], co_job_ids=["k"], window_means={"E": 1.0},
                        throughput_steps_per_s=1.0, samples=10)  # fmt: skip
    old, log = _writing(tmp_path, "old")
    old.assign({0})
    old.stage1.state("GPU-x")
    old.stage1._hold(window)
    old.gpu_partition["GPU-x"] = 0
    old.touched.add("GPU-x")
    old.offsets.store(TopicPartition("gpu.metrics", 0), 5)
    old.publish_changelog()
    old.assign(set())  # the partition went elsewhere
    assert "GPU-x" not in old.stage1.gpus and old.stage1.held_count() == 0 and not old.positions
    new = _state(tmp_path, "new", read=lambda p: changelog.fold([(k, v) for k, v, _ in log]))
    assert asyncio.run(new.restore_partition(0)) == 1
    assert new.stage1.held_count() == 1 and not new.released  # held until new-type's solo profile arrives


def test_a_changelog_short_of_the_committed_offset_is_read_again_until_it_reaches_it(tmp_path: Path) -> None:
    """The last owner left the group late: its final write came after the new owner's first read."""
    events = _events()[:600]
    old, log = _writing(tmp_path, "old")
    old.assigned = {0}
    _replay(old, events, 0, 300)
    old.publish_changelog()
    early = list(log)
    _replay(old, events, 300)
    old.publish_changelog()  # the final write, then the commit at offset 600
    reads = []

    def read(p: int) -> changelog.PartitionState:
        reads.append(p)
        return changelog.fold([(k, v) for k, v, _ in (early if len(reads) == 1 else log)])

    new = _state(tmp_path, "new", read=read, catch_up_s=10.0)
    new.enabled = True
    asyncio.run(new.restored({0: {TopicPartition("gpu.metrics", 0): 600}}))
    assert len(reads) == 2 and new.positions == old.positions and new.ready(0)
    assert new.stage1.counters["changelog_behind"] == 0


def test_records_of_the_dict_era_still_fold_and_the_wire_format_is_unchanged() -> None:
    """Held job-windows were 15-key dicts and positions ``"topic:partition"`` strings: both still read the same."""
    held = {"window_start": 1.7e9, "window_end": 1.7e9 + 10, "gpu_uuid": "GPU-x", "environment": "v100", "job_id": "j",
            "job_type": "new-type", "co_job_types": ["other"], "co_job_ids": ["k"], "window_means": {"E": 1.0, "R": None},
            "throughput_steps_per_s": 1.0, "samples": 10, "proc_sm_util_pct": 45.0, "proc_mem_util_pct": None,
            "sm_share_pct": None, "rw_source": "pcie_kbps"}  # fmt: skip
    gpu = (b"gpu:GPU-x", json.dumps({"state": {}, "held": [held]}).encode())
    positions = (b"positions", json.dumps({"positions": {"gpu.metrics:3": 41, "jobs.lifecycle:3": 7}, "window_s": 10.0}).encode())
    state = changelog.fold([gpu, positions])
    (window,) = state.gpus["GPU-x"].held
    assert window == HeldWindow(**held) and window.to_builtins() == held
    assert state.positions == {TopicPartition("gpu.metrics", 3): 41, TopicPartition("jobs.lifecycle", 3): 7}
    key, value = changelog.gpu_record("GPU-x", {}, [window])
    assert (key, json.loads(value)) == (gpu[0], json.loads(gpu[1]))
    _, value = changelog.positions_record(state.positions, 10.0, "w")
    assert json.loads(value)["positions"] == {"gpu.metrics:3": 41, "jobs.lifecycle:3": 7}


def test_a_bucket_record_replaces_what_was_read_of_its_gpus_in_log_order() -> None:
    """A bucket's record holds every GPU of it: one it no longer holds is gone, whichever record held it before."""
    n = 4
    gpus = [f"GPU-{i}" for i in range(40)]
    b = changelog.bucket_of(gpus[0], n)
    mine = [g for g in gpus if changelog.bucket_of(g, n) == b]
    other = next(g for g in gpus if changelog.bucket_of(g, n) != b)
    single = changelog.gpu_record(mine[1], {"v": "single"})  # as a worker without buckets wrote it
    first = changelog.bucket_record(b, n, {g: ({"v": 1}, []) for g in mine})
    second = changelog.bucket_record(b, n, {mine[0]: ({"v": 2}, [])})  # the others left this partition
    outside = changelog.bucket_record(changelog.bucket_of(other, n), n, {other: ({"v": 1}, [])})
    state = changelog.fold([single, outside, first, second])
    assert {g: e.state for g, e in state.gpus.items()} == {mine[0]: {"v": 2}, other: {"v": 1}}
    later = changelog.gpu_record(mine[1], {"v": "back"})  # a record of its own after the bucket: it wins
    assert changelog.fold([first, second, later]).gpus[mine[1]].state == {"v": "back"}
    assert set(changelog.fold([single, first]).gpus) == set(mine)  # the bucket's record replaced the single one
    rebucketed = changelog.bucket_record(changelog.bucket_of(mine[0], 8), 8, {})  # another bucket count
    assert mine[0] not in changelog.fold([first, rebucketed]).gpus


def test_a_thousand_gpus_are_a_few_records_a_checkpoint(tmp_path: Path) -> None:
    """The cost the buckets are for: records per checkpoint, not per GPU (four input partitions)."""
    events = list(Simulator(gpus=1000, gpu_model="v100", seed=4, start_ts=1_700_000_000.0, duration_s=12).events())
    state, log = _writing(tmp_path, "many", buckets=32)
    for i, (topic, record) in enumerate(events):
        p = hash(record.gpu_uuid) % 4
        state.read_from(record.gpu_uuid, p)
        state.offsets.store(TopicPartition(topic, p), i)
        state.stage1.on_metric(record) if topic == METRICS else state.stage1.on_job(record)
    sent = state.publish_changelog()
    assert sent == 4 * 32 + 4  # every bucket of every partition, then each partition's positions
    folded = {p: changelog.fold([(k, v) for k, v, q in log if q == p]) for p in range(4)}
    assert sum(len(f.gpus) for f in folded.values()) == len(state.stage1.gpus) == 1000
    assert all(len(v) < 900 * 1024 for _k, v, _p in log)  # each under Kafka's 1 MB message limit

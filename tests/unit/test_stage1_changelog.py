"""A partition's stage-1 state through the changelog records: its next owner continues exactly (no broker)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from events.topics import METRICS
from producers.sim import Simulator
from streams import changelog
from streams.checkpoint import TopicPartition
from streams.stage1 import HeldWindow, Stage1
from streams.state import Stage1State
from streams.windows import GpuState, Job


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
    assert new.stage1.gpus == old.stage1.gpus
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
    before = msgspec.json.encode(own.stage1.gpus)
    own.read = lambda p: changelog.fold([(k, v) for k, v, _ in log])
    assert asyncio.run(own.restore_partition(0)) == 0
    assert msgspec.json.encode(own.stage1.gpus) == before


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


def _late_final_write(tmp_path: Path) -> tuple[list[tuple[str, Any]], Stage1State, Stage1State, list[int]]:
    """The last owner (returned first) wrote the changelog at offset 299; the new owner's first read returns that,
    every later read all the last owner wrote by then.  Returns the events, the last owner, the new owner (its
    changelog in use) and the partitions it read, in order."""
    events = _events()[:600]
    old, log = _writing(tmp_path, "old")
    old.assigned = {0}
    _replay(old, events, 0, 300)
    old.publish_changelog()
    early = list(log)
    reads: list[int] = []

    def read(p: int) -> changelog.PartitionState:
        reads.append(p)
        return changelog.fold([(k, v) for k, v, _ in (early if len(reads) == 1 else log)])

    new = _state(tmp_path, "new", read=read, catch_up_s=10.0)
    new.enabled = True
    return events, old, new, reads


def test_a_changelog_short_of_the_committed_offset_is_read_again_until_it_reaches_it(tmp_path: Path) -> None:
    """The last owner left the group late: its final write came after the new owner's first read."""
    events, old, new, reads = _late_final_write(tmp_path)
    _replay(old, events, 300)
    old.publish_changelog()  # the final write, then the commit at offset 600
    asyncio.run(new.restored({0: {TopicPartition("gpu.metrics", 0): 600}}))
    assert len(reads) == 2 and new.positions == old.positions and new.ready(0)
    assert new.stage1.counters["changelog_behind"] == 0


def test_a_short_changelog_read_at_the_assignment_is_read_again_when_the_first_event_comes(tmp_path: Path) -> None:
    """The read the assignment starts can finish before the partition's first event: it is still checked against
    the offset that event shows, and read again."""
    events, old, new, reads = _late_final_write(tmp_path)

    async def assigned_then_first_event() -> None:
        new.assign({0})  # starts the read
        await asyncio.sleep(0.1)
        assert reads == [0]  # read before any event of the partition came
        _replay(old, events, 300)
        old.publish_changelog()  # the last owner's final write, then its commit at offset 600
        await new.restored({0: {TopicPartition("gpu.metrics", 0): 600}})

    asyncio.run(assigned_then_first_event())
    assert len(reads) == 2 and new.positions == old.positions and new.ready(0)
    assert new.stage1.counters["changelog_behind"] == 0


def test_records_fold_to_what_was_written_and_records_of_another_form_are_left_out() -> None:
    """A GPU's record (its state, its held job-windows) and a partition's positions fold back to what was written;
    positions stay ``"topic:partition"`` keys on the wire; a record of another version's form is left out, counted."""
    held = HeldWindow(
        1.7e9, 1.7e9 + 10, "GPU-x", "v100", "j", "new-type", ["other"], ["k"], {"E": 1.0, "R": None}, 1.0, 10,
        proc_sm_util_pct=45.0, rw_source="pcie_kbps",
    )  # fmt: skip
    st = GpuState("v100", windows={3: [1.0, 2.0]}, closed=2, jobs={"j": Job("new-type", start=1.7e9, pid=7)}, raised=["j"])
    gpu = changelog.gpu_record("GPU-x", st, [held])
    positions = changelog.positions_record({TopicPartition("gpu.metrics", 3): 41, TopicPartition("jobs.lifecycle", 3): 7}, 10.0, "w")
    old = (b"gpu:GPU-y", json.dumps({"state": {"env": "v100", "win": {}}, "held": []}).encode())  # abbreviated keys
    state = changelog.fold([gpu, positions, old])
    assert state.gpus["GPU-x"].state == st and state.gpus["GPU-x"].held == [held]
    assert "GPU-y" not in state.gpus and state.skipped == 1
    assert state.positions == {TopicPartition("gpu.metrics", 3): 41, TopicPartition("jobs.lifecycle", 3): 7}
    assert state.window_s == 10.0
    assert json.loads(positions[1])["positions"] == {"gpu.metrics:3": 41, "jobs.lifecycle:3": 7}


def test_a_bucket_record_replaces_what_was_read_of_its_gpus_in_log_order() -> None:
    """A bucket's record holds every GPU of it: one it no longer holds is gone, whichever record held it before."""
    n = 4
    gpus = [f"GPU-{i}" for i in range(40)]
    b = changelog.bucket_of(gpus[0], n)
    mine = [g for g in gpus if changelog.bucket_of(g, n) == b]
    other = next(g for g in gpus if changelog.bucket_of(g, n) != b)
    def v(tag: str) -> GpuState:
        return GpuState(environment=tag)

    single = changelog.gpu_record(mine[1], v("single"))  # as a worker without buckets wrote it
    first = changelog.bucket_record(b, n, {g: (v("1"), []) for g in mine})
    second = changelog.bucket_record(b, n, {mine[0]: (v("2"), [])})  # the others left this partition
    outside = changelog.bucket_record(changelog.bucket_of(other, n), n, {other: (v("1"), [])})
    state = changelog.fold([single, outside, first, second])
    assert {g: e.state for g, e in state.gpus.items()} == {mine[0]: v("2"), other: v("1")}
    later = changelog.gpu_record(mine[1], v("back"))  # a record of its own after the bucket: it wins
    assert changelog.fold([first, second, later]).gpus[mine[1]].state == v("back")
    assert set(changelog.fold([single, first]).gpus) == set(mine)  # the bucket's record replaced the single one
    rebucketed = changelog.bucket_record(changelog.bucket_of(mine[0], 8), 8, {})  # another bucket count
    assert mine[0] not in changelog.fold([first, rebucketed]).gpus


def test_a_thousand_gpus_are_a_few_records_a_checkpoint(tmp_path: Path) -> None:
    """The cost the buckets are for: records per checkpoint, not per GPU (four input partitions)."""
    events = list(Simulator(gpus=1000, gpu_model="v100", seed=4, start_ts=1_700_000_000.0, duration_s=12).events())
    state, log = _writing(tmp_path, "many", buckets=32)
    # GPUs dealt to the four partitions in turn (the same in every run, unlike the salted ``hash``)
    partition_of = {g: n % 4 for n, g in enumerate(sorted({r.gpu_uuid for _t, r in events}))}
    for i, (topic, record) in enumerate(events):
        p = partition_of[record.gpu_uuid]
        state.read_from(record.gpu_uuid, p)
        state.offsets.store(TopicPartition(topic, p), i)
        state.stage1.on_metric(record) if topic == METRICS else state.stage1.on_job(record)
    sent = state.publish_changelog()
    filled = {(p, changelog.bucket_of(g, 32)) for g, p in partition_of.items()}
    assert len(filled) == 4 * 32  # 250 GPUs a partition fill its 32 buckets
    assert sent == len(filled) + 4  # every bucket of every partition, then each partition's positions
    folded = {p: changelog.fold([(k, v) for k, v, q in log if q == p]) for p in range(4)}
    assert sum(len(f.gpus) for f in folded.values()) == len(state.stage1.gpus) == 1000
    assert all(len(v) < 900 * 1024 for _k, v, _p in log)  # each under Kafka's 1 MB message limit


@pytest.mark.parametrize("buckets", [0, 32])
def test_a_commit_that_encodes_each_gpu_once_writes_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, buckets: int
) -> None:
    """The changelog records and checkpoint of a commit (Commits.on_commit_initiated) with each GPU's state encoded
    once (``encoding_once``) are byte for byte those encoded twice, commit after commit over a fleet's run."""
    monkeypatch.setattr("streams.state.time.time", lambda: 1_700_000_000.0)  # the checkpoint's saved_at
    events = _events()
    once, once_log = _writing(tmp_path, "once", writer_id="w", buckets=buckets)
    twice, twice_log = _writing(tmp_path, "twice", writer_id="w", buckets=buckets)
    once.assigned = twice.assigned = {0}
    commits = 0
    for start in range(0, len(events), 400):
        _replay(once, events, start, start + 400)
        _replay(twice, events, start, start + 400)
        with once.encoding_once():
            once.publish_changelog()
            once.prepare_checkpoint()
        twice.publish_changelog()
        twice.prepare_checkpoint()
        assert once._prepared == twice._prepared and once._prepared is not None
        commits += 1
    assert once_log == twice_log and len(once_log) >= commits
    assert msgspec.json.decode(once._prepared)["stage1"]["gpus"].keys() == set(once.stage1.gpus)

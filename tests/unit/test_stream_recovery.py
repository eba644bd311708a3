"""Window-closing rule under cross-topic skew, stage-1 checkpoints and stage-2 dedup across restarts (no broker)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from records import job_event
from test_streams import BASE, feed, observations, scenario

from config import Settings
from events import encode
from streams.app import create_app
from streams.checkpoint import TopicPartition
from streams.stage1 import LateEvent, SavedStage1, Stage1
from streams.stage2 import Stage2
from streams.windows import GpuState, Job, close_limit, lifecycle_wait_s


# ------------------------------------------------------------------ the closing rule (pure)
def test_close_limit_waits_for_lifecycle_while_progress_is_due() -> None:
    def limit(metrics_wm: float, lifecycle_wm: float | None, progress_due: bool, pending: bool = False) -> float:
        return close_limit(metrics_wm, lifecycle_wm, lifecycle_wait_s(pending, progress_due, 120.0, 600.0, 3600.0), 5.0)

    # a job reports progress: metrics 500 s ahead of the lifecycle stream still wait for it
    assert limit(1000.0, 500.0, True) == 495.0
    # nobody reports progress (black box, idle): metrics wait only hold_s
    assert limit(1000.0, 500.0, False) == 875.0
    # lifecycle ahead of metrics: metrics decide either way
    assert limit(100.0, 500.0, True) == limit(100.0, 500.0, False) == limit(100.0, 500.0, False, pending=True) == 95.0
    # a reporter silent beyond the cap: memory stays bounded
    assert limit(10_000.0, 100.0, True) == 10_000.0 - 600.0 - 5.0
    # no lifecycle event at all yet
    assert limit(1000.0, None, False) == 875.0
    # the lifecycle partition has records not applied yet: metrics 900 s ahead still wait for them, up to backlog_hold_s
    assert limit(1900.0, 1000.0, False, pending=True) == limit(1900.0, 1000.0, True, pending=True) == 995.0
    assert limit(1000.0, None, False, pending=True) == 1000.0 - 3600.0 - 5.0
    assert limit(10_000.0, 100.0, True, pending=True) == 10_000.0 - 3600.0 - 5.0


def test_awaits_progress_only_for_running_jobs_that_reported_progress() -> None:
    st = GpuState(jobs={"a": Job("resnet", start=0.0)})
    assert not st.awaits_progress()  # black box so far
    st.jobs["a"].add_progress(5.0, 10, 0.1)
    assert st.awaits_progress()
    st.jobs["a"].end = 50.0
    st.finished(st.jobs["a"])
    assert st.awaits_progress(100.0, 600.0)  # its successor's started may still be on its way
    assert not st.awaits_progress(700.0, 600.0)  # long finished: idle, the short hold applies


def test_metrics_far_ahead_of_lifecycle_close_no_window_early() -> None:
    """Reading a backlog, faust may hand over minutes of metrics before the lifecycle events of that time."""
    evs = scenario(solo_s=200, co_s=400)
    metrics = [e for e in evs if hasattr(e, "power_w")]
    lifecycle = [e for e in evs if not hasattr(e, "power_w")]
    reference = feed(Stage1(window_s=10.0, lateness_s=2.0), evs)
    assert reference
    skewed = Stage1(window_s=10.0, lateness_s=2.0, hold_s=120.0, progress_hold_s=600.0)
    # both jobs' first events, then 300 s of metrics (far beyond hold_s), then everything else in time order
    head = [e for e in lifecycle if e.ts < BASE + 1.0]
    ahead = [e for e in metrics if e.ts < BASE + 300]
    rest = sorted([e for e in evs if e not in head and e not in ahead], key=lambda e: e.ts)
    got = feed(skewed, head + ahead + rest)  # would raise LateEvent with the old 120 s hold
    key = lambda o: o.observation_id  # noqa: E731
    assert sorted(got, key=key) == sorted(reference, key=key)
    assert skewed.counters["late_lifecycle"] == 0


def test_without_progress_reports_the_short_hold_still_applies() -> None:
    st = Stage1(window_s=10.0, lateness_s=2.0, hold_s=30.0, progress_hold_s=600.0)
    from records import sample

    st.on_job(job_event("started", ts=BASE, job_id="bb", job_type="resnet"))
    for i in range(100):
        st.on_metric(sample(ts=BASE + i, seq=i))
    with pytest.raises(LateEvent):  # a black-box job's windows did not wait beyond hold_s
        st.on_job(job_event("started", ts=BASE + 20, job_id="late", job_type="lm"))


def test_metrics_read_before_any_lifecycle_wait_while_the_lifecycle_partition_is_behind() -> None:
    """Reading a backlog, faust may hand over a whole metrics partition before its lifecycle partition.

    Without lifecycle events the short hold applies, so windows closed without their jobs and the
    lifecycle events that followed were dead-lettered as late (thousands in the stage-1 bench).  The
    worker knows the lifecycle partition has unread records and says so: windows then wait, here for 1,200 s of
    metrics read ahead, beyond ``progress_hold_s`` (a full-speed backlog of 1,800 s was read with its lifecycle
    partition 57 % behind).
    """
    evs = scenario(solo_s=200, co_s=1000)
    metrics = [e for e in evs if hasattr(e, "power_w")]
    lifecycle = [e for e in evs if not hasattr(e, "power_w")]
    key = lambda o: o.observation_id  # noqa: E731
    reference = sorted(feed(Stage1(window_s=10.0, lateness_s=2.0), evs), key=key)
    assert reference

    def skewed(pending: bool) -> tuple[list, Stage1]:
        st = Stage1(window_s=10.0, lateness_s=2.0, hold_s=120.0, progress_hold_s=600.0)
        out = [o for e in metrics for o in st.on_metric(e, lifecycle_pending=pending)]
        late = 0
        for i, e in enumerate(lifecycle):  # the partition is behind until its last record is applied
            try:
                out += st.on_job(e, lifecycle_pending=pending and i < len(lifecycle) - 1)
            except LateEvent:
                late += 1
        return sorted(out, key=key), st

    got, st = skewed(True)
    assert got == reference and st.counters["late_lifecycle"] == 0
    lost, st = skewed(False)  # what happened before the rule
    assert st.counters["late_lifecycle"] > 0 and len(lost) < len(reference)


def test_worker_marks_lifecycle_partitions_with_unapplied_records(tmp_path: Path) -> None:
    streams = create_app(Settings(topic_prefix="unit.", state_dir=str(tmp_path)), web=False)
    highwater = {0: 10, 1: 10, 2: 0}  # partition 3 not fetched yet, 4 read by another worker

    class Consumer:
        def highwater(self, tp: Any) -> int | None:
            assert tp.topic == "unit.jobs.lifecycle"
            return highwater.get(tp.partition)

        def assignment(self) -> set[Any]:
            return {streams.names.tp("jobs.lifecycle", p)[0] for p in range(4)}

    streams.app._consumer = Consumer()  # type: ignore[assignment]
    for topic, partition, offset in (("jobs.lifecycle", 0, 9), ("jobs.lifecycle", 1, 4), ("gpu.metrics", 2, 100)):
        streams.state.offsets.store(TopicPartition(topic, partition), offset)
    pending = [p for p in range(5) if streams.inputs.lifecycle_pending(p)]
    assert pending == [1, 3]  # 0 caught up, 1 behind, 2 empty, 3 unknown; 4 not read here: not waited for


# ------------------------------------------------------------------ checkpoints and replays
def test_stage1_restored_from_a_checkpoint_dedupes_the_replay() -> None:
    """Crash after a checkpoint: the events since the committed offset are read again; the result is unchanged."""
    evs = scenario()
    reference = Stage1(window_s=10.0, lateness_s=2.0)
    expected = feed(reference, evs)
    first = Stage1(window_s=10.0, lateness_s=2.0)
    cut, crash = len(evs) // 3, 2 * len(evs) // 3
    got = feed(first, evs[:cut])
    saved = msgspec.json.decode(
        msgspec.json.encode(first.to_state()), type=SavedStage1
    )  # checkpoint, then offsets committed at `cut`
    feed(first, evs[cut:crash])  # processed (observations published) but not committed: lost with the process
    emitted_before_crash = got
    second = Stage1(window_s=10.0, lateness_s=2.0)
    second.restore(saved)
    replayed = feed(second, evs[cut:])  # from the committed offset
    key = lambda o: o.observation_id  # noqa: E731
    assert sorted(emitted_before_crash + replayed, key=key) == sorted(expected, key=key)
    assert second.profiles.to_dict() == reference.profiles.to_dict()  # solo profiles came back with the checkpoint


class _Message:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset


class _Event:
    def __init__(self, topic: str, offset: int, value: bytes) -> None:
        self.message = _Message(topic, 0, offset)
        self.value = value


def _events(streams: Any, evs: list) -> list[_Event]:
    """The scenario as one partition per topic, with offsets."""
    offsets = {True: 0, False: 0}
    out = []
    for e in evs:
        is_metric = hasattr(e, "power_w")
        out.append(_Event(streams.topics.metrics if is_metric else streams.topics.lifecycle, offsets[is_metric], encode(e)))
        offsets[is_metric] += 1
    return out


def test_events_already_in_the_checkpoint_are_replays_not_dead_letters(tmp_path: Path) -> None:
    """The checkpoint may hold events beyond the committed offsets (a batch in progress): read again, they are dropped."""
    settings = Settings(topic_prefix="unit.", window_s=10.0, lateness_s=2.0, state_dir=str(tmp_path))
    one = create_app(settings, web=False)
    events = _events(one, scenario())
    expected = [o for e in events for o in one.inputs.handle_input(e)[0]]
    reference = Stage1(window_s=10.0, lateness_s=2.0, every_window=True)  # the worker tells stage 2 of solo windows
    assert sorted(expected, key=lambda o: o.observation_id) == sorted(feed(reference, scenario()), key=lambda o: o.observation_id)
    one.state.checkpoint()  # every event applied; suppose the commit covered only the first half
    two = create_app(settings, web=False)
    again = [two.inputs.handle_input(e) for e in events[len(events) // 2 :]]
    assert all(error is None for _obs, error in again), [error for _obs, error in again if error][:3]
    assert not [o for obs, _ in again for o in obs]  # nothing emitted twice
    c = two.stage1.counters
    assert c["duplicate_metrics"] > 0 and c["duplicate_lifecycle"] + c["replayed_late"] > 0
    # past the replayed offsets, a late event is a dead letter again
    late = _Event(two.topics.lifecycle, 10**6, encode(job_event("progress", ts=BASE + 1.0, job_id="GPU-A-a", gpu_uuid="GPU-A")))
    assert "late" in (two.inputs.handle_input(late)[1] or "")


def test_worker_checkpoint_file_restores_windows_and_profiles(tmp_path: Path) -> None:
    settings = Settings(topic_prefix="unit.", window_s=10.0, lateness_s=2.0, state_dir=str(tmp_path))
    one = create_app(settings, web=False)
    evs = scenario()
    feed(one.stage1, evs[: len(evs) // 2])
    one.state.gpu_partition["GPU-A"] = 2
    one.state.checkpoint()
    assert (tmp_path / "stage1.json").exists() and not (tmp_path / "stage1.json.tmp").exists()
    two = create_app(settings, web=False)
    assert two.stage1.to_state() == one.stage1.to_state()
    assert len(two.stage1.profiles) == 1 and two.state.gpu_partition == {"GPU-A": 2}
    # a partition moved to another worker: its GPUs start afresh there and are forgotten here

    class TP:
        def __init__(self, topic: str, partition: int) -> None:
            self.topic, self.partition = topic, partition

    # a restarted worker's first assignment may be partial (the killed member still counts): keep what it restored
    two.on_partitions_assigned(None, {TP(two.topics.metrics, 0), TP(two.topics.lifecycle, 0)})
    assert "GPU-A" in two.stage1.gpus
    two.on_partitions_assigned(None, {TP(two.topics.metrics, p) for p in range(4)})
    assert "GPU-A" in two.stage1.gpus
    # a partition this process held moved to another worker: its GPUs start afresh there and are forgotten here
    two.on_partitions_assigned(None, {TP(two.topics.metrics, 0), TP(two.topics.lifecycle, 0)})
    assert "GPU-A" not in two.stage1.gpus and len(two.stage1.profiles) == 1


def test_a_damaged_checkpoint_starts_afresh(tmp_path: Path) -> None:
    (tmp_path / "stage1.json").write_bytes(b"{half")
    streams = create_app(Settings(topic_prefix="unit.", state_dir=str(tmp_path)), web=False)
    assert streams.stage1.gpus == {}


def test_stage2_does_not_learn_a_replayed_observation_twice_after_a_restart(tmp_path: Path) -> None:
    obs = observations(10)
    one = Stage2(state_dir=tmp_path)
    for o in obs:
        one.on_observation(o)
    one.save()
    two = Stage2(state_dir=tmp_path)
    for o in obs:  # the observations topic read again from an older committed offset
        two.on_observation(o)
    assert two.counters["duplicates"] == len(obs) and two.counters["observations"] == 0


def test_static_group_membership_id_is_stable_per_host_and_state_dir(tmp_path: Path) -> None:
    """A worker restarted with the same state directory rejoins as the same member (no wait for its old session)."""
    from streams.app import app_config, group_instance_id

    one = Settings(state_dir=str(tmp_path / "a"))
    assert group_instance_id(one) == group_instance_id(Settings(state_dir=str(tmp_path / "a" / ".." / "a")))
    assert group_instance_id(one) != group_instance_id(Settings(state_dir=str(tmp_path / "b")))
    assert app_config(one, web=False)["consumer_group_instance_id"] == group_instance_id(one)
    assert group_instance_id(Settings(state_dir=str(tmp_path), group_instance_id="worker-7")) == "worker-7"
    assert group_instance_id(Settings(state_dir=str(tmp_path), group_instance_id="none")) is None


def test_worker_monitor_checkpoints_before_a_commit_and_the_worker_has_no_spinner(tmp_path: Path) -> None:
    """faust calls the monitor's on_commit_initiated right before it computes the offsets to commit: it takes the
    checkpoint then, and the producer's flush (guarded: tests/unit/test_stream_outputs.py) writes it once every
    output is acknowledged."""
    import logging

    from streams.app import WorkerMonitor, faust_worker

    streams = create_app(Settings(topic_prefix="unit.", state_dir=str(tmp_path)), web=False)
    assert isinstance(streams.app.monitor, WorkerMonitor)
    feed(streams.stage1, scenario()[:200])
    streams.app.monitor.on_commit_initiated(None)
    assert streams.app.producer.aip_deliveries is streams.deliveries  # the flush waits for every output
    assert not (tmp_path / "stage1.json").exists()  # taken, not written before the outputs are acknowledged
    assert streams.state.write_prepared()
    assert json.loads((tmp_path / "stage1.json").read_bytes())["stage1"]["gpus"]
    # faust's own Worker sets the root logger to DEBUG for its spinner and keeps it there
    worker = faust_worker(streams.app, "warn")
    assert worker.spinner is None
    root = logging.getLogger()
    level = root.level
    worker.on_setup_root_logger(root, logging.WARNING)
    assert root.level == level


@pytest.mark.parametrize("wait_s, expected_ms", [(0.25, 250), (1.5, 1500)])
def test_a_workers_consumer_fetches_with_the_configured_wait(tmp_path: Path, wait_s: float, expected_ms: int) -> None:
    """faust fixes the fetch wait at 1.5 s; the worker's consumer uses the setting (read by aiokafka at start)."""
    import asyncio

    streams = create_app(Settings(topic_prefix="unit.", state_dir=str(tmp_path), fetch_max_wait_s=wait_s), web=False)

    async def created() -> int:
        thread = streams.app.consumer._thread
        return int(thread._create_worker_consumer(streams.app.transport)._fetch_max_wait_ms)

    assert asyncio.run(created()) == expected_ms


def test_offsets_that_never_reached_stage_1_are_counted(tmp_path: Path) -> None:
    """Input topics have no gaps of their own: an offset beyond the last applied plus one means records between were
    lost on the way (counted, the range logged); a replay (an offset not beyond) and a partition's first record are
    not."""
    settings = Settings(topic_prefix="unit.", window_s=10.0, lateness_s=2.0, state_dir=str(tmp_path))
    app = create_app(settings, web=False)
    events = [e for e in _events(app, scenario()) if e.message.topic == app.topics.metrics][:40]
    for e in events[:10] + events[25:30] + events[5:8]:  # 10-24 never delivered; 5-7 delivered again
        app.inputs.handle_input(e)
    assert app.stage1.counters["input_offsets_skipped"] == 15

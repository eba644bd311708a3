"""One ``aip worker`` on the embedded broker, shared by the tests of this module.

Each test uses its own GPU model (environment) and GPUs, so solo profiles and
models never mix between tests.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import wait_for, worker_settings
from records import job_event, sample

from aip.faults.scenarios import produce_records
from aip.faults.worker import WorkerProcess, metric_values
from events import encode

pytestmark = pytest.mark.integration
START_TS = 1_700_000_000.0


@pytest.fixture(scope="module")
def worker(broker: Any, tmp_path_factory: Any) -> Iterator[WorkerProcess]:
    from aip.broker import free_port

    tmp = tmp_path_factory.mktemp("worker")
    settings = worker_settings(broker, tmp, "w")
    w = WorkerProcess(settings, free_port(), tmp / "worker.log").start()
    try:
        wait_for(w.ready, timeout_s=60, what="the worker's web server")  # raises with the log if it died
        yield w
    finally:
        assert w.stop(60) in (0, -15), w.log_tail()


def consume(settings: Any, topic: str, until: Any, timeout_s: float = 60.0, then_quiet_s: float = 0.0) -> list[Any]:
    """``topic``'s records from the beginning, read until ``until(items)`` holds (or ``timeout_s``); with
    ``then_quiet_s``, read on until a poll that long brings nothing (what arrives after the count is there too)."""
    from transport import RecordConsumer

    with RecordConsumer(settings, [topic], from_beginning=True) as c:
        items: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            items.extend(c.poll(timeout_s=0.5))
            if until(items):
                while then_quiet_s and (more := c.poll(timeout_s=then_quiet_s)):
                    items.extend(more)
                return items
        return items


def consumed(worker: WorkerProcess) -> dict[str, float]:
    """Records the worker has read from each input topic."""
    page = worker.get("/metrics")
    return {t: sum(metric_values(page, "aip_stream_consumed_records_total", topic=t)) for t in ("gpu.metrics", "jobs.lifecycle")}


def consumed_when_caught_up(worker: WorkerProcess) -> dict[str, float]:
    """:func:`consumed`, once the worker has read all there is of both input topics (no lag, the counts unchanged a
    second later): a test before may have left it reading the last records of its run."""
    last: dict[str, float] = {}

    def caught_up() -> bool:
        nonlocal last
        page = worker.get("/metrics")
        lag = sum(sum(metric_values(page, "aip_stream_consumer_lag_records", topic=t)) for t in ("gpu.metrics", "jobs.lifecycle"))
        now = consumed(worker)
        done = lag == 0 and now == last
        last = now
        return done

    wait_for(caught_up, timeout_s=60, interval_s=1.0, what="the worker to read all of both input topics")
    return last


def dead_letters_counted(worker: WorkerProcess) -> float:
    """Every dead letter the worker has sent, whatever the reason."""
    return sum(metric_values(worker.get("/metrics"), "aip_stream_deadletters_total"))


def test_measured_interference_matches_simulator_ground_truth(worker: WorkerProcess) -> None:
    from producers.sim import Simulator

    sim = Simulator(gpus=4, gpu_model="v100", seed=3, start_ts=START_TS, duration_s=1200)
    truth = sim.ground_truth
    produce_records(worker.settings, sim.events())

    def enough(items: list[Any]) -> bool:
        return (
            sum(
                1
                for i in items
                if i.record is not None and i.record.environment == "v100" and i.record.interference_pct is not None
            )
            >= 40
        )

    items = consume(worker.settings, "interference.observations", enough)
    obs = [i.record for i in items if i.record is not None and i.record.environment == "v100"]
    measured = [o for o in obs if o.interference_pct is not None]
    assert len(measured) >= 40, Counter(i.error for i in items)
    errors = []
    for o in measured:
        rows = [
            r
            for r in truth
            if r["gpu_uuid"] == o.gpu_uuid
            and r["job_id"] == o.job_id
            and r["start_ts"] <= o.window_start
            and o.window_end <= r["end_ts"]
        ]
        assert len(rows) == 1, (o, rows)
        assert sorted(o.co_job_ids) == sorted(rows[0]["co_job_ids"])
        errors.append(abs(o.interference_pct - rows[0]["interference_pct"]))
    assert max(errors) <= 2.0, sorted(errors)[-5:]

    # stage 2 predicted and published a leaderboard; the web views serve them
    preds = consume(worker.settings, "interference.predictions", lambda items: len(items) > 0)
    assert preds and all(p.error is None for p in preds)
    gpu = preds[-1].record.gpu_uuid
    assert wait_for(lambda: worker.get(f"/predictions/{gpu}")["jobs"], what="predictions view")
    assert "v100" in worker.get("/leaderboard")
    wanted = (
        ("aip_stream_consumed_records_total", {"topic": "gpu.metrics"}),
        ("aip_stream_consumed_records_total", {"topic": "jobs.lifecycle"}),
        ("aip_stream_published_records_total", {"topic": "predictions"}),
        ("aip_observations_total", {"environment": "v100"}),
        ("aip_model_mae_points", {"category": "all", "environment": "v100"}),
        ("aip_model_selected_info", {"category": "all", "environment": "v100", "mode": "observed"}),
        ("aip_stream_consumer_lag_records", {"topic": "gpu.metrics"}),
    )

    def missing() -> list[str]:  # a selection needs min_samples scored observations: stage 2 may still be on its way
        page = worker.get("/metrics")
        return [f"{name}{labels}" for name, labels in wanted if not metric_values(page, name, **labels)]

    wait_for(lambda: not missing(), what="every series on /metrics")
    assert missing() == []
    page = worker.get("/metrics")  # every prediction published is timed once, from its window's end
    published = metric_values(page, "aip_stream_published_records_total", topic="predictions")
    assert metric_values(page, "aip_stream_prediction_delay_seconds_count") == published
    assert metric_values(page, "aip_stream_prediction_delay_seconds_bucket", le="+Inf") == published
    # the worker tuned its garbage collector at its start (streams.garbage.tune: one full collection, timed)
    assert metric_values(page, "aip_worker_gc_collections_total", generation="2")[0] >= 1
    assert metric_values(page, "aip_worker_gc_seconds_total", generation="2")[0] > 0


def test_full_speed_replay_gives_the_paced_observations(worker: WorkerProcess) -> None:
    """The worker consumes a burst; the reference is stage 1 fed one event at a time in time order (real time)."""
    from producers.sim import Simulator
    from streams.stage1 import Stage1

    def events() -> Any:
        return Simulator(gpus=1, gpu_model="k80", seed=11, start_ts=START_TS, duration_s=900).events()

    s = worker.settings
    reference = Stage1.from_settings(s, every_window=True)
    expected = []
    for topic, record in events():
        expected.extend(reference.on_metric(record) if topic == "gpu.metrics" else reference.on_job(record))
    assert len(expected) >= 5
    produce_records(s, events())
    items = consume(
        s,
        "interference.observations",
        lambda items: sum(1 for i in items if i.record and i.record.environment == "k80") >= len(expected),
    )
    got = [i.record for i in items if i.record is not None and i.record.environment == "k80"]
    assert sorted(got, key=lambda o: o.observation_id) == sorted(expected, key=lambda o: o.observation_id)


def test_bad_records_are_dead_lettered_exactly_and_the_worker_keeps_going(worker: WorkerProcess) -> None:
    from transport import RecordProducer

    s = worker.settings
    gpu = f"GPU-bad-{uuid.uuid4().hex[:6]}"
    good = sample(ts=START_TS + 5000, gpu_uuid=gpu, gpu_model="p100")
    bad_metrics = [
        b"{not json",
        encode(good).replace(b'"sm_util_pct":70.0', b'"sm_util_pct":150.0'),  # out of range
        encode(good).replace(b'"power_w":150.0', b'"power_w":-5.0'),
        encode(good).replace(b'"schema_version":1', b'"schema_version":99'),
        None,  # tombstone
    ]
    ev = job_event("progress", ts=START_TS + 5000, gpu_uuid=gpu, job_id="bad-job")
    bad_lifecycle = [
        encode(ev).replace(b'"progress"', b'"exploded"'),
        encode(ev).replace(b'"step_time_s":0.1', b'"step_time_s":null'),  # progress without step time
        b"[]",
    ]
    consumed_before = consumed_when_caught_up(worker)
    counted_before = dead_letters_counted(worker)
    with RecordProducer(s) as p:  # keyed by GPU, as producers before host batches
        p.send("gpu.metrics", good, key=gpu)
        for value in bad_metrics:
            p.send_raw("gpu.metrics", value, key=gpu.encode())
        for value in bad_lifecycle:
            p.send_raw("jobs.lifecycle", value, key=gpu.encode())
        # late: far behind the watermark of this GPU once it moved on
        p.send("gpu.metrics", sample(ts=START_TS + 6000, gpu_uuid=gpu, gpu_model="p100", seq=1), key=gpu)
        p.send("jobs.lifecycle", job_event("started", ts=START_TS + 6000, gpu_uuid=gpu, job_id="late-job"), key=gpu)
        p.flush(10)
        p.send("gpu.metrics", sample(ts=START_TS + 5001, gpu_uuid=gpu, gpu_model="p100", seq=2), key=gpu)
        p.flush(10)
    expected = len(bad_metrics) + len(bad_lifecycle) + 1
    # the worker counts each dead letter as it sends it: wait for all of them, then for the topic to hold them
    wait_for(lambda: dead_letters_counted(worker) >= counted_before + expected, timeout_s=60, what="the dead letters")

    def mine(items: list[Any]) -> list[Any]:
        return [i.record for i in items if i.record is not None and i.record.key == gpu]

    letters = mine(consume(s, "aip.deadletter", lambda items: len(mine(items)) >= expected, then_quiet_s=1.0))
    assert dead_letters_counted(worker) == counted_before + expected  # and no more
    # each rejected record's own reason, in the order sent (one partition of each topic: keyed by the GPU)
    reasons = [(d.source_topic, d.error) for d in sorted(letters, key=lambda d: (d.source_topic, d.offset))]
    assert reasons == [
        ("gpu.metrics", "invalid gpu.metrics record: not valid JSON: JSON is malformed: object keys must be strings (byte 1)"),
        ("gpu.metrics", "invalid gpu.metrics record: Expected `float` <= 100.0 - at `$.sm_util_pct`"),
        ("gpu.metrics", "invalid gpu.metrics record: Expected `float` >= 0.0 - at `$.power_w`"),
        ("gpu.metrics", "invalid gpu.metrics record: Invalid enum value 99 - at `$.schema_version`"),
        ("gpu.metrics", "invalid gpu.metrics record: empty message (null value)"),
        ("gpu.metrics", "late: event time 1700005001.000 is 989.000 s before the first open window (lateness 5 s)"),
        ("jobs.lifecycle", "invalid jobs.lifecycle record: Invalid enum value 'exploded' - at `$.kind`"),
        ("jobs.lifecycle", "invalid jobs.lifecycle record: progress: steps and step_time_s are required"),
        ("jobs.lifecycle", "invalid jobs.lifecycle record: Expected `object`, got `array`"),
    ]
    assert all(d.partition >= 0 and d.offset >= 0 and d.stage == "stage1" for d in letters)
    assert worker.proc.poll() is None
    # it kept going: every record of both topics read, good and bad
    assert consumed(worker) == {
        t: consumed_before[t] + n for t, n in (("gpu.metrics", len(bad_metrics) + 3), ("jobs.lifecycle", len(bad_lifecycle) + 1))
    }
    metrics = worker.get("/metrics")
    for reason in ("undecodable", "invalid_record", "late"):
        assert metric_values(metrics, "aip_stream_deadletters_total", reason=reason), reason


def test_host_batches_and_an_older_per_gpu_producer_feed_one_worker(worker: WorkerProcess) -> None:
    """A host-batched fleet (samples and job events; one bad sample added to one batch, one bad event to another)
    and a fleet sent the old way (per-GPU records keyed by GPU) on one worker: every window of both yields the
    observation a reference stage 1 finds, and the bad sample and the bad event alone are dead-lettered, each with
    its own JSON as the payload."""
    import base64
    import json

    from events import HostJobEvents, HostMetrics
    from producers.batching import host_batches
    from producers.sim import Simulator
    from streams.stage1 import Stage1
    from transport import RecordProducer

    t0 = START_TS + 20_000
    new = list(Simulator(gpus=6, gpu_model="p100", seed=21, start_ts=t0, duration_s=600, gpus_per_host=3).events())
    old = list(Simulator(gpus=2, gpu_model="p100", seed=22, start_ts=t0, duration_s=600).events())
    s = worker.settings
    reference = Stage1.from_settings(s, every_window=True)
    expected = set()
    for topic, record in sorted(new + old, key=lambda e: e[1].ts):
        out = reference.on_metric(record) if topic == "gpu.metrics" else reference.on_job(record)
        expected |= {o.observation_id for o in out}
    gpus = {r.gpu_uuid for _t, r in new + old}
    assert len(expected) >= 20 and {o.split("|")[0] for o in expected} == gpus

    batched = list(host_batches(new))
    assert {type(r) for t, r in batched if t == "gpu.metrics"} == {HostMetrics}
    assert {type(r) for t, r in batched if t == "jobs.lifecycle"} == {HostJobEvents}
    i, spoilt = next((i, r) for i, (t, r) in enumerate(batched) if t == "gpu.metrics" and r.ts > t0 + 100)
    body = json.loads(encode(spoilt))
    bad = {**body["samples"][0], "gpu_uuid": "GPU-not-there", "sm_util_pct": 150.0}
    body["samples"].insert(1, bad)
    # and one invalid job event in a batch of job events
    j, spoilt_jobs = next((j, r) for j, (t, r) in enumerate(batched) if t == "jobs.lifecycle" and r.ts > t0 + 200)
    jobs_body = json.loads(encode(spoilt_jobs))
    bad_event = {**jobs_body["events"][0], "job_id": "job-not-there", "ts": 12.0}
    jobs_body["events"].append(bad_event)
    counted_before = dead_letters_counted(worker)
    with RecordProducer(s) as p:
        for k, (topic, record) in enumerate(batched):
            if k == i:
                p.send_raw(topic, json.dumps(body).encode(), key=spoilt.host.encode())
            elif k == j:
                p.send_raw(topic, json.dumps(jobs_body).encode(), key=spoilt_jobs.host.encode())
            else:
                p.send(topic, record)
        for topic, record in old:
            p.send(topic, record, key=record.gpu_uuid)
        p.flush(30)

    def mine(items: list[Any]) -> set[str]:
        return {i.record.observation_id for i in items if i.record is not None and i.record.gpu_uuid in gpus}

    items = consume(s, "interference.observations", lambda items: mine(items) >= expected, timeout_s=90)
    assert mine(items) == expected

    def ours(items: list[Any]) -> list[Any]:
        return [i.record for i in items if i.record is not None and i.record.key in (spoilt.host, spoilt_jobs.host)]

    letters = ours(consume(s, "aip.deadletter", lambda items: len(ours(items)) >= 2, then_quiet_s=1.0))
    by_source = {d.source_topic: d for d in letters}
    assert len(letters) == 2 and set(by_source) == {"gpu.metrics", "jobs.lifecycle"}, [d.error for d in letters]
    assert json.loads(base64.b64decode(by_source["gpu.metrics"].payload_b64)) == bad
    assert by_source["gpu.metrics"].error == (
        "invalid gpu.metrics record: samples[1]: Expected `float` <= 100.0 - at `$.sm_util_pct`"
    )
    assert json.loads(base64.b64decode(by_source["jobs.lifecycle"].payload_b64)) == bad_event
    n = len(jobs_body["events"]) - 1
    assert by_source["jobs.lifecycle"].error == (
        f"invalid jobs.lifecycle record: events[{n}]: Expected `float` >= 946684800.0 - at `$.ts`"
    )
    assert dead_letters_counted(worker) == counted_before + 2  # the worker sent these two and no other

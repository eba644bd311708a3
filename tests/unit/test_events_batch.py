"""Host batches (HostMetrics, HostJobEvents): decoding, invalid input, and compatibility with single records."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from records import job_event, records_of, sample

from events import (
    HostJobEvents,
    HostMetrics,
    JobEvent,
    MetricSample,
    RecordError,
    decode,
    decode_on_topic,
    encode,
    job_events,
    metric_samples,
)
from events.topics import LIFECYCLE, METRICS
from producers.batching import host_batches, per_gpu
from producers.sim import Simulator


def batch_bytes(*samples: MetricSample, host: str = "host-a", **envelope: object) -> bytes:
    body = {"ts": samples[0].ts if samples else 1.7e9, "host": host, "samples": [json.loads(encode(s)) for s in samples]}
    return json.dumps({**body, **envelope}).encode()


def test_a_batch_decodes_into_its_per_gpu_samples() -> None:
    a, b = sample(gpu_uuid="GPU-a", gpu_index=0), sample(gpu_uuid="GPU-b", gpu_index=1, seq=5)
    record = HostMetrics(ts=b.ts, host="host-a", samples=[a, b], producer_id="p")
    out = metric_samples(encode(record))
    assert out.batched and out.rejected == [] and out.samples == [a, b]
    assert decode(HostMetrics, encode(record)) == record
    assert decode_on_topic(MetricSample, encode(record)) == record


def test_a_per_gpu_record_reads_as_before() -> None:
    one = sample()
    out = metric_samples(encode(one))
    assert out == ([one], [], False)
    assert decode_on_topic(MetricSample, encode(one)) == one
    extra = json.dumps({**json.loads(encode(one)), "samples": 3}).encode()  # an unknown field named like the batch's
    assert metric_samples(extra) == ([one], [], False)
    assert decode_on_topic(MetricSample, extra) == one


def test_one_invalid_sample_is_rejected_alone_with_its_payload_and_reason() -> None:
    good = [sample(gpu_uuid=f"GPU-{i}", gpu_index=i) for i in range(3)]
    body = json.loads(batch_bytes(*good))
    body["samples"][1]["sm_util_pct"] = 120.0
    body["samples"].append({"gpu_uuid": "GPU-x"})  # not a sample at all
    body["samples"].append(json.loads(encode(sample(gpu_uuid="GPU-y", host="host-b"))))  # another host's sample
    out = metric_samples(json.dumps(body).encode())
    assert out.batched and out.samples == [good[0], good[2]]
    assert [json.loads(r.payload) for r in out.rejected] == body["samples"][1:2] + body["samples"][3:]
    reasons = [r.error for r in out.rejected]
    assert reasons[0] == "samples[1]: Expected `float` <= 100.0 - at `$.sm_util_pct`"
    assert reasons[1].startswith("samples[3]: Object missing required field")
    assert reasons[2] == "samples[4]: host 'host-b' is not the batch's host 'host-a'"
    with pytest.raises(RecordError, match="sm_util_pct"):  # read whole (aip tail), a batch fails on any sample
        decode_on_topic(MetricSample, json.dumps(body).encode())


@pytest.mark.parametrize(
    "envelope, reason",
    [
        ({"host": None}, "Expected `str`, got `null` - at `$.host`"),
        ({"samples": []}, "Expected `array` of length >= 1 - at `$.samples`"),
        ({"samples": "GPU-1"}, "Expected `array`, got `str` - at `$.samples`"),
        ({"ts": 12.0}, "Expected `float` >= 946684800.0 - at `$.ts`"),
        ({"schema_version": 2}, "Invalid enum value 2 - at `$.schema_version`"),
    ],
)
def test_an_invalid_envelope_rejects_the_whole_record(envelope: dict[str, object], reason: str) -> None:
    with pytest.raises(RecordError) as err:
        metric_samples(batch_bytes(sample(), **envelope))
    assert str(err.value) == reason


def test_undecodable_input_is_a_record_error() -> None:
    for raw, reason in [(None, "empty message"), (b'{"samples": [', "not valid JSON"), (b"[]", "Expected `object`")]:
        with pytest.raises(RecordError, match=reason):
            metric_samples(raw)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=200) | st.builds(lambda b: b'{"samples": ' + b, st.binary(max_size=100)))
def test_arbitrary_bytes_raise_only_record_error(raw: bytes) -> None:
    try:
        metric_samples(raw)
    except RecordError:
        pass


@settings(max_examples=60, deadline=None)
@given(batch=records_of(HostMetrics))
def test_every_valid_batch_round_trips(batch: HostMetrics) -> None:
    assert metric_samples(encode(batch)) == (batch.samples, [], True)


def test_a_batch_of_another_hosts_sample_cannot_be_built() -> None:
    with pytest.raises(RecordError, match="samples\\[1\\]: host 'h2' is not the batch's host 'h1'"):
        HostMetrics(ts=1.7e9, host="h1", samples=[sample(host="h1"), sample(host="h2")])


def test_a_gpus_samples_and_job_events_share_the_host_key() -> None:
    s, j = sample(host="h", gpu_uuid="GPU-1"), job_event(host="h", gpu_uuid="GPU-1")
    assert s.key == j.key == HostMetrics(ts=s.ts, host="h", samples=[s]).key == "h"


def test_the_simulator_batched_per_host_and_tick_splits_back_into_its_stream() -> None:
    stream = list(Simulator(gpus=20, seed=3, start_ts=1_700_000_000.0, duration_s=30, gpus_per_host=8).events())
    batched = list(host_batches(stream))
    batches = [r for t, r in batched if t == METRICS]
    assert all(isinstance(b, HostMetrics) for b in batches)
    assert {len(b.samples) for b in batches} == {8, 4}  # hosts of 8, 8 and 4 GPUs
    assert len(batches) == 3 * 29  # one per host and tick (no samples at tick 0)
    jobs = [r for t, r in batched if t == LIFECYCLE]
    assert all(isinstance(b, HostJobEvents) for b in jobs) and max(len(b.events) for b in jobs) > 1
    events = [r for t, r in stream if t == LIFECYCLE]
    assert len(jobs) < len(events) / 2 and sum(len(b.events) for b in jobs) == len(events)
    assert list(per_gpu(batched)) == stream
    ts = [r.ts for _t, r in batched]
    assert ts == sorted(ts)  # still in time order (a batch is stamped with its latest sample)


def test_a_recorded_batch_replays_as_its_samples(tmp_path) -> None:
    from events import to_dict
    from producers import replay

    a, b = sample(gpu_uuid="GPU-a", ts=1.7e9), sample(gpu_uuid="GPU-b", ts=1.7e9 + 0.1)
    later = sample(gpu_uuid="GPU-a", ts=1.7e9 + 1, seq=1)  # recorded from an older producer: per GPU
    lines = [
        {"_topic": "gpu.metrics", **to_dict(HostMetrics(ts=b.ts, host="host-a", samples=[a, b]))},
        {"_topic": "gpu.metrics", **to_dict(later)},
        {"_topic": "gpu.metrics", **to_dict(HostMetrics(ts=b.ts, host="host-a", samples=[a])), "samples": []},
    ]
    path = tmp_path / "rec.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    records, skipped = replay.load(path)
    assert records == [(METRICS, a), (METRICS, b), (METRICS, later)] and skipped == 1
    assert [[s.gpu_uuid for s in r.samples] for _t, r in host_batches(records)] == [["GPU-a", "GPU-b"], ["GPU-a"]]


def job_batch_bytes(*events: JobEvent, host: str = "host-a", **envelope: object) -> bytes:
    body = {"ts": events[0].ts if events else 1.7e9, "host": host, "events": [json.loads(encode(e)) for e in events]}
    return json.dumps({**body, **envelope}).encode()


def test_a_job_events_batch_decodes_into_its_events_in_order() -> None:
    a = job_event("started", job_id="j1", gpu_uuid="GPU-a")
    b = job_event("progress", job_id="j1", gpu_uuid="GPU-a", seq=1)
    c = job_event("finished", job_id="j2", gpu_uuid="GPU-b")
    record = HostJobEvents(ts=c.ts, host="host-a", events=[a, b, c], producer_id="p")
    out = job_events(encode(record))
    assert out.batched and out.rejected == [] and out.events == [a, b, c]
    assert decode_on_topic(JobEvent, encode(record)) == record
    assert job_events(encode(a)) == ([a], [], False)  # a single event reads as before
    assert decode_on_topic(JobEvent, encode(a)) == a
    extra = json.dumps({**json.loads(encode(a)), "events": 3}).encode()  # an unknown field named like the batch's
    assert job_events(extra) == ([a], [], False)


def test_one_invalid_job_event_is_rejected_alone_with_its_payload_and_reason() -> None:
    good = [job_event("started", job_id=f"j{i}", gpu_uuid=f"GPU-{i}") for i in range(3)]
    body = json.loads(job_batch_bytes(*good))
    body["events"][1]["kind"] = "progress"  # progress without steps
    body["events"].append(json.loads(encode(job_event(host="host-b"))))  # another host's event
    out = job_events(json.dumps(body).encode())
    assert out.batched and out.events == [good[0], good[2]]
    assert [json.loads(r.payload) for r in out.rejected] == [body["events"][1], body["events"][3]]
    assert out.rejected[0].error.startswith("events[1]: ") and "steps" in out.rejected[0].error
    assert out.rejected[1].error == "events[3]: host 'host-b' is not the batch's host 'host-a'"
    with pytest.raises(RecordError, match="steps"):  # read whole (aip tail), a batch fails on any event
        decode_on_topic(JobEvent, json.dumps(body).encode())
    with pytest.raises(RecordError, match=re.escape("Expected `array` of length >= 1 - at `$.events`")):
        job_events(job_batch_bytes(good[0], events=[]))


@settings(max_examples=60, deadline=None)
@given(batch=records_of(HostJobEvents))
def test_every_valid_job_events_batch_round_trips(batch: HostJobEvents) -> None:
    assert job_events(encode(batch)) == (batch.events, [], True)


def test_a_recorded_job_events_batch_replays_as_its_events(tmp_path) -> None:
    from events import to_dict
    from producers import replay

    a, b = job_event("started", job_id="j1", ts=1.7e9), job_event("started", job_id="j2", gpu_uuid="GPU-b", ts=1.7e9 + 0.1)
    lines = [{"_topic": "jobs.lifecycle", **to_dict(HostJobEvents(ts=b.ts, host="host-a", events=[a, b]))}]
    path = tmp_path / "rec.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    records, skipped = replay.load(path)
    assert records == [(LIFECYCLE, a), (LIFECYCLE, b)] and skipped == 0
    assert [(t, r.events) for t, r in host_batches(records)] == [(LIFECYCLE, [a, b])]

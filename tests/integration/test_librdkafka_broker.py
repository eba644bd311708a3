"""A librdkafka client (confluent-kafka) against the embedded broker: what clients in other languages use."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import confluent_kafka as ck  # the dev extra (make setup): a missing one is an error, not a skip
import pytest
from conftest import wait_for

from events import JobEvent, Prediction, WhatIf, decode, encode

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0
# Tansu holds every JoinGroup for the group's rebalance timeout, which librdkafka sets to
# max.poll.interval.ms (default 300 s): with these the group consumer joins within seconds.
GROUP_SETTINGS = {"max.poll.interval.ms": 10000, "session.timeout.ms": 6000}


def prediction(gpu: str) -> Prediction:
    return Prediction(
        ts=T0, gpu_uuid=gpu, environment="v100", job_id=f"{gpu}-j", job_type="LM", job_set=["GAN", "LM"], mode="placement",
        interference_pct=21.5, model="knn", category="all", what_if=[WhatIf(job_type="A3C", newcomer_pct=10.0, existing_pct=4.0)],
    )  # fmt: skip


def produce_with_the_project(settings: Any, topic: str, n: int) -> list[Prediction]:
    from transport import RecordProducer

    sent = [prediction(f"GPU-{i}") for i in range(n)]
    with RecordProducer(settings) as p:
        for record in sent:
            p.send(topic, record)
        p.flush(10)
    return sent


def read(consumer: Any, n: int, timeout_s: float = 30.0) -> list[Any]:
    got: list[Any] = []

    def enough() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg)
        return len(got) >= n

    wait_for(enough, timeout_s=timeout_s, interval_s=0.0, what=f"{n} records through librdkafka")
    return got


def test_librdkafka_producer_writes_records_the_project_reads(settings: Any, topics: Any) -> None:
    from transport import RecordConsumer, ensure_topics

    name = topics.name("jobs.lifecycle")
    ensure_topics(settings, [name])
    event = JobEvent(ts=T0, kind="started", job_id="j1", job_type="LM", gpu_uuid="GPU-x", host="node-1")
    producer = ck.Producer({"bootstrap.servers": settings.broker})
    producer.produce(name, key=event.gpu_uuid.encode(), value=json.dumps(json.loads(encode(event))).encode())
    assert producer.flush(10) == 0
    with RecordConsumer(settings, ["jobs.lifecycle"], from_beginning=True) as c:
        items = c.read(until=lambda xs: len(xs) >= 1, timeout_s=20)
    assert [i.error for i in items] == [None] and items[0].record == event


def test_librdkafka_assign_reads_the_predictions(settings: Any, topics: Any) -> None:
    from transport import ensure_topics

    name = topics.name("interference.predictions")
    ensure_topics(settings, [name])
    sent = produce_with_the_project(settings, "interference.predictions", 6)
    consumer = ck.Consumer({"bootstrap.servers": settings.broker, "group.id": f"g{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(name, timeout=10).topics[name].partitions
        consumer.assign([ck.TopicPartition(name, p, ck.OFFSET_BEGINNING) for p in parts])
        got = read(consumer, len(sent))
    finally:
        consumer.close()
    assert sorted((decode(Prediction, m.value()) for m in got), key=lambda p: p.gpu_uuid) == sent
    assert {m.key().decode() for m in got} == {p.gpu_uuid for p in sent}


def test_librdkafka_group_consumer_joins_with_a_short_poll_interval(settings: Any, topics: Any) -> None:
    from transport import ensure_topics

    name = topics.name("interference.predictions")
    ensure_topics(settings, [name])
    sent = produce_with_the_project(settings, "interference.predictions", 3)
    consumer = ck.Consumer({"bootstrap.servers": settings.broker, "group.id": f"g{uuid.uuid4().hex[:8]}",
                            "auto.offset.reset": "earliest", **GROUP_SETTINGS})  # fmt: skip
    started = time.monotonic()
    try:
        consumer.subscribe([name])
        got = read(consumer, len(sent), timeout_s=60)
        print(f"librdkafka group consumer: {len(got)} records {time.monotonic() - started:.1f} s after subscribe")
        consumer.commit(asynchronous=False)
        committed = consumer.committed([ck.TopicPartition(name, m.partition()) for m in got], timeout=10)
    finally:
        consumer.close()
    assert sorted(decode(Prediction, m.value()).gpu_uuid for m in got) == sorted(p.gpu_uuid for p in sent)
    assert all(tp.offset > 0 for tp in committed)  # the group's offsets are stored

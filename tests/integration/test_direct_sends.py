"""Records handed over by :class:`streams.outputs.DirectSends` are the records faust's ``send_soon`` puts on the topic
(key, value, partition, headers), in the order given, against the real embedded broker with the worker's app."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from config import Settings
from streams.app import app_config
from streams.consumer import App
from streams.outputs import Deliveries, DirectSends
from transport.kafka import kafka_config

PARTITIONS = 4


async def _send_both(app: App, name: str, records: list[tuple[bytes, bytes, int | None]]) -> bool:
    """Each record sent twice: with faust's ``send_soon`` (value prefixed ``f:``), then by ``DirectSends``
    (``d:``); True when the commit's drain found every direct record acknowledged."""
    topic = app.topic(name, partitions=PARTITIONS, key_serializer="raw", value_serializer="raw")
    await app.producer.start()
    try:
        await topic.maybe_declare()
        await asyncio.gather(*(topic.send_soon(key=k, value=b"f:" + v, partition=p) for k, v, p in records))
        deliveries = Deliveries()
        direct = DirectSends(lambda: app.producer, deliveries)
        for k, v, p in records:
            direct.soon(name, k, b"d:" + v, p)

        async def flush() -> None:
            return None

        return await deliveries.drain(flush, lambda: 0, timeout_s=30.0)
    finally:
        await app.producer.stop()


def _read_all(settings: Settings, name: str, expected: int) -> list[Any]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**kafka_config(settings) | {"group_id": None, "enable_auto_commit": False})
    try:
        tps = [TopicPartition(name, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        deadline = time.monotonic() + 30.0
        while len(out) < expected and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=500).values():
                out.extend(messages)
        return out
    finally:
        consumer.close()


def test_direct_sends_put_the_records_faust_would_on_the_topic(broker: Any) -> None:
    settings = Settings.from_env(broker=broker.address, topic_prefix=f"ds{uuid.uuid4().hex[:8]}.", partitions=PARTITIONS)
    app = App(f"ds-{uuid.uuid4().hex[:8]}", **app_config(settings, web=False))
    name = f"{settings.topic_prefix}out"
    records: list[tuple[bytes, bytes, int | None]] = [
        (f"GPU-{i % 7}".encode(), f'{{"n":{i}}}'.encode(), None) for i in range(40)
    ] + [(b"changelog-bucket", b'{"bucket":3}', 2), (b"changelog-bucket", b'{"bucket":1}', 0)]
    assert asyncio.run(_send_both(app, name, records)) is True

    read = _read_all(settings, name, 2 * len(records))
    assert len(read) == 2 * len(records)
    by_path: dict[bytes, list[Any]] = {b"f:": [], b"d:": []}
    for m in sorted(read, key=lambda m: (m.partition, m.offset)):
        by_path[m.value[:2]].append(m)
    faust_sent = {(m.key, m.value[2:]): (m.partition, list(m.headers)) for m in by_path[b"f:"]}
    direct_sent = {(m.key, m.value[2:]): (m.partition, list(m.headers)) for m in by_path[b"d:"]}
    assert direct_sent == faust_sent  # the same partition (the worker's key partitioner) and headers for every record
    for p in range(PARTITIONS):  # in the order handed over, partition by partition
        order = [(k, v) for k, v, _ in records if faust_sent[(k, v)][0] == p]
        assert [(m.key, m.value[2:]) for m in by_path[b"d:"] if m.partition == p] == order

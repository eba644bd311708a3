"""The worker's topics decode messages without faust's codec registry (``streams.consumer.RawSchema``) and send them
to partitions from a cache of the default partitioner's answers (``streams.consumer.KeyPartitioner``): both give what
faust's and aiokafka's own give."""

from __future__ import annotations

import asyncio
import random

import faust
from aiokafka.partitioner import DefaultPartitioner
from faust.types import Message

from streams.consumer import KeyPartitioner, RawSchema


def _message(key: bytes | None, value: bytes | None) -> Message:
    return Message("t", 3, 17, 1.7e9, 0, [("h", b"v")], key, value, None)


def test_raw_schema_decodes_as_faust_raw_serializers_do() -> None:
    app = faust.App("raw-schema-test", broker="memory://", store="memory://", key_serializer="raw", value_serializer="raw")
    faust_decode = faust.Schema(key_serializer="raw", value_serializer="raw").compile(app)
    raw_decode = RawSchema().compile(app)
    cases = [(b"GPU-1", b'{"ts": 1.0}'), (None, b"x"), (b"k", None), (None, None), (b"", b"")]

    async def both(key: bytes | None, value: bytes | None) -> tuple[faust.EventT, faust.EventT]:
        m = _message(key, value)
        return await faust_decode(m), await raw_decode(m)

    for key, value in cases:
        theirs, ours = asyncio.run(both(key, value))
        assert (ours.key, ours.value, ours.headers, ours.message) == (theirs.key, theirs.value, theirs.headers, theirs.message)
        assert type(ours.key) is type(theirs.key) and type(ours.value) is type(theirs.value)


def test_raw_schema_sends_what_faust_raw_serializers_send() -> None:
    app = faust.App("raw-schema-send", broker="memory://", store="memory://")
    faust_raw = faust.Schema(key_serializer="raw", value_serializer="raw")
    for schema in (RawSchema(), faust_raw):
        assert schema.dumps_key(app, b"GPU-1", headers={}) == (b"GPU-1", {})  # (payload, headers)
        assert schema.dumps_value(app, b'{"a": 1}', headers={}) == (b'{"a": 1}', {})


def test_key_partitioner_answers_as_the_default_partitioner() -> None:
    rng = random.Random(5)
    ours, default = KeyPartitioner(capacity=50), DefaultPartitioner()
    keys = [f"GPU-{rng.getrandbits(64):016x}".encode() for _ in range(80)] + [b"", b"env-v100"]
    for _ in range(3):  # asked again: from its cache (past its capacity too)
        for n in (1, 3, 8, 16):
            partitions = list(range(n))
            for key in keys:
                assert ours(key, partitions, partitions) == default(key, partitions, partitions)
    assert len(ours.known) <= 50
    assert ours(None, [0, 1, 2], [2]) == 2  # no key: one of the available partitions, as the default

"""Model snapshots on ``models.snapshots`` (compacted): chunks out, complete versions in, and when to publish.

A snapshot (:mod:`models.snapshot`, encoded) is larger than Kafka's default 1 MB message (measured: 0.76 MB
compressed for a v100 environment with an ExtraTrees model served, 2.3 MB of files), so it is sent as
``count`` chunks keyed ``<environment>/<index>``, each carrying the environment, the version and the count
(:func:`chunks`).  Compaction keeps the latest chunk per key; a reader (:class:`Assembler`) collects chunks
per (environment, version) and hands out a version only when all of its chunks are there and it is newer
than the last one handed out: never a mix of two versions, never an older one.

Versions are the learner's publication time in milliseconds, increasing within one learner
(:func:`next_version`): a worker that takes an environment over publishes later than the one it replaces.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from models.environment import EnvironmentModels
from streams.stage2 import Version, WhatIfCache


class Chunk(msgspec.Struct, frozen=True):
    environment: str
    version: int
    index: int
    count: int
    data: bytes


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Chunk)


def chunks(environment: str, version: int, data: bytes, size: int) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` records of one snapshot's bytes, each value at most ``size`` bytes of data plus a header.

    >>> [(k, len(v) > 0) for k, v in chunks("v100", 7, b"x" * 5, 2)]
    [(b'v100/0', True), (b'v100/1', True), (b'v100/2', True)]
    """
    count = max(1, -(-len(data) // size))
    return [
        (f"{environment}/{i}".encode(), _ENCODER.encode(Chunk(environment, version, i, count, data[i * size : (i + 1) * size])))
        for i in range(count)
    ]


class Complete(NamedTuple):
    environment: str
    version: int
    data: bytes


class Assembler:
    """Chunks in (any order, any repetition, several versions interleaved); complete, newer versions out.

    >>> a = Assembler()
    >>> [c.version for c in a.add([v for _, v in chunks("e", 2, b"abcd", 2)[:1]])]
    []
    >>> [(c.version, c.data) for c in a.add([v for _, v in chunks("e", 2, b"abcd", 2)])]
    [(2, b'abcd')]
    >>> a.add([v for _, v in chunks("e", 1, b"old", 2)])  # older than what was handed out
    []
    """

    def __init__(self) -> None:
        self.applied: dict[str, int] = {}
        self.parts: dict[tuple[str, int], dict[int, bytes]] = {}
        self.rejected = 0

    def add(self, values: Iterable[bytes | None]) -> list[Complete]:
        """The versions ``values`` complete, newest per environment (an undecodable value is counted, skipped)."""
        done: dict[str, Complete] = {}
        for value in values:
            if value is None:
                continue
            try:
                c = _DECODER.decode(value)
            except msgspec.DecodeError:
                self.rejected += 1
                continue
            if c.version <= self.applied.get(c.environment, -1) or not 0 <= c.index < c.count:
                continue
            parts = self.parts.setdefault((c.environment, c.version), {})
            parts[c.index] = c.data
            if len(parts) == c.count:
                del self.parts[(c.environment, c.version)]
                self.applied[c.environment] = c.version
                done[c.environment] = Complete(c.environment, c.version, b"".join(parts[i] for i in range(c.count)))
                # parts of older versions can never be handed out now
                for env, version in [k for k in self.parts if k[0] == c.environment and k[1] < c.version]:
                    del self.parts[(env, version)]
        return list(done.values())


def next_version(last: int | None, now_s: float | None = None) -> int:
    """A version after ``last``: the time in ms, or ``last + 1`` when the clock has not moved past it.

    >>> next_version(None, 1.5), next_version(1500, 1.5), next_version(1500, 2.0)
    (1500, 1501, 2000)
    """
    ms = int((time.time() if now_s is None else now_s) * 1000)
    return ms if last is None or ms > last else last + 1


class Schedule:
    """When an environment's learner publishes a snapshot: as often as the what-if entries it would serve itself
    move on (:meth:`streams.stage2.WhatIfCache.stale`: a refit, a job type measured for the first time, ``every``
    observations and ``min_s`` of event time; more often while the models are young), and when a job type
    becomes known."""

    def __init__(self, every: int = 256, min_s: float = 60.0) -> None:
        self.rule = WhatIfCache(every, min_s)
        self.published: dict[str, tuple[Version, int]] = {}  # environment -> (models version, job types known)

    def due(self, models: EnvironmentModels, known: int, event_ts: float) -> bool:
        if models.observations == 0:
            return False  # nothing learned: serving's fallback is the same (see streams.serving)
        last = self.published.get(models.environment)
        return last is None or known > last[1] or self.rule.stale(last[0], models, event_ts)

    def done(self, models: EnvironmentModels, known: int, event_ts: float) -> None:
        v = Version(models.refits, len(models.measurements.types), models.observations, event_ts)
        self.published[models.environment] = (v, known)

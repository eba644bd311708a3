"""Model snapshots (setting ``serving`` sharded): published by an environment's learner, followed by every worker.

A snapshot is what serving needs of an environment's models (:mod:`models.snapshot`, reached only through
:func:`snapshot_bytes` and :func:`models_of` here), under a **version**: the learner's publication time in ms,
increasing within one learner (:func:`next_version`), so that a worker that takes an environment over publishes
later than the one it replaces.  A version is the only thing called so: newer is larger, and a server installs
only a version newer than the one it serves (:meth:`streams.serving.Serving.install`).

On ``models.snapshots`` (compacted) a snapshot is larger than Kafka's default 1 MB message (measured: 0.76 MB
compressed for a v100 environment with an ExtraTrees model served, 2.3 MB of files), so it is sent as ``count``
chunks keyed ``<environment>/<index>``, each carrying the environment, the version and the count (:func:`chunks`).
Compaction keeps the latest chunk per key; a reader (:class:`Assembler`) collects chunks per (environment, version)
and hands out a version only when all of its chunks are there and it is newer than the last one handed out: never
a mix of two versions, never an older one.

:class:`Snapshots` is a worker's side of both: it publishes the snapshots of the environments this worker learns
(their observations partition is here) when their :class:`Schedule` says so, and follows ``models.snapshots`` whole
in a thread, building each newer complete version's models there and installing them in
:class:`streams.serving.Serving` on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

import msgspec

from config import Settings
from events import Observation
from events.topics import SNAPSHOTS
from models import snapshot as model_snapshot
from models.environment import EnvironmentModels
from models.snapshot import DumpCache
from streams.readers import TopicFollower
from streams.serving import Serving
from streams.stage2 import Stage2
from streams.whatif import Mark, Profile, WhatIfCache, mark_of

log = logging.getLogger(__name__)
BUILD_AFTER_S = 5.0
"""A complete snapshot is built at the latest this long after it was read, caught up or not."""


# ------------------------------------------------------------------ the models' side (models.snapshot)
def snapshot_bytes(
    models: EnvironmentModels, known: Mapping[str, Profile], key: bytes, version: int, cache: DumpCache | None = None
) -> bytes:
    """The encoded snapshot of ``models`` at ``version`` (river learners signed with ``key``; ``cache``: the batch
    models' dumps, kept from one snapshot to the next)."""
    return model_snapshot.encode(model_snapshot.snapshot_of(models, known, key, version, cache))


def models_of(data: bytes, key: bytes) -> tuple[EnvironmentModels, dict[str, Profile]]:
    """The models and solo profiles of an encoded snapshot (raises on a damaged one, or one signed with another key)."""
    snap = model_snapshot.decode(data)
    return model_snapshot.serving_models(snap, key), dict(snap.known)


def apply(serving: Serving, environment: str, version: int, data: bytes, key: bytes) -> bool:
    """Build and install an encoded snapshot in ``serving`` (in process; a worker builds in its reader's thread)."""
    models, known = models_of(data, key)
    return serving.install(environment, version, models, known)


async def dump_batch_models(models: EnvironmentModels, key: bytes, cache: DumpCache) -> None:
    """Put the dumps of the batch models ``models`` serves into ``cache``, each in the executor (skops: 0.2-0.3 s
    each, measured): the event loop then pays only the rest of a snapshot."""
    loop = asyncio.get_running_loop()
    for c, i in model_snapshot.batch_to_dump(models):
        ck = model_snapshot.dump_key(models, c, i)
        if ck not in cache:
            cache[ck] = await loop.run_in_executor(None, model_snapshot.dump_candidate, c, i, key)


# ------------------------------------------------------------------ chunks on the topic
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
    move on (:meth:`streams.whatif.WhatIfCache.stale`: a refit, a job type measured for the first time, ``every``
    observations and ``min_s`` of event time; more often while the models are young), and when a job type
    becomes known."""

    def __init__(self, every: int = 256, min_s: float = 60.0) -> None:
        self.rule = WhatIfCache(every, min_s)
        self.published: dict[str, tuple[Mark, int]] = {}  # environment -> (the models then, job types known)

    def due(self, models: EnvironmentModels, known: int, event_ts: float) -> bool:
        if models.observations == 0:
            return False  # nothing learned: serving's fallback is the same (see streams.serving)
        last = self.published.get(models.environment)
        return last is None or known > last[1] or self.rule.stale(last[0], models, event_ts)

    def done(self, models: EnvironmentModels, known: int, event_ts: float) -> None:
        self.published[models.environment] = (mark_of(models, event_ts), known)


# ------------------------------------------------------------------ a worker's side
class Snapshots:
    """Publish (the learner's side) and follow (every worker's side) model snapshots."""

    def __init__(
        self,
        settings: Settings,
        stage2: Stage2,
        serving: Serving,
        send: Callable[[bytes, bytes], None],
        published: Counter[str],
    ) -> None:
        self.settings, self.stage2, self.serving, self.send, self.published = settings, stage2, serving, send, published
        self.key = settings.snapshot_key.encode()
        self.schedule = Schedule()
        self.versions: dict[str, int] = {}  # environment -> the last version published here
        self.dump_caches: dict[str, DumpCache] = {}
        self.event_ts: dict[str, float] = {}  # environment -> the latest window end learned
        self.follower: TopicFollower | None = None
        self.warming: set[str] = set()
        self.partitions: dict[str, int] = {}  # environment -> the observations partition it is learned from
        self.assigned: set[int] | None = None  # None: not told yet (every environment learned here is published)

    def learned(self, obs: Observation, partition: int) -> None:
        """Note the event time an environment's learning has reached (the schedule's clock), and the observations
        partition it is learned from."""
        if obs.window_end > self.event_ts.get(obs.environment, 0.0):
            self.event_ts[obs.environment] = obs.window_end
        self.partitions[obs.environment] = partition

    def assign(self, partitions: set[int]) -> None:
        """The observations partitions assigned here now: an environment of another one is another worker's to
        publish (a refit that finishes after its partition moved must not publish models the new learner has
        moved on from, with a newer version)."""
        self.assigned = set(partitions)

    def publish(self, envs: Iterable[str]) -> int:
        """A snapshot of each environment learned here whose models moved on; return how many were sent."""
        sent = 0
        for env in envs:
            models = self.stage2.models.get(env)
            if models is None or not self.owns(env):
                continue
            known = self.stage2.job_types.get(env, {})
            event_ts = self.event_ts.get(env, 0.0)
            if env in self.warming or not self.schedule.due(models, len(known), event_ts):
                continue
            version = self.versions[env] = next_version(self.versions.get(env))
            data = snapshot_bytes(models, known, self.key, version, self.dump_caches.setdefault(env, {}))
            records = chunks(env, version, data, self.settings.snapshot_chunk_bytes)
            for key, value in records:
                self.send(key, value)
            self.schedule.done(models, len(known), event_ts)
            self.published["snapshots"] += 1
            self.published["snapshot_chunks"] += len(records)
            sent += 1
        return sent

    def owns(self, environment: str) -> bool:
        partition = self.partitions.get(environment)
        return self.assigned is None or partition is None or partition in self.assigned

    async def after_refit(self, env: str) -> None:
        """Dump the refit's served batch models off the event loop (:func:`dump_batch_models`), then publish.  No
        snapshot of ``env`` goes out meanwhile."""
        models = self.stage2.models.get(env)
        if models is None:
            return
        self.warming.add(env)
        try:
            await dump_batch_models(models, self.key, self.dump_caches.setdefault(env, {}))
        except Exception:  # publish() dumps what is missing itself
            log.exception("dumping the batch models of %s failed", env)
        finally:
            self.warming.discard(env)
        self.publish([env])

    def follow(self) -> TopicFollower:
        """Read every partition of ``models.snapshots`` in a thread (a GlobalKTable: assigned, not group-managed).

        A complete version waits until the reader has caught up (a poll that read nothing) or has waited
        ``BUILD_AFTER_S``, and only the newest one per environment is built then: a worker that starts reads
        every version the topic still holds (all of them on a broker that does not compact), and builds one."""
        loop = asyncio.get_running_loop()
        assembler = Assembler()
        pending: dict[str, tuple[float, Complete]] = {}  # environment -> (since, newest complete version)

        def build(due: Callable[[float], bool]) -> None:
            for env, (since, done) in list(pending.items()):
                if not due(since):
                    continue
                del pending[env]
                try:
                    models, known = models_of(done.data, self.key)
                except Exception as exc:  # a damaged snapshot or one signed with another key: keep the one served
                    log.warning("model snapshot %s of %s refused: %s", done.version, done.environment, exc)
                    self.serving.counters["snapshots_refused"] += 1
                    continue
                loop.call_soon_threadsafe(self.serving.install, done.environment, done.version, models, known)

        def deliver(pairs: list[tuple[bytes | None, bytes | None]]) -> None:
            now = time.monotonic()
            for done in assembler.add(v for _, v in pairs):
                self.serving.counters["snapshots_complete"] += 1
                pending[done.environment] = (pending.get(done.environment, (now, done))[0], done)
            build(lambda since: now - since >= BUILD_AFTER_S)

        self.follower = TopicFollower(
            self.settings, SNAPSHOTS, deliver, raw=True, idle=lambda: build(lambda _: True)
        ).start()  # a base name: no record class
        return self.follower

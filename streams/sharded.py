"""Serving sharded's model snapshots in a worker (setting ``serving`` sharded; see :mod:`streams.serving`).

:class:`Snapshots` publishes the snapshots of the environments this worker learns (their observations
partition is here) when their :class:`streams.snapshots.Schedule` says so, and follows ``models.snapshots``
whole in a thread, building each newer complete version's models there and installing them in
:class:`streams.serving.Serving` on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable

from config import Settings
from events import Observation
from events.topics import SNAPSHOTS
from models import snapshot as codec
from models.snapshot import DumpCache, batch_to_dump, dump_candidate, dump_key, serving_models, snapshot_of
from streams.readers import TopicFollower
from streams.serving import Serving
from streams.snapshots import Assembler, Complete, Schedule, chunks, next_version
from streams.stage2 import Stage2

log = logging.getLogger(__name__)
BUILD_AFTER_S = 5.0
"""A complete snapshot is built at the latest this long after it was read, caught up or not."""


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
        self.settings = settings
        self.stage2 = stage2
        self.serving = serving
        self.send = send
        self.published = published
        self.key = settings.snapshot_key.encode()
        self.schedule = Schedule()
        self.versions: dict[str, int] = {}
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
            snap = snapshot_of(models, known, self.key, version, self.dump_caches.setdefault(env, {}))
            records = chunks(env, version, codec.encode(snap), self.settings.snapshot_chunk_bytes)
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
        """Dump the refit's served batch models in the executor (skops: 0.2-0.3 s each, measured), then publish: the
        event loop pays only the rest of the snapshot.  No snapshot of ``env`` goes out meanwhile."""
        models = self.stage2.models.get(env)
        if models is None:
            return
        loop = asyncio.get_running_loop()
        cache = self.dump_caches.setdefault(env, {})
        self.warming.add(env)
        try:
            for c, i in batch_to_dump(models):
                ck = dump_key(models, c, i)
                if ck not in cache:
                    cache[ck] = await loop.run_in_executor(None, dump_candidate, c, i, self.key)
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
                    snap = codec.decode(done.data)
                    models = serving_models(snap, self.key)
                except Exception as exc:  # a damaged snapshot or one signed with another key: keep the one served
                    log.warning("model snapshot %s of %s refused: %s", done.version, done.environment, exc)
                    self.serving.counters["snapshots_refused"] += 1
                    continue
                loop.call_soon_threadsafe(self.serving.install, done.environment, done.version, models, snap.known)

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

"""The faust app: thin agents around :class:`Stage1` and :class:`Stage2`, HTTP views, metrics.

``create_app(settings)`` builds a fresh app (tests build one per test);
:func:`run_worker` runs it until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import faust
from faust.sensors import Monitor
from faust.types import TP

from config import Settings
from events import JobEvent, MetricSample, Observation, RecordError, SoloProfile, Topics, decode, encode
from events.topics import LIFECYCLE, METRICS
from streams import changelog
from streams.deadletters import dead_letter
from streams.metrics import StreamMetrics, dead_letter_reason
from streams.profiles import LOCAL
from streams.readers import PartitionReader, TopicFollower
from streams.stage1 import LateEvent, Stage1
from streams.stage2 import Stage2
from streams.windows import GpuState

log = logging.getLogger(__name__)


AUTO_COMMIT_OFF_S = 10.0**9  # faust's periodic commit timer: effectively never
AUTO_COMMIT_OFF_EVERY = 2**62  # faust's commit every N acked messages: never

try:  # orjson where installed (several times faster for the checkpoint)
    import orjson as _orjson

    def _dumps(obj: Any) -> bytes:
        return _orjson.dumps(obj)

    _loads = _orjson.loads
except ImportError:  # pragma: no cover
    import json as _jsonlib

    def _dumps(obj: Any) -> bytes:
        return _jsonlib.dumps(obj, separators=(",", ":")).encode()

    _loads = _jsonlib.loads


class WorkerMonitor(Monitor):
    """faust's Monitor without its per-event bookkeeping, plus the worker's commit hook.

    The worker serves its own /metrics, so the Monitor's per-message counters, timings and
    per-stream lookups (four calls per event) are skipped; ``stream_inbound_time``, which
    faust's stalled-stream warnings read, is kept.  ``on_commit_initiated`` saves the state an
    offset commit covers right before faust computes the offsets (no await in between).
    """

    def __init__(self, on_commit: Callable[[], None]) -> None:
        super().__init__()
        self._on_commit = on_commit

    def on_message_in(self, tp: Any, offset: int, message: Any) -> None:
        return None

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> None:
        self.stream_inbound_time[tp] = time.monotonic()
        return None

    def on_stream_event_out(self, tp: Any, offset: int, stream: Any, event: Any, state: Any = None) -> None:
        return None

    def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
        return None

    def on_commit_initiated(self, consumer: Any) -> Any:
        self._on_commit()
        return super().on_commit_initiated(consumer)


def app_id(settings: Settings) -> str:
    """The faust app id (consumer group, changelog topic names): one per topic prefix."""
    suffix = re.sub(r"[^A-Za-z0-9_-]", "-", settings.topic_prefix).strip("-")
    return f"{settings.client_id}-streams" + (f"-{suffix}" if suffix else "")


def broker_credentials(settings: Settings) -> Any:
    if not (settings.uses_tls or settings.uses_sasl):
        return None
    from transport.tls import client_context  # the context every kafka-python client of the project uses

    context = client_context(settings) if settings.uses_tls else None
    if settings.uses_sasl:
        return faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password,
            ssl_context=context,
            mechanism=settings.sasl_mechanism,
        )
    return faust.SSLCredentials(context)


def state_dir(settings: Settings) -> Path:
    """The worker's state directory (created): ``settings.state_dir`` or ~/.cache/aip/state."""
    path = Path(settings.state_dir).expanduser() if settings.state_dir else Path.home() / ".cache" / "aip" / "state"
    (path / "faust").mkdir(parents=True, exist_ok=True)
    return path


def group_instance_id(settings: Settings) -> str | None:
    """Static group membership: a worker restarted on the same host with the same state directory
    rejoins as the same member and gets its partitions back at once (measured: predictions resumed
    10.6 s after a SIGKILL instead of 22.8 s, which waited for the killed member's session)."""
    if settings.group_instance_id.lower() == "none":
        return None
    if settings.group_instance_id:
        return settings.group_instance_id
    digest = hashlib.sha256(str(state_dir(settings).resolve()).encode()).hexdigest()[:10]
    return f"{socket.gethostname()}-{digest}"


def app_config(settings: Settings, *, web: bool = True, web_port: int | None = None) -> dict[str, Any]:
    """faust settings for the broker at hand (see DESIGN.md: Tansu holds JoinGroup for the whole rebalance timeout)."""
    return dict(
        broker=[f"kafka://{s}" for s in settings.bootstrap_servers],
        broker_credentials=broker_credentials(settings),
        store="memory://",
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        producer_acks=1,
        broker_rebalance_timeout=settings.rebalance_timeout_s,
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        consumer_group_instance_id=group_instance_id(settings),
        broker_max_poll_interval=30.0,
        broker_request_timeout=max(settings.request_timeout_s, 31.0),
        web_enabled=web,
        web_port=web_port if web_port is not None else settings.web_port,
        web_bind=settings.web_host,
        web_in_thread=False,
        datadir=str(state_dir(settings) / "faust"),
        consumer_auto_offset_reset="earliest",
        # offsets are committed only right after a stage-1 checkpoint (Streams.checkpoint_and_commit)
        broker_commit_interval=AUTO_COMMIT_OFF_S,
        broker_commit_every=AUTO_COMMIT_OFF_EVERY,
        key_serializer="raw",
        value_serializer="raw",
    )


class Streams:
    """One worker's app, processors and metrics (attributes for tests and views)."""

    def __init__(
        self, settings: Settings, *, web: bool = True, web_port: int | None = None, clock: Any = time.time, stage2: bool = True
    ) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.clock = clock
        self.app = faust.App(
            app_id(settings), monitor=WorkerMonitor(self.on_commit_initiated), **app_config(settings, web=web, web_port=web_port)
        )
        app = self.app
        t = self.topics
        self.inputs = app.topic(t.metrics, t.lifecycle, key_serializer="raw", value_serializer="raw")
        self.observations = app.topic(t.observations, key_serializer="raw", value_serializer="raw")
        self.profiles_topic = app.topic(t.profiles, key_serializer="raw", value_serializer="raw")
        self.changelog_topic = app.topic(t.stage1_changelog, key_serializer="raw", value_serializer="raw")
        self.out = {
            name: app.topic(getattr(t, name), key_serializer="raw", value_serializer="raw")
            for name in ("predictions", "alerts", "leaderboard", "deadletter")
        }
        self.stage1 = Stage1(
            settings.window_s,
            settings.lateness_s,
            settings.lifecycle_hold_s,
            progress_hold_s=settings.progress_hold_s,
            source_of=self._source_of,
        )
        self.follower: TopicFollower | None = None
        self.checkpoint_path = state_dir(settings) / "stage1.json"
        self.gpu_partition: dict[str, int] = {}  # GPU -> input partition it was last read from
        self.positions: dict[str, int] = {}  # "topic:partition" -> last input offset applied to stage 1
        self.replay_until: dict[str, int] = {}  # after a restart: offsets up to these were applied before
        self.load_checkpoint()
        self.stage2 = Stage2(settings.alert_threshold_pct, settings.alert_clear_pct, state_dir=state_dir(settings), clock=clock)
        self.metrics = StreamMetrics(
            self.stage1.counters,
            self.stage2.counters,
            leaderboards=lambda: self.stage2.leaderboards,
            highwater=self._highwater,
            held=lambda: self.stage1.held_count(),
        )
        self._refitting: set[str] = set()
        self._own_commit = False
        self._assigned: set[int] = set()  # input partitions assigned to this process
        self._touched: set[str] = set()  # GPUs whose state changed since the last changelog write
        self._logged_positions: dict[int, dict[str, int]] = {}  # input positions last written to the changelog
        self._restoring: dict[int, asyncio.Future[int]] = {}  # input partitions whose state is being read
        self._ready: set[int] = set()  # input partitions whose changelog was read since they were assigned here
        self.changelog_enabled = False  # set when the worker starts (unit tests drive stage 1 without a broker)
        self.writer_id = f"{group_instance_id(settings) or socket.gethostname()}-{os.getpid()}"
        self._tps: dict[tuple[str, int], tuple[TP, str]] = {}  # (base topic, partition) -> (TP, positions key)
        self._bases: dict[str, str] = {}  # full topic name -> base name
        self.checkpoints = 0
        self._refit_futures: set[asyncio.Future[None]] = set()
        self._register(stage2)

    # ------------------------------------------------------------------ state
    # Stage-1 state (per-GPU windows, job sets, dedup positions, solo profiles) is checkpointed
    # to a local file, and input offsets are committed only right after a checkpoint (faust's
    # periodic auto-commit is off): the committed offsets never run ahead of the saved state.
    # After a crash the worker loads the checkpoint, faust seeks to the committed offsets, and
    # the events read again are dropped as duplicates (seq per producer, lifecycle resends).
    def load_checkpoint(self) -> bool:
        """Restore stage 1 from ``state_dir/stage1.json`` (False when there is none or it is unreadable)."""
        try:
            data = _loads(self.checkpoint_path.read_bytes())
        except FileNotFoundError:
            return False
        except Exception as exc:  # a damaged file must not stop the worker: start afresh
            log.warning("ignoring unreadable stage-1 checkpoint %s: %s", self.checkpoint_path, exc)
            return False
        self.stage1.restore(data.get("stage1", {}))
        self.gpu_partition = {g: int(p) for g, p in data.get("partitions", {}).items() if g in self.stage1.gpus}
        self.positions = {k: int(v) for k, v in data.get("positions", {}).items()}
        self.stage1.counters["restored_gpus"] += len(self.stage1.gpus)
        self.stage1.counters["restored_profiles"] += len(self.stage1.profiles)
        self.replay_until = dict(self.positions)
        log.info(
            "stage 1 restored %d GPUs and %d solo profiles from %s",
            len(self.stage1.gpus),
            len(self.stage1.profiles),
            self.checkpoint_path,
        )
        return True

    def checkpoint(self) -> None:
        """Write stage 1's state atomically (temporary file, fsync, rename)."""
        body = _dumps(
            {
                "version": 1,
                "saved_at": time.time(),
                "stage1": self.stage1.to_dict(),
                "partitions": self.gpu_partition,
                "positions": self.positions,
            }
        )
        tmp = self.checkpoint_path.with_suffix(".json.tmp")
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.checkpoint_path)
        self.stage1.dirty.clear()
        self.checkpoints += 1

    def _source_of(self, gpu: str) -> str:
        """The share of solo profiles a GPU's solo windows feed: its input partition (one owner at a time)."""
        partition = self.gpu_partition.get(gpu)
        return LOCAL if partition is None else str(partition)

    def publish_profiles(self) -> int:
        """Put the solo profiles this worker updated since the last call on ``interference.profiles``."""
        keys = self.stage1.profiles.take_dirty()
        for env, jt in keys:
            record = self.stage1.profiles.record(env, jt)
            self.profiles_topic.send_soon(key=record.key.encode(), value=encode(record))
        self.metrics.published["profiles"] += len(keys)
        return len(keys)

    def apply_profiles(self, records: Iterable[SoloProfile]) -> None:
        """Merge solo profiles read from the topic (every worker's shares); publish the held job-windows they release."""
        released: list[Observation] = []
        for record in records:
            released.extend(self.stage1.merge_profile(record))
        for o in released:
            self.emit_observation(o)
        self.metrics.published["observations"] += len(released)

    def follow_profiles(self) -> TopicFollower:
        loop = asyncio.get_running_loop()
        self.follower = TopicFollower(
            self.settings, self.topics.profiles, lambda recs: loop.call_soon_threadsafe(self.apply_profiles, recs)
        ).start()
        return self.follower

    def on_commit_initiated(self) -> None:
        """Before faust commits offsets (our timers, a rebalance, a clean stop): save the state they cover
        (the changelog and profiles are flushed by faust before the offsets are committed)."""
        self.publish_profiles()
        self.publish_changelog()
        self.checkpoint()
        if not self._own_commit:  # a commit of every topic: observations too
            self.stage2.save()

    # -------------------------------------------------------- stage-1 changelog
    def publish_changelog(self) -> int:
        """Write the GPUs touched since the last call, then each owned partition's input positions, to the
        changelog partition of their input partition (see :mod:`streams.changelog`); return the records sent."""
        sent = 0
        partitions: set[int] = set()
        for gpu in self._touched:
            partition = self.gpu_partition.get(gpu)
            st = self.stage1.gpus.get(gpu)
            if partition is None or st is None:
                continue
            key, value = changelog.gpu_record(gpu, st.to_dict())
            self.changelog_topic.send_soon(key=key, value=value, partition=partition)
            partitions.add(partition)
            sent += 1
        self._touched.clear()
        for partition in sorted(partitions | self._assigned):
            mine = {k: v for k, v in self.positions.items() if int(k.rpartition(":")[2]) == partition}
            if mine and mine != self._logged_positions.get(partition):
                key, value = changelog.positions_record(mine, self.stage1.window_s, self.writer_id)
                self.changelog_topic.send_soon(key=key, value=value, partition=partition)
                self._logged_positions[partition] = mine
                sent += 1
        self.metrics.published["stage1_changelog"] += sent
        return sent

    async def restore_partition(self, partition: int) -> int:
        """Continue input partition ``partition``'s GPUs from the changelog when it is beyond this worker's own
        state of them (a partition another worker had); return the GPUs restored."""
        loop = asyncio.get_running_loop()
        try:
            state = await loop.run_in_executor(
                None, changelog.read_partition, self.settings, self.topics.stage1_changelog, partition, self.writer_id
            )
        except Exception as exc:  # the partition's GPUs then start afresh, as before the changelog
            log.warning("could not read the stage-1 changelog of partition %d: %s", partition, exc)
            self.stage1.counters["changelog_restore_failed"] += 1
            return 0
        finally:
            self._restoring.pop(partition, None)
            self._ready.add(partition)
        local = {k: v for k, v in self.positions.items() if int(k.rpartition(":")[2]) == partition}
        if not state.newer_than(local) or state.window_s != self.stage1.window_s:
            log.warning("stage 1 keeps its own state of partition %d (changelog %s, own %s)", partition, state.positions, local)
            return 0
        stale = [g for g, p in self.gpu_partition.items() if p == partition]
        self.stage1.forget(stale)
        for g in stale:
            del self.gpu_partition[g]
        for gpu, data in state.gpus.items():
            self.stage1.gpus[gpu] = GpuState.from_dict(data)
            self.gpu_partition[gpu] = partition
        self.positions.update(state.positions)
        self.replay_until.update(state.positions)
        self._logged_positions[partition] = dict(state.positions)
        self.stage1.counters["changelog_restored_gpus"] += len(state.gpus)
        log.warning(
            "stage 1 continues %d GPUs of partition %d from the changelog (positions %s)",
            *(len(state.gpus), partition, state.positions),
        )
        return len(state.gpus)

    def _restore_task(self, partition: int) -> asyncio.Future[int]:
        future = self._restoring.get(partition)
        if future is None:
            future = self._restoring[partition] = asyncio.ensure_future(self.restore_partition(partition))
        return future

    async def restored(self, partitions: Iterable[int]) -> None:
        """Read the changelog of these input partitions where not done since they were assigned here: no event of
        a partition is applied before (faust may hand over events before its assignment signal)."""
        for p in sorted(set(partitions) - self._ready):
            await asyncio.shield(self._restore_task(p))

    async def commit(self, topics: set[str]) -> bool:
        """Commit the acked offsets of ``topics`` (the state they cover was just saved by the caller)."""
        self._own_commit = True
        try:
            return bool(await self.app.consumer.commit(topics))
        finally:
            self._own_commit = False

    async def checkpoint_and_commit(self) -> None:
        await self.commit({self.topics.metrics, self.topics.lifecycle})  # on_commit_initiated checkpoints first

    async def save_models_and_commit(self) -> None:
        self.stage2.save()
        await self.commit({self.topics.observations})
        self.stage2.counters["models_saved_committed"] += 1  # saved, and the offsets it covers committed

    def on_partitions_assigned(self, _sender: Any, assigned: Any = (), **_: Any) -> None:
        """Forget GPUs of input partitions that moved from this worker to another (which starts them afresh).

        Only partitions this process held and lost count: GPUs restored from the checkpoint whose
        partitions are not (yet) assigned are kept, because a restarted worker's first assignment
        can be partial while the group still counts the killed member (it gets them back a rebalance later).
        """
        inputs = {self.topics.metrics, self.topics.lifecycle}
        mine = {tp.partition for tp in assigned if tp.topic in inputs}
        lost = self._assigned - mine
        for p in sorted(mine - self._assigned) if self.changelog_enabled else ():
            self._restore_task(p)  # start reading its changelog now; stage 1 waits for it before the first event
        self._ready -= lost
        self._assigned = mine
        if not lost:
            return
        gone = [g for g, p in self.gpu_partition.items() if p in lost]
        if gone:
            log.info("forgetting %d GPUs of partitions %s, now assigned elsewhere", len(gone), sorted(lost))
            self.stage1.forget(gone)
            for g in gone:
                del self.gpu_partition[g]
        for key in [k for k in self.positions if int(k.rpartition(":")[2]) in lost]:
            del self.positions[key]
            self.replay_until.pop(key, None)
        for p in lost:
            self._logged_positions.pop(p, None)

    def lifecycle_pending(self, partition: int) -> bool:
        """Whether the lifecycle partition ``partition`` has records stage 1 has not applied yet.

        A GPU's samples and lifecycle events share a key (gpu_uuid), so they sit in
        partitions of the same number.  While that lifecycle partition is behind (fetched
        high-water mark beyond what stage 1 applied, or nothing fetched yet), the GPU's
        windows wait for it: reading a backlog, faust may hand over minutes of one
        partition's metrics before any of its lifecycle events (measured: up to 5,736 valid
        lifecycle events dead-lettered as late in the stage-1 bench before this rule).
        Asked per event: one batch can span minutes of event time.
        """
        high = self._highwater(LIFECYCLE, partition)
        applied = self.positions.get(self._tp(LIFECYCLE, partition)[1])
        return high is None or (applied is None and high > 0) or (applied is not None and applied + 1 < high)

    def _tp(self, topic: str, partition: int) -> tuple[TP, str]:
        """(faust TP, key in ``positions``) of a base topic name and partition, built once (asked per event)."""
        names = self._tps.get((topic, partition))
        if names is None:
            names = self._tps[(topic, partition)] = (TP(self.topics.name(topic), partition), f"{topic}:{partition}")
        return names

    def _highwater(self, topic: str, partition: int) -> int | None:
        try:
            return int(self.app.consumer.highwater(self._tp(topic, partition)[0]))
        except Exception:  # not assigned here, or the consumer is not running
            return None

    def _base(self, topic: str) -> str:
        """Base name of a full topic name (cached: once per event on the hot path)."""
        base = self._bases.get(topic)
        if base is None:
            base = self._bases[topic] = self.topics.base(topic)
        return base

    def _consumed(self, event: Any) -> None:
        m = event.message
        self.metrics.consumed_message(self._base(m.topic), m.partition, m.offset)

    # ----------------------------------------------------------------- output
    async def send(self, name: str, key: str | None, record: Any) -> None:
        await self.out[name].send(key=None if key is None else key.encode(), value=encode(record))
        self.metrics.published[name] += 1

    def emit_observation(self, obs: Observation) -> None:
        """Buffer an observation for the producer.  Not awaited: an awaited faust send cost about
        1 ms per record here; faust flushes this buffer before it commits the input offsets,
        so delivery stays at least once."""
        self.observations.send_soon(key=obs.environment.encode(), value=encode(obs))

    async def send_dead_letter(self, event: Any, error: str, stage: str) -> None:
        m = event.message
        record = dead_letter(self.topics.base(m.topic), m.partition, m.offset, m.value, error, m.key, stage, now=self.clock())
        self.metrics.dead_letters[dead_letter_reason(error)] += 1
        await self.send("deadletter", record.key, record)

    # ----------------------------------------------------------------- agents
    def handle_input(self, event: Any) -> tuple[list[Observation], str | None]:
        """Stage 1 for one raw event: (observations, dead-letter reason or None); counts it as consumed.

        After a restart, events up to the offsets in the checkpoint were applied before: stage 1
        drops them as duplicates (seq, lifecycle resends), and one that is late against the
        restored windows is a replay too (counted as ``replayed_late``, not dead-lettered).
        """
        m = event.message
        base = self._base(m.topic)
        self.metrics.consumed_message(base, m.partition, m.offset)
        position = f"{base}:{m.partition}"
        replay = False
        if self.replay_until:
            until = self.replay_until.get(position)
            if until is not None:
                replay = m.offset <= until
                if not replay:
                    del self.replay_until[position]
        self.positions[position] = m.offset
        try:
            if base == METRICS:
                sample = decode(MetricSample, event.value)
                self.gpu_partition[sample.gpu_uuid] = m.partition
                self._touched.add(sample.gpu_uuid)
                return self.stage1.on_metric(sample, self.lifecycle_pending(m.partition)), None
            if base == LIFECYCLE:
                job = decode(JobEvent, event.value)
                self.gpu_partition[job.gpu_uuid] = m.partition
                self._touched.add(job.gpu_uuid)
                return self.stage1.on_job(job, self.lifecycle_pending(m.partition)), None
            return [], f"unexpected topic {event.message.topic}"
        except RecordError as exc:
            return [], f"invalid {base} record: {exc}"
        except LateEvent as exc:
            if replay:
                self.stage1.counters["replayed_late"] += 1
                return [], None
            return [], str(exc)
        except Exception as exc:  # a bug on one record must not stop the worker
            log.exception("stage 1 failed on %s p%s@%s", event.message.topic, event.message.partition, event.message.offset)
            return [], f"stage 1 error: {type(exc).__name__}: {exc}"

    def _register(self, with_stage2: bool = True) -> None:
        app = self.app
        s = self.settings

        @app.agent(self.inputs, name="stage1")
        async def stage1(stream: Any) -> None:
            if s.stage1_batch > 1:
                async for batch in stream.take_events(s.stage1_batch, within=s.stage1_batch_wait_s):
                    await self.stage1_batch(batch)
            else:
                async for event in stream.events():
                    await self.stage1_event(event)

        async def stage2(stream: Any) -> None:
            async for batch in stream.take_events(200, within=0.02):
                await self.stage2_batch(batch)

        if with_stage2:
            stage2 = app.agent(self.observations, name="stage2")(stage2)

        @app.task
        async def shared_state() -> None:
            self.changelog_enabled = True
            self.follow_profiles()

        @app.timer(s.checkpoint_interval_s)
        async def checkpoint() -> None:
            await self.checkpoint_and_commit()

        @app.timer(s.models_save_interval_s)
        async def save_models() -> None:
            await self.save_models_and_commit()

        @app.page("/predictions/{gpu_uuid}")
        async def predictions(web: Any, request: Any, gpu_uuid: str) -> Any:
            return web.json({"gpu_uuid": gpu_uuid, "jobs": self.stage2.latest.get(gpu_uuid, {})})

        @app.page("/leaderboard")
        async def leaderboard(web: Any, request: Any) -> Any:
            from events import to_dict

            return web.json({env: to_dict(b) for env, b in self.stage2.leaderboards.items()})

        @app.page("/profiles")
        async def profiles_view(web: Any, request: Any) -> Any:
            return web.json(self.stage1.profiles.view())

        @app.page("/metrics")
        async def metrics(web: Any, request: Any) -> Any:
            body, content_type = self.metrics.render()
            return web.bytes(body, content_type=content_type)

        app.on_partitions_assigned.connect(self.on_partitions_assigned)

        self.agents = (stage1, stage2)

    async def stage1_event(self, event: Any) -> None:
        """Stage 1 for one event (``stage1_batch`` 1)."""
        if self.changelog_enabled and event.message.partition not in self._ready:
            await self.restored([event.message.partition])
        obs, error = self.handle_input(event)
        if error is not None:
            await self.send_dead_letter(event, error, "stage1")
        elif obs:
            for o in obs:
                self.emit_observation(o)
            self.metrics.published["observations"] += len(obs)

    async def stage1_batch(self, batch: Iterable[Any]) -> None:
        observations: list[Observation] = []
        if self.changelog_enabled:
            batch = list(batch)
            await self.restored(e.message.partition for e in batch)
        for event in batch:
            obs, error = self.handle_input(event)
            if error is not None:
                await self.send_dead_letter(event, error, "stage1")
            elif obs:
                observations.extend(obs)
        for o in observations:
            self.emit_observation(o)
        self.metrics.published["observations"] += len(observations)

    async def rebuild(self, partition: int, start: int, end: int) -> set[str]:
        """Learn observations ``[start, end)`` of an observations partition from the topic, then refit; return the
        environments learned.  Runs when this worker is handed a partition beyond what its models cover (another
        worker learned it, or none ever did here): stage 2 holds that partition's records meanwhile."""
        t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        reader = await loop.run_in_executor(None, PartitionReader, self.settings, self.topics.observations, partition, start, end)
        envs: set[str] = set()
        learned = 0
        try:
            while not reader.done:
                for _offset, _key, value in await loop.run_in_executor(None, reader.read):
                    try:
                        obs = decode(Observation, value)
                    except RecordError:
                        continue  # dead-lettered when it was first read
                    learned += self.stage2.replay(obs)
                    envs.add(obs.environment)
                await asyncio.sleep(0)
        finally:
            reader.close()
        self.stage2.applied(partition, end - 1)
        read_s = time.monotonic() - t0
        for env in sorted(envs):  # "it refits, then serves"
            models = self.stage2.models_for(env)
            if env not in self._refitting and models.refit_due():
                self._refitting.add(env)
                try:
                    result = await loop.run_in_executor(None, models.refit_task())
                    self.stage2.apply_refit(env, result)
                finally:
                    self._refitting.discard(env)
            board = self.stage2.leaderboard_of(env)
            if board is not None:
                await self.send("leaderboard", env, board)
        self.stage2.counters["rebuilds"] += 1
        total_s = time.monotonic() - t0
        log.warning(
            "stage 2 rebuilt %s from observations p%d [%d, %d): %d learned in %.1f s; refit, serving after %.1f s",
            *(sorted(envs), partition, start, end, learned, read_s, total_s),
        )
        return envs

    async def stage2_batch(self, batch: Iterable[Any]) -> None:
        boards = {}
        for event in batch:
            self._consumed(event)
            m = event.message
            start = self.stage2.start_of(m.partition)
            if m.offset > start:  # the models do not cover what precedes this record: rebuild from the topic
                await self.rebuild(m.partition, start, m.offset)
            self.stage2.applied(m.partition, m.offset)
            try:
                obs = decode(Observation, event.value)
                out = self.stage2.on_observation(obs)
                self.metrics.observations[obs.environment] += 1
            except RecordError as exc:
                await self.send_dead_letter(event, f"invalid interference.observations record: {exc}", "stage2")
                continue
            except Exception as exc:
                log.exception("stage 2 failed on p%s@%s", event.message.partition, event.message.offset)
                await self.send_dead_letter(event, f"stage 2 error: {type(exc).__name__}: {exc}", "stage2")
                continue
            for p in out.predictions:
                await self.send("predictions", p.gpu_uuid, p)
            for a in out.alerts:
                await self.send("alerts", a.gpu_uuid, a)
            if out.leaderboard is not None:
                boards[out.leaderboard.environment] = out.leaderboard
        for env, board in boards.items():
            await self.send("leaderboard", env, board)
        self.start_refits()

    def start_refits(self) -> None:
        """Run due refits in an executor; apply each on the event loop when it finishes."""
        for env, task in self.stage2.refits_due():
            if env in self._refitting:
                continue
            self._refitting.add(env)
            future = asyncio.ensure_future(self._refit(env, task))
            self._refit_futures.add(future)
            future.add_done_callback(self._refit_futures.discard)

    async def _refit(self, env: str, task: Any) -> None:
        # An executor thread, not a daemon thread: a daemon thread still inside torch or OpenMP
        # when the interpreter exits aborts the process (SIGABRT, measured); stopping waits
        # for a refit in progress instead (seconds: large refits run on the pool).
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(None, task)
            board = self.stage2.apply_refit(env, result)
            if board is not None:
                await self.send("leaderboard", env, board)
        except Exception:
            log.exception("refit of %s failed", env)
        finally:
            self._refitting.discard(env)


def create_app(settings: Settings, **kwargs: Any) -> Streams:
    return Streams(settings, **kwargs)


def faust_worker(app: faust.App, loglevel: str = "warn") -> Any:
    """A faust Worker without its terminal spinner.

    At a log level of WARN or above, faust's Worker sets the root logger to DEBUG and adds a
    handler that turns the spinner for every record, and keeps both after start-up: every
    debug call in faust and aiokafka (one per sent record, per broker response) then builds a
    LogRecord. Measured in the stage-1 bench: about 1 % of the worker's samples in logging.
    Without the spinner the root logger stays at ``loglevel``.
    """
    from faust.worker import Worker

    levels = {"crit": "critical", "warn": "warning"}
    worker = Worker(app, loglevel=levels.get(loglevel, loglevel), quiet=True, redirect_stdouts=False)
    worker.spinner = None
    return worker


def run_worker(settings: Settings, *, loglevel: str = "warn", web_port: int | None = None) -> None:
    """Run one worker in this process until SIGINT or SIGTERM (faust's Worker stops cleanly on both)."""
    streams = create_app(settings, web_port=web_port)
    worker = faust_worker(streams.app, loglevel)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    finally:
        streams.checkpoint()
        streams.stage2.save()

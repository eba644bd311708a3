"""The faust app: thin agents around :class:`Stage1` and :class:`Stage2`, wired to their collaborators.

- :mod:`streams.state`: stage 1's bookkeeping (partitions, positions, local checkpoint, changelog);
- :mod:`streams.rebuild`: stage 2's models rebuilt from the observations topic;
- :mod:`streams.refits`: refit scheduling; :mod:`streams.views`: HTTP views; :mod:`streams.metrics`;
- :mod:`streams.readers`: the solo-profile follower and the partition reader;
- :mod:`streams.serving` and :mod:`streams.sharded`: serving sharded by GPU from model snapshots (setting
  ``serving`` sharded).

``create_app(settings)`` builds a fresh app (tests build one per test);
:func:`run_worker` runs it until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import faust
from faust.sensors import Monitor
from faust.types import TP

from config import Settings
from events import (
    JobEvent,
    MetricSample,
    Observation,
    Prediction,
    RecordError,
    Rejected,
    SoloProfile,
    Topics,
    decode,
    encode,
    job_events,
    metric_samples,
    observation_batches,
)
from events import observations as read_observations
from events.topics import LIFECYCLE, METRICS
from models import parallel
from streams import changelog, outputs, views
from streams.checkpoint import Checkpoint, TopicPartition
from streams.consumer import App
from streams.deadletters import dead_letter
from streams.interference_metrics import HORIZON_WINDOWS, InterferenceMetrics
from streams.membership import GroupWatch
from streams.metrics import StreamMetrics, dead_letter_reason
from streams.profiles import LOCAL
from streams.readers import PartitionReader, TopicFollower
from streams.rebuild import Rebuild
from streams.refits import Refits
from streams.serving import LearnAndServe, Output, Serving, idle_prediction
from streams.snapshots import Snapshots
from streams.stage1 import LateEvent, Stage1
from streams.stage2 import Stage2
from streams.state import Stage1State

log = logging.getLogger(__name__)


InputRecord = MetricSample | JobEvent


def decode_input(topic: str, value: bytes | None) -> list[InputRecord] | None:
    """The stage-1 records of one per-GPU input message of base topic ``topic`` (None: not an input topic);
    a host's batch is read by :func:`events.metric_samples` or :func:`events.job_events` (``Streams.on_host_batch``).

    Raises :class:`events.RecordError` for a message that is not a valid record.
    """
    if topic == METRICS:
        return [decode(MetricSample, value)]
    if topic == LIFECYCLE:
        return [decode(JobEvent, value)]
    return None


STAGE2_OUTPUT_EVERY = 200
"""Stage 2 publishes what it made, and lets the event loop run, after at most about this many observations (a
record's observations are not split: an ObservationBatch holds up to 1,024)."""
GROUP_STUCK_AFTER_S = 60.0
"""A worker out of a stable consumer-group generation this long says so in its log (:class:`GroupWatch`): well beyond
a rebalance here (a static member's join and sync take 3 s each on the embedded broker; the session timeout is 10 s)."""
AUTO_COMMIT_OFF_S = 10.0**9  # faust's periodic commit timer: effectively never
AUTO_COMMIT_OFF_EVERY = 2**62  # faust's commit every N acked messages: never


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
    """faust settings for the broker at hand (Tansu holds a static member's JoinGroup and SyncGroup 3 s each; a worker
    leaves its group when it stops: docs/RELIABILITY.md, History 14)."""
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
        fetch_max_wait_s=settings.fetch_max_wait_s,
        leave_group_on_stop=settings.leave_group_on_stop,
    )


class Streams:
    """One worker's app, processors and metrics (attributes for tests and views)."""

    def __init__(
        self, settings: Settings, *, web: bool = True, web_port: int | None = None, clock: Any = time.time, stage2: bool = True
    ) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.clock = clock
        self.app = App(
            app_id(settings), monitor=WorkerMonitor(self.on_commit_initiated), **app_config(settings, web=web, web_port=web_port)
        )
        app = self.app
        t = self.topics
        self.inputs = app.topic(t.metrics, t.lifecycle, key_serializer="raw", value_serializer="raw")
        self.observations = app.topic(t.observations, key_serializer="raw", value_serializer="raw")
        self.profiles_topic = app.topic(t.profiles, key_serializer="raw", value_serializer="raw")
        self.changelog_topic = app.topic(t.stage1_changelog, key_serializer="raw", value_serializer="raw")
        self.snapshots_topic = app.topic(t.snapshots, key_serializer="raw", value_serializer="raw")
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
            every_window=True,
        )
        self.follower: TopicFollower | None = None
        self.writer_id = f"{group_instance_id(settings) or socket.gethostname()}-{os.getpid()}"
        self.state = Stage1State(
            self.stage1,
            state_dir(settings) / "stage1.json",
            send=lambda key, value, partition: self.changelog_topic.send_soon(key=key, value=value, partition=partition),
            read=functools.partial(changelog.read_partition, settings, t.stage1_changelog, writer=self.writer_id),
            writer_id=self.writer_id,
            offsets=Checkpoint(commit=lambda: self.commit({t.metrics, t.lifecycle})),
            buckets=settings.changelog_buckets,
        )
        self.state.load_checkpoint()
        self.sharded = settings.serving == "sharded"
        self.stage2 = Stage2(
            state_dir=state_dir(settings), max_pct=settings.prediction_max_pct, refit_max_lag_s=settings.refit_max_lag_s
        )
        self.serving = Serving(
            settings.alert_threshold_pct, settings.alert_clear_pct, clock=clock, max_pct=settings.prediction_max_pct,
            learner=None if self.sharded else self.stage2,
        )  # fmt: skip
        """Sharded: the GPUs of this worker's stage 1, from the latest snapshots; stage2: the observations learned
        here, from the learner's models."""
        self.learn_serve = LearnAndServe(self.stage2, self.serving)
        self.metrics = StreamMetrics(
            self.stage1.counters,
            self.stage2.counters,
            leaderboards=lambda: self.stage2.leaderboards,
            highwater=self._highwater,
            held=lambda: self.stage1.held_count(),
            group=lambda: (self.group.out_for(), self.group.episodes),
        )
        self.interference = InterferenceMetrics(
            settings.alert_threshold_pct, settings.alert_clear_pct, horizon_s=HORIZON_WINDOWS * settings.window_s
        )
        self.metrics.registry.register(self.interference)
        self.snapshots = Snapshots(
            settings,
            self.stage2,
            self.serving,
            lambda k, v: self.snapshots_topic.send_soon(key=k, value=v),
            self.metrics.published,
        )
        self.refits = Refits(self.stage2, self.on_refit)
        self.rebuild = Rebuild(
            self.stage2,
            self.refits,
            lambda p, start, end: PartitionReader(settings, t.observations, p, start, end),
            lambda env, board: self.send("leaderboard", env, board),
        )
        self.deliveries = outputs.Deliveries(self.stage1.counters)
        self.group = GroupWatch(GROUP_STUCK_AFTER_S, describe=lambda: str(self.app.group_member()))
        """Liveness of this worker's group membership: a wedged rebalance is logged with its reason."""
        self._own_commit = False
        self._tps: dict[tuple[str, int], tuple[TP, TopicPartition]] = {}  # (base topic, partition) -> (faust TP, ours)
        self._bases: dict[str, str] = {}  # full topic name -> base name
        self._register(stage2)

    # stage 1's bookkeeping lives in ``self.state`` (streams/state.py); these names stay for tests and views
    @property
    def positions(self) -> dict[TopicPartition, int]:
        return self.state.positions

    @property
    def gpu_partition(self) -> dict[str, int]:
        return self.state.gpu_partition

    @property
    def checkpoint_path(self) -> Path:
        return self.state.checkpoint_path

    @property
    def checkpoints(self) -> int:
        return self.state.checkpoints

    def load_checkpoint(self) -> bool:
        return self.state.load_checkpoint()

    def checkpoint(self) -> None:
        self.state.checkpoint()

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
        self.publish_observations(released)

    def follow_profiles(self) -> TopicFollower:
        loop = asyncio.get_running_loop()
        self.follower = TopicFollower(
            self.settings, self.topics.profiles, lambda recs: loop.call_soon_threadsafe(self.apply_profiles, recs)
        ).start()
        return self.follower

    # ------------------------------------------------------- serving sharded
    async def on_refit(self, env: str, board: Any) -> None:
        """A refit was applied (no await since): its leaderboard, and with serving sharded its snapshot."""
        if self.sharded:
            self.snapshots.warming.add(env)  # before the first await: no snapshot with the batch models dumped here
        await self.send("leaderboard", env, board)
        if self.sharded:
            await self.snapshots.after_refit(env)

    def serve(self, observations: Iterable[Observation]) -> None:
        """Serving sharded: the predictions and alerts of observations of GPUs read here (sent, not awaited)."""
        for obs in observations:
            st = self.stage1.gpus.get(obs.gpu_uuid)
            raised = st.raised if st is not None else []
            before = len(raised)
            out = self.serving.serve(obs, raised)
            if st is not None and (out.alerts or len(raised) != before):
                self.state.touched.add(obs.gpu_uuid)  # its alert state goes to the changelog with the GPU
            self.interference.observe(obs, out.predictions, out.alerts)
            self.publish_served(out)

    def publish_served(self, out: Output) -> None:
        """Buffer what serving an observation gave, its predictions and alerts, for the producer: not awaited, as
        :meth:`emit_observation`'s observations (an awaited send each held stage 2 at about 1 ms per record)."""
        for p in out.predictions:
            self.publish_prediction(p)
        for a in out.alerts:
            self.out["alerts"].send_soon(key=a.gpu_uuid.encode(), value=encode(a))
        self.metrics.published["alerts"] += len(out.alerts)

    def publish_prediction(self, p: Prediction) -> None:
        """Buffer one prediction for the producer; count it, and its delay from its window's end."""
        self.out["predictions"].send_soon(key=p.gpu_uuid.encode(), value=encode(p))
        self.metrics.published["predictions"] += 1
        if p.window_end is not None:
            self.metrics.prediction_delay.observe(max(0.0, p.ts - p.window_end))  # a replay's event time may be ahead

    def on_commit_initiated(self) -> None:
        """Before faust commits offsets (our timers, a rebalance, a clean stop): take the state they cover, and put
        the changelog and profiles in the producer's buffer.  faust then flushes the buffer, which waits until every
        output is acknowledged and only then writes the stage-1 checkpoint taken here (:mod:`streams.outputs`)."""
        self.guard_outputs()
        self.publish_profiles()
        self.publish_changelog()
        self.state.prepare_checkpoint()
        if not self._own_commit:  # a commit of every topic: observations too
            self.stage2.save()

    def publish_changelog(self) -> int:
        sent = self.state.publish_changelog()
        self.metrics.published["stage1_changelog"] += sent
        return sent

    async def commit(self, topics: set[str]) -> bool:
        """Commit the acked offsets of ``topics`` (the state they cover was just saved by the caller)."""
        self._own_commit = True
        try:
            return bool(await self.app.consumer.commit(topics))
        finally:
            self._own_commit = False

    def guard_outputs(self) -> None:
        """Outputs acknowledged before offsets are committed and the checkpoint written (once; :mod:`streams.outputs`)."""
        outputs.guard(self.app.producer, self.deliveries, self.state.write_prepared)

    async def checkpoint_and_commit(self) -> None:
        await self.state.offsets.commit()  # the input offsets; on_commit_initiated takes the checkpoint first
        await self.app.producer.buffer.flush()  # no offsets to commit: faust did not flush, and the checkpoint waits

    async def save_models_and_commit(self) -> None:
        self.stage2.save()
        await self.commit({self.topics.observations})
        self.stage2.counters["models_saved_committed"] += 1  # saved, and the offsets it covers committed

    def on_partitions_revoked(self, _sender: Any, revoked: Any = (), **_: Any) -> None:
        """A rebalance started: this worker is out of a stable generation until its next assignment."""
        self.group.rebalancing()

    def on_partitions_assigned(self, _sender: Any, assigned: Any = (), **_: Any) -> None:
        """Read the changelog of input partitions new here, forget GPUs of those now assigned elsewhere."""
        self.group.assigned()
        inputs = {self.topics.metrics, self.topics.lifecycle}
        before = set(self.gpu_partition)
        self.state.assign({tp.partition for tp in assigned if tp.topic in inputs})
        self.serving.forget(before - set(self.gpu_partition))
        self.snapshots.assign({tp.partition for tp in assigned if tp.topic == self.topics.observations})

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
        applied = self.state.offsets.applied(self._tp(LIFECYCLE, partition)[1])
        return high is None or (applied is None and high > 0) or (applied is not None and applied + 1 < high)

    def _tp(self, topic: str, partition: int) -> tuple[TP, TopicPartition]:
        """(faust TP, :class:`TopicPartition` of the checkpoint) of a base topic name and partition, built once
        (asked per event)."""
        names = self._tps.get((topic, partition))
        if names is None:
            names = self._tps[(topic, partition)] = (TP(self.topics.name(topic), partition), TopicPartition(topic, partition))
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

    def publish_observations(self, observations: list[Observation]) -> None:
        """Emit observations and count them as published (observations, not records): one :class:`ObservationBatch`
        per environment (setting ``observation_batch_bytes``), or one record each (0)."""
        if not observations:
            return
        if self.settings.observation_batch_bytes:
            self.emit_observations(observations)
        else:
            for o in observations:
                self.emit_observation(o)
        self.metrics.published["observations"] += len(observations)
        if self.sharded:
            self.serve(observations)

    def emit_observations(self, observations: list[Observation]) -> None:
        """Buffer observations for the producer, as :class:`ObservationBatch` records of one environment each.

        Measured (docs/BENCHMARKS.md, "Host-batched samples", ninth session): one record per observation cost the
        host-batched stage 1 most of its time outside stage 1 itself (faust's and aiokafka's per-message work, and one
        produce request per few records); flushed before the input offsets are committed, as single records are."""
        for env, value, _n in observation_batches(observations, self.settings.observation_batch_bytes):
            self.observations.send_soon(key=env.encode(), value=value)

    def emit_observation(self, obs: Observation) -> None:
        """Buffer an observation for the producer.  Not awaited: an awaited faust send cost about
        1 ms per record here; faust flushes this buffer before it commits the input offsets,
        so delivery stays at least once."""
        self.observations.send_soon(key=obs.environment.encode(), value=encode(obs))

    def publish_idle(self) -> None:
        """Every idle window stage 1 closed: the GPU's answer, that a newcomer would run there alone."""
        for w in self.stage1.take_idle():
            types = [jt for env, jt in self.stage1.profiles.known() if env == w.environment]
            self.publish_prediction(idle_prediction(w.gpu_uuid, w.environment, w.window_end, types, now=self.clock()))

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
        replay = not self.state.offsets.store(self._tp(base, m.partition)[1], m.offset)
        try:
            if base == METRICS:
                samples = metric_samples(event.value)
                if samples.batched:  # a host's samples: each on its own (a bad one costs only itself)
                    return self.on_host_batch(event, samples.samples, samples.rejected, replay), None
                records: list[InputRecord] | None = list(samples.samples)
            elif base == LIFECYCLE:
                jobs = job_events(event.value)
                if jobs.batched:  # a host's job events, likewise
                    return self.on_host_batch(event, jobs.events, jobs.rejected, replay), None
                records = list(jobs.events)
            else:
                records = decode_input(base, event.value)
            if records is None:
                return [], f"unexpected topic {event.message.topic}"
            out: list[Observation] = []
            for record in records:
                self.state.read_from(record.gpu_uuid, m.partition)
                pending = self.lifecycle_pending(m.partition)
                if isinstance(record, MetricSample):
                    out.extend(self.stage1.on_metric(record, pending))
                else:
                    out.extend(self.stage1.on_job(record, pending))
            return out, None
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

    def on_host_batch(self, event: Any, records: list[InputRecord], rejected: list[Rejected], replay: bool) -> list[Observation]:
        """Stage 1 for each record of a host's batch (samples or job events), as for single records, except that a
        record that cannot be used (invalid, late, or failing stage 1) is dead-lettered alone, its own JSON as the
        payload."""
        m = event.message
        base = self._base(m.topic)
        errors = [(r.payload, f"invalid {base} record: {r.error}") for r in rejected]
        pending = self.lifecycle_pending(m.partition)
        self.state.read_all_from([r.gpu_uuid for r in records], m.partition)
        apply: Callable[[Any, bool], list[Observation]] = self.stage1.on_metric if base == METRICS else self.stage1.on_job
        out: list[Observation] = []
        for record in records:  # all of one kind: a batch is of one topic
            try:
                obs = apply(record, pending)
                if obs:
                    out.extend(obs)
            except LateEvent as exc:
                if replay:
                    self.stage1.counters["replayed_late"] += 1
                else:
                    errors.append((encode(record), str(exc)))
            except Exception as exc:  # a bug on one record must not cost the others
                log.exception("stage 1 failed on a record of %s p%s@%s", m.topic, m.partition, m.offset)
                errors.append((encode(record), f"stage 1 error: {type(exc).__name__}: {exc}"))
        for payload, error in errors:
            self.dead_letter_soon(event, payload, error, "stage1")
        return out

    def dead_letter_soon(self, event: Any, payload: bytes, error: str, stage: str) -> None:
        """Buffer a dead letter for part of ``event`` (``payload``); flushed before the input offsets are committed."""
        m = event.message
        record = dead_letter(self.topics.base(m.topic), m.partition, m.offset, payload, error, m.key, stage, now=self.clock())
        self.metrics.dead_letters[dead_letter_reason(error)] += 1
        self.out["deadletter"].send_soon(key=None if record.key is None else record.key.encode(), value=encode(record))
        self.metrics.published["deadletter"] += 1

    def _register(self, with_stage2: bool = True, with_views: bool = True) -> None:
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
            self.state.enabled = True
            self.guard_outputs()
            self.follow_profiles()
            if self.sharded:
                self.snapshots.follow()

        @app.timer(s.checkpoint_interval_s)
        async def checkpoint() -> None:
            await self.checkpoint_and_commit()

        @app.timer(s.models_save_interval_s)
        async def save_models() -> None:
            await self.save_models_and_commit()

        if with_views:
            views.register(app, self)

        app.on_partitions_assigned.connect(self.on_partitions_assigned)
        app.on_partitions_revoked.connect(self.on_partitions_revoked)

        @app.timer(5.0)
        async def group_liveness() -> None:
            self.group.check()

        self.agents = (stage1, stage2)

    async def stage1_event(self, event: Any) -> None:
        """Stage 1 for one event (``stage1_batch`` 1)."""
        await self.stage1_batch([event])

    async def stage1_batch(self, batch: Iterable[Any]) -> None:
        batch = list(batch)
        await self.before_stage1(batch)
        observations: list[Observation] = []
        for event in batch:
            obs, error = self.handle_input(event)
            if error is not None:
                await self.send_dead_letter(event, error, "stage1")
            elif obs:
                observations.extend(obs)
        self.publish_observations(observations)
        self.publish_idle()

    async def before_stage1(self, batch: list[Any]) -> None:
        """Before stage 1 applies ``batch``: read the changelog of its partitions not read since they were assigned
        here, then publish the job-windows adopted from their last owner whose solo profile is known here."""
        firsts: dict[int, dict[TopicPartition, int]] = {}
        for e in batch:  # in offset order per partition: the first seen is the first handed over
            m = e.message
            if not self.state.ready(m.partition):
                firsts.setdefault(m.partition, {}).setdefault(self._tp(self._base(m.topic), m.partition)[1], m.offset)
        if firsts:
            await self.state.restored(firsts)
        if self.state.released:  # a restore may have finished before this partition's first event
            self.publish_observations(self.state.take_released())

    async def stage2_batch(self, batch: Iterable[Any]) -> None:
        """Stage 2 for a batch: every observation first, then each environment's leaderboard (once per batch: a
        worker published only the batch's last one), then what they produced, so that the views' leaderboard is
        current before the batch's first prediction is out.  A batch of records holds up to 200 records, and with
        :class:`events.ObservationBatch` records many more observations: its outputs go out after every
        :data:`STAGE2_OUTPUT_EVERY` observations, as a batch of single records' did, and the event loop runs
        between."""
        outs: list[Output] = []
        envs: dict[str, None] = {}  # the environments of this batch, in order (a board goes out only when changed)
        for event in batch:
            if len(outs) >= STAGE2_OUTPUT_EVERY:
                await self.stage2_outputs(outs, envs)
                outs, envs = [], {}
                await asyncio.sleep(0)
            self._consumed(event)
            await self.rebuild.before(event.message.partition, event.message.offset)
            try:
                record = read_observations(event.value)  # one Observation, or an ObservationBatch
            except RecordError as exc:
                await self.send_dead_letter(event, f"invalid interference.observations record: {exc}", "stage2")
                continue
            self.metrics.consumed_observations += len(record.observations) + len(record.rejected)
            for rejected in record.rejected:  # an invalid observation of a batch: dead-lettered alone
                self.dead_letter_soon(event, rejected.payload, f"invalid interference.observations record: {rejected.error}", "stage2")
            for obs in record.observations:
                if self.stage2.behind(obs.environment, obs.window_end):
                    await self.refits.keep_up(obs.environment)
                try:
                    if self.sharded:  # served where the GPU's stage 1 runs (Streams.serve)
                        self.stage2.on_observation(obs, leaderboard=False)
                        out = Output()
                    else:
                        out = self.learn_serve.on_observation(obs, leaderboard=False)
                    self.metrics.observations[obs.environment] += 1
                    self.snapshots.learned(obs, event.message.partition)
                    envs[obs.environment] = None  # a solo window's too: its prediction is no earlier than its leaderboard
                except Exception as exc:
                    log.exception("stage 2 failed on p%s@%s", event.message.partition, event.message.offset)
                    error = f"stage 2 error: {type(exc).__name__}: {exc}"
                    if record.batched:  # the others of the batch are kept
                        self.dead_letter_soon(event, encode(obs), error, "stage2")
                    else:
                        await self.send_dead_letter(event, error, "stage2")
                    continue
                if not self.sharded:  # sharded: observed where the GPU is served (Streams.serve)
                    self.interference.observe(obs, out.predictions, out.alerts)
                outs.append(out)
        await self.stage2_outputs(outs, envs)

    async def stage2_outputs(self, outs: list[Output], envs: dict[str, None]) -> None:
        """What observations of ``envs`` gave: their predictions and alerts, each environment's leaderboard, the
        snapshots (serving sharded); then the refits due."""
        boards = [board for env in envs if (board := self.stage2.leaderboard_of(env)) is not None]
        for out in outs:
            self.publish_served(out)
        for board in boards:
            await self.send("leaderboard", board.environment, board)
        if self.sharded:
            self.snapshots.publish(envs)
        self.start_refits()

    def start_refits(self) -> None:
        """Run due refits in an executor; apply each on the event loop when it finishes."""
        self.refits.start_due()


def create_app(settings: Settings, **kwargs: Any) -> Streams:
    return Streams(settings, **kwargs)


def exit_within(seconds: float, exit: Callable[[int], None] = os._exit) -> threading.Timer:
    """A started watchdog that ends the process with exit code 1 (``exit(1)``) if it is still here ``seconds``
    from now (``cancel()`` disarms it)."""

    def leave() -> None:
        log.error(
            "the worker did not stop within %g s of the signal (broker unreachable?); exiting without the final save", seconds
        )
        logging.shutdown()
        exit(1)

    timer = threading.Timer(seconds, leave)
    timer.daemon = True
    timer.start()
    return timer


def faust_worker(app: faust.App, loglevel: str = "warn", stop_within_s: float = 45.0) -> Any:
    """A faust Worker without its terminal spinner.

    At a log level of WARN or above, faust's Worker sets the root logger to DEBUG and adds a
    handler that turns the spinner for every record, and keeps both after start-up: every
    debug call in faust and aiokafka (one per sent record, per broker response) then builds a
    LogRecord. Measured in the stage-1 bench: about 1 % of the worker's samples in logging.
    Without the spinner the root logger stays at ``loglevel``.

    After SIGINT or SIGTERM the process is gone within ``stop_within_s`` (``AIP_WORKER_STOP_WITHIN_S``): a clean
    stop takes seconds, but a busy worker whose broker went away meanwhile waited for it for good (measured: an
    orphaned worker still retrying 50 min later).  It then exits without its final save, which loses nothing:
    the committed offsets never run ahead of the saved state, and what is read again is deduplicated.
    """
    from faust.worker import Worker

    class BoundedStopWorker(Worker):  # type: ignore[misc]
        watchdog: threading.Timer | None = None

        def _schedule_shutdown(self, sig: Any) -> None:  # mode's Worker: SIGINT and SIGTERM both come here
            if self.watchdog is None:
                self.watchdog = exit_within(stop_within_s)
                parallel.stop()  # a refit in progress gives up at its next fit instead of holding the stop
            super()._schedule_shutdown(sig)

    levels = {"crit": "critical", "warn": "warning"}
    worker = BoundedStopWorker(app, loglevel=levels.get(loglevel, loglevel), quiet=True, redirect_stdouts=False)
    worker.spinner = None
    return worker


def run_worker(settings: Settings, *, loglevel: str = "warn", web_port: int | None = None) -> None:
    """Run one worker in this process until SIGINT or SIGTERM (faust's Worker stops cleanly on both)."""
    streams = create_app(settings, web_port=web_port)
    worker = faust_worker(streams.app, loglevel, settings.worker_stop_within_s)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    finally:
        for follower in (streams.follower, streams.snapshots.follower):
            if follower is not None:
                follower.stop()
        if streams.deliveries.pending:  # the broker has not got everything this state produced: keep the last checkpoint
            log.warning("%d outputs unacknowledged at stop: stage 1 restarts from its last checkpoint", len(streams.deliveries.pending))
        else:
            streams.checkpoint()
        streams.stage2.save()

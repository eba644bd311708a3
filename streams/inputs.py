"""Stage 1's loop in a worker: input events decoded and applied to :class:`streams.stage1.Stage1`, what cannot be used
dead-lettered with its reason, the observations, idle answers and solo profiles it makes published.  No faust here
but the events it is handed and the consumer's high-water marks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from faust.types import TP

from config import Settings
from events import (
    JobEvent,
    MetricSample,
    Observation,
    RecordError,
    Rejected,
    SoloProfile,
    Topics,
    decode,
    encode,
    job_events,
    metric_samples,
)
from events.topics import LIFECYCLE, METRICS
from streams.checkpoint import TopicPartition
from streams.deadletters import DeadLetters
from streams.interference_metrics import InterferenceMetrics
from streams.metrics import StreamMetrics
from streams.outputs import Publisher
from streams.readers import TopicFollower
from streams.serving import idle_prediction
from streams.stage1 import LateEvent, Stage1
from streams.state import Stage1State

log = logging.getLogger(__name__)

InputRecord = MetricSample | JobEvent

PROFILES_POLL_S = 2.0
"""The solo-profile follower's poll: records are handed over as soon as they come; an empty poll tells it nothing
(two idle followers with 5 s fetch waits: 0.29-0.34 % of a core polling every 0.5 s, 0.11 % every 2 s; docs/BENCHMARKS.md)."""


def decode_input(topic: str, value: bytes | None) -> list[InputRecord] | None:
    """The stage-1 records of one per-GPU input message of base topic ``topic`` (None: not an input topic);
    a host's batch is read by :func:`events.metric_samples` or :func:`events.job_events` (:meth:`Inputs.on_host_batch`).

    Raises :class:`events.RecordError` for a message that is not a valid record.
    """
    if topic == METRICS:
        return [decode(MetricSample, value)]
    if topic == LIFECYCLE:
        return [decode(JobEvent, value)]
    return None


class TopicNames:
    """Base names, partitions and high-water marks of the worker's topics, built once (asked per event)."""

    def __init__(self, topics: Topics, app: Any) -> None:
        self.topics = topics
        self.app = app
        self._tps: dict[tuple[str, int], tuple[TP, TopicPartition]] = {}  # (base topic, partition) -> (faust TP, ours)
        self._bases: dict[str, str] = {}  # full topic name -> base name

    def tp(self, topic: str, partition: int) -> tuple[TP, TopicPartition]:
        """(faust TP, :class:`TopicPartition` of the checkpoint) of a base topic name and partition."""
        names = self._tps.get((topic, partition))
        if names is None:
            names = self._tps[(topic, partition)] = (TP(self.topics.name(topic), partition), TopicPartition(topic, partition))
        return names

    def base(self, topic: str) -> str:
        """Base name of a full topic name."""
        base = self._bases.get(topic)
        if base is None:
            base = self._bases[topic] = self.topics.base(topic)
        return base

    def highwater(self, topic: str, partition: int) -> int | None:
        try:
            return int(self.app.consumer.highwater(self.tp(topic, partition)[0]))
        except Exception:  # not assigned here, or the consumer is not running
            return None

    def assigned(self, topic: str, partition: int) -> bool:
        """Whether this worker reads ``partition`` of ``topic`` (True when its consumer cannot say)."""
        try:
            return self.tp(topic, partition)[0] in self.app.consumer.assignment()
        except Exception:  # the consumer is not running
            return True


@dataclass(eq=False)
class Inputs:
    """Stage 1 for the events of the input topics, batch by batch (:meth:`stage1_batch`)."""

    settings: Settings
    stage1: Stage1
    state: Stage1State
    names: TopicNames
    publisher: Publisher
    dead_letters: DeadLetters
    metrics: StreamMetrics
    interference: InterferenceMetrics
    profiles_topic: Any
    clock: Callable[[], float]
    serve: Callable[[list[Observation]], None] | None = None
    """Setting ``serving`` sharded: serves the observations published here (:meth:`streams.stage2_loop.Stage2Loop.serve`)."""
    follower: TopicFollower | None = None

    # ------------------------------------------------------------------ the loop
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
                await self.dead_letters.send(event, error, "stage1")
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
                firsts.setdefault(m.partition, {}).setdefault(self.names.tp(self.names.base(m.topic), m.partition)[1], m.offset)
        if firsts:
            await self.state.restored(firsts)
        if self.state.released:  # a restore may have finished before this partition's first event
            self.publish_observations(self.state.take_released())

    def handle_input(self, event: Any) -> tuple[list[Observation], str | None]:
        """Stage 1 for one raw event: (observations, dead-letter reason or None); counts it as consumed.

        After a restart, events up to the offsets in the checkpoint were applied before: stage 1
        drops them as duplicates (seq, lifecycle resends), and one that is late against the
        restored windows is a replay too (counted as ``replayed_late``, not dead-lettered).
        """
        m = event.message
        base = self.names.base(m.topic)
        self.metrics.consumed_message(base, m.partition, m.offset)
        tp = self.names.tp(base, m.partition)[1]
        last = self.state.offsets.applied(tp)
        if last is not None and m.offset > last + 1:  # offsets skipped: never applied here, nor (the changelog says) before
            self.stage1.counters["input_offsets_skipped"] += m.offset - last - 1
            log.warning("stage 1 skipped offsets %d-%d of %s[%d]", last + 1, m.offset - 1, base, m.partition)
        replay = not self.state.offsets.store(tp, m.offset)
        try:
            if base == METRICS:
                samples = metric_samples(event.value)
                self.interference.observe_samples(samples.samples)
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

    def on_host_batch(self, event: Any, records: Sequence[InputRecord], rejected: list[Rejected], replay: bool) -> list[Observation]:
        """Stage 1 for each record of a host's batch (samples or job events), as for single records, except that a
        record that cannot be used (invalid, late, or failing stage 1) is dead-lettered alone, its own JSON as the
        payload."""
        m = event.message
        base = self.names.base(m.topic)
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
            self.dead_letters.soon(event, payload, error, "stage1")
        return out

    def lifecycle_pending(self, partition: int) -> bool:
        """Whether the lifecycle partition ``partition`` has records stage 1 has not applied yet.

        A GPU's samples and lifecycle events share a key (gpu_uuid), so they sit in
        partitions of the same number.  While that lifecycle partition is behind (fetched
        high-water mark beyond what stage 1 applied, or nothing fetched yet), the GPU's
        windows wait for it: reading a backlog, faust may hand over minutes of one
        partition's metrics before any of its lifecycle events (measured: up to 5,736 valid
        lifecycle events dead-lettered as late in the stage-1 bench before this rule).
        Asked per event: one batch can span minutes of event time.  A lifecycle partition this worker does not
        read (the topics created with different partition counts) is not waited for.
        """
        high = self.names.highwater(LIFECYCLE, partition)
        if high is None:
            return self.names.assigned(LIFECYCLE, partition)
        applied = self.state.offsets.applied(self.names.tp(LIFECYCLE, partition)[1])
        return (applied is None and high > 0) or (applied is not None and applied + 1 < high)

    # ------------------------------------------------------------------ what stage 1 makes
    def publish_observations(self, observations: list[Observation]) -> None:
        """Publish observations (:meth:`streams.outputs.Publisher.observations_out`); sharded, serve them here."""
        if not observations:
            return
        self.publisher.observations_out(observations)
        if self.serve is not None:
            self.serve(observations)

    def publish_idle(self) -> None:
        """Every idle window stage 1 closed: the GPU's answer, that a newcomer would run there alone."""
        for w in self.stage1.take_idle():
            types = [jt for env, jt in self.stage1.profiles.known() if env == w.environment]
            self.publisher.prediction(idle_prediction(w.gpu_uuid, w.environment, w.window_end, types, now=self.clock()))

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
            self.settings, self.names.topics.profiles, lambda recs: loop.call_soon_threadsafe(self.apply_profiles, recs),
            poll_s=PROFILES_POLL_S,
        ).start()  # fmt: skip
        return self.follower

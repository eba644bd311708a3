"""Stage 2's loop in a worker: observation records in, learned (and served with ``serving`` stage2), what they gave
published a batch at a time, then the refits due; with ``serving`` sharded, the observations of the GPUs read here
served from the latest snapshots (:meth:`Stage2Loop.serve`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from events import Observation, RecordError, encode
from events import observations as read_observations
from streams.deadletters import DeadLetters
from streams.inputs import TopicNames
from streams.interference_metrics import InterferenceMetrics
from streams.metrics import StreamMetrics
from streams.outputs import Publisher
from streams.rebuild import Rebuild
from streams.refits import Refits
from streams.serving import LearnAndServe, Output, Serving
from streams.snapshots import Snapshots
from streams.stage1 import Stage1
from streams.state import Stage1State

log = logging.getLogger(__name__)

STAGE2_OUTPUT_EVERY = 200
"""Stage 2 publishes what it made, and lets the event loop run, after at most about this many observations (a
record's observations are not split: an ObservationBatch holds up to 1,024)."""


class Stage2Loop:
    """Stage 2 for the batches of the observations topic, and serving in both settings."""

    def __init__(
        self,
        learn_serve: LearnAndServe,
        snapshots: Snapshots,
        *,
        sharded: bool,
        names: TopicNames,
        publisher: Publisher,
        dead_letters: DeadLetters,
        metrics: StreamMetrics,
        interference: InterferenceMetrics,
        stage1: Stage1,
        state: Stage1State,
    ) -> None:
        self.learn_serve = learn_serve
        self.stage2 = learn_serve.learner
        self.serving: Serving = learn_serve.serving
        self.snapshots = snapshots
        self.sharded = sharded
        self.names = names
        self.publisher = publisher
        self.dead_letters = dead_letters
        self.metrics = metrics
        self.interference = interference
        self.stage1 = stage1
        self.state = state
        self.refits = Refits(self.stage2, self.on_refit)
        self.rebuild: Rebuild | None = None
        """Set by the wiring (it reads the observations topic); None: no rebuild."""

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
            m = event.message
            self.metrics.consumed_message(self.names.base(m.topic), m.partition, m.offset)
            if self.rebuild is not None:
                await self.rebuild.before(m.partition, m.offset)
            try:
                record = read_observations(event.value)  # one Observation, or an ObservationBatch
            except RecordError as exc:
                await self.dead_letters.send(event, f"invalid interference.observations record: {exc}", "stage2")
                continue
            self.metrics.consumed_observations += len(record.observations) + len(record.rejected)
            for rejected in record.rejected:  # an invalid observation of a batch: dead-lettered alone
                self.dead_letters.soon(event, rejected.payload, f"invalid interference.observations record: {rejected.error}", "stage2")
            for obs in record.observations:
                if self.stage2.behind(obs.environment, obs.window_end):
                    await self.refits.keep_up(obs.environment)
                try:
                    out = self.learn(obs, m.partition)
                    envs[obs.environment] = None  # a solo window's too: its prediction is no earlier than its leaderboard
                except Exception as exc:
                    log.exception("stage 2 failed on p%s@%s", m.partition, m.offset)
                    error = f"stage 2 error: {type(exc).__name__}: {exc}"
                    if record.batched:  # the others of the batch are kept
                        self.dead_letters.soon(event, encode(obs), error, "stage2")
                    else:
                        await self.dead_letters.send(event, error, "stage2")
                    continue
                if not self.sharded:  # sharded: observed where the GPU is served (serve)
                    self.interference.observe(obs, out.predictions, out.alerts)
                outs.append(out)
        await self.stage2_outputs(outs, envs)

    def learn(self, obs: Observation, partition: int) -> Output:
        """Learn one observation; with ``serving`` stage2 serve it first, from the learner's models."""
        if self.sharded:  # served where the GPU's stage 1 runs (serve)
            self.stage2.on_observation(obs, leaderboard=False)
            out = Output()
        else:
            out = self.learn_serve.on_observation(obs, leaderboard=False)
        self.metrics.observations[obs.environment] += 1
        self.snapshots.learned(obs, partition)
        return out

    async def stage2_outputs(self, outs: list[Output], envs: dict[str, None]) -> None:
        """What observations of ``envs`` gave: their predictions and alerts, each environment's leaderboard, the
        snapshots (serving sharded); then the refits due."""
        boards = [board for env in envs if (board := self.stage2.leaderboard_of(env)) is not None]
        for out in outs:
            self.publisher.served(out)
        for board in boards:
            await self.publisher.send("leaderboard", board.environment, board)
        if self.sharded:
            self.snapshots.publish(envs)
        self.refits.start_due()

    async def on_refit(self, env: str, board: Any) -> None:
        """A refit was applied (no await since): its leaderboard, and with serving sharded its snapshot."""
        if not self.sharded:
            await self.publisher.send("leaderboard", env, board)
            return
        self.snapshots.warming.add(env)  # before the first await: no snapshot with the batch models dumped here
        try:
            await self.publisher.send("leaderboard", env, board)
        finally:  # a failed send must not leave the environment warming (no snapshot ever again)
            await self.snapshots.after_refit(env)

    def serve(self, observations: Iterable[Observation]) -> None:
        """Serving sharded: the predictions and alerts of observations of GPUs read here (sent, not awaited)."""
        observations = list(observations)
        for obs, served in zip(observations, self.serving.served_ahead(observations), strict=True):
            st = self.stage1.gpus.get(obs.gpu_uuid)
            raised = st.raised if st is not None else []
            before = len(raised)
            out = self.serving.serve(obs, raised, served)
            if st is not None and (out.alerts or len(raised) != before):
                self.state.touched.add(obs.gpu_uuid)  # its alert state goes to the changelog with the GPU
            self.interference.observe(obs, out.predictions, out.alerts)
            self.publisher.served(out)

"""Stage 2's models rebuilt from the ``interference.observations`` history (see docs/RELIABILITY.md).

When the stage-2 agent is handed a record beyond what its models cover (the partition was
another worker's, or there is no snapshot here), :class:`Rebuild` reads the missing range of
that partition with a consumer of its own, learns it without predicting or alerting, refits,
publishes the leaderboard, and only then lets the agent serve the record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from events import RecordError, observations
from streams.readers import PartitionReader
from streams.refits import Refits
from streams.stage2 import Stage2

log = logging.getLogger(__name__)


class Rebuild:
    """``reader(partition, start, end)`` opens a :class:`streams.readers.PartitionReader` (blocking: run in an executor)."""

    def __init__(
        self,
        stage2: Stage2,
        refits: Refits,
        reader: Callable[[int, int, int], PartitionReader],
        publish: Callable[[str, Any], Awaitable[None]],
    ) -> None:
        self.stage2 = stage2
        self.refits = refits
        self.reader = reader
        self.publish = publish

    async def before(self, partition: int, offset: int) -> None:
        """Called for each record the agent is handed: rebuild first when the models do not cover what precedes it."""
        start = self.stage2.start_of(partition)
        if offset > start:
            await self.run(partition, start, offset)
        self.stage2.applied(partition, offset)

    async def run(self, partition: int, start: int, end: int) -> set[str]:
        """Learn observations ``[start, end)`` of ``partition``, then refit; return the environments learned."""
        t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        reader = await loop.run_in_executor(None, self.reader, partition, start, end)
        envs: set[str] = set()
        learned = 0
        try:
            while not reader.done:
                for _offset, _key, value in await loop.run_in_executor(None, reader.read):
                    try:
                        record = observations(value)  # one Observation, or an ObservationBatch
                    except RecordError:
                        continue  # dead-lettered when it was first read
                    for obs in record.observations:  # an invalid one of a batch was dead-lettered alone
                        learned += self.stage2.replay(obs)
                        envs.add(obs.environment)
                await asyncio.sleep(0)
        finally:
            reader.close()
        self.stage2.applied(partition, end - 1)
        read_s = time.monotonic() - t0
        for env in sorted(envs):  # "it refits, then serves"
            await self.refits.now(env)
            board = self.stage2.leaderboard_of(env)
            if board is not None:
                await self.publish(env, board)
        self.stage2.counters["rebuilds"] += 1
        log.warning(
            "stage 2 rebuilt %s from observations p%d [%d, %d): %d learned in %.1f s; refit, serving after %.1f s",
            *(sorted(envs), partition, start, end, learned, read_s, time.monotonic() - t0),
        )
        return envs

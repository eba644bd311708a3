"""Refit scheduling for stage 2: due refits run in an executor, results are applied on the event loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from models.parallel import Stopped
from streams.stage2 import Stage2

log = logging.getLogger(__name__)


class Refits:
    """Runs each environment's refit at most once at a time; ``publish(env, board)`` sends a changed leaderboard.

    An executor thread, not a daemon thread: a daemon thread still inside torch or OpenMP when the
    interpreter exits aborts the process (SIGABRT, measured).  A stopping worker does not wait for a refit in
    progress: it gives up at its next fit (:func:`models.parallel.stop`), and the models keep their last fit.
    """

    def __init__(self, stage2: Stage2, publish: Callable[[str, Any], Awaitable[None]]) -> None:
        self.stage2 = stage2
        self.publish = publish
        self.running: set[str] = set()
        self._futures: set[asyncio.Future[None]] = set()

    def start_due(self) -> None:
        """Start every due refit in the background."""
        for env, task in self.stage2.refits_due():
            if env in self.running:
                continue
            self.running.add(env)
            future = asyncio.ensure_future(self._run(env, task))
            self._futures.add(future)
            future.add_done_callback(self._futures.discard)

    async def now(self, env: str) -> None:
        """Refit ``env`` now if it is due and none is running, and wait for it (after a rebuild: refit, then serve)."""
        models = self.stage2.models_for(env)
        if env in self.running or not models.refit_due():
            return
        self.running.add(env)
        await self._run(env, models.refit_task())

    async def _run(self, env: str, task: Any) -> None:
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(None, task)
            board = self.stage2.apply_refit(env, result)
            if board is not None:
                await self.publish(env, board)
        except Stopped as exc:
            self.stage2.apply_refit(env, None)  # no result: the models keep their last fit
            log.info("refit of %s given up, the worker is stopping (%s)", env, exc)
        except Exception:
            log.exception("refit of %s failed", env)
        finally:
            self.running.discard(env)

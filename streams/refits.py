"""Refit scheduling for stage 2: due refits run in an executor, results are applied on the event loop."""

from __future__ import annotations

import asyncio
import logging
import time
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
        self._futures: dict[str, asyncio.Future[None]] = {}

    def start_due(self) -> None:
        """Start every due refit in the background."""
        for env, task in self.stage2.refits_due():
            if env not in self.running:
                self._start(env, task)

    def _start(self, env: str, task: Any) -> asyncio.Future[None]:
        self.running.add(env)
        future = self._futures[env] = asyncio.ensure_future(self._run(env, task))
        future.add_done_callback(lambda f: self._futures.pop(env, None) if self._futures.get(env) is f else None)
        return future

    async def now(self, env: str) -> None:
        """Refit ``env`` now if it is due and none is running, and wait for it (after a rebuild: refit, then serve)."""
        self.stage2.models_for(env)
        if env in self.running or not self.stage2.due(env):
            return
        self.running.add(env)
        await self._run(env, self.stage2.refit_task(env))

    async def keep_up(self, env: str) -> None:
        """Wait for ``env``'s refit in flight, or start its due refit at once and wait for it (stage 2 is too far
        ahead of its models in event time: :meth:`streams.stage2.Stage2.behind`).  Counted: ``refits_awaited``
        and ``refit_await_ms`` (stage 2 counters)."""
        t0 = time.monotonic()
        future = self._futures.get(env)
        if future is None:
            if env in self.running or not self.stage2.due(env):
                return
            future = self._start(env, self.stage2.refit_task(env))
        await asyncio.shield(future)  # a cancelled caller (a stopping worker) leaves the refit to give up by itself
        self.stage2.counters["refits_awaited"] += 1
        self.stage2.counters["refit_await_ms"] += round((time.monotonic() - t0) * 1e3)

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

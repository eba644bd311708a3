"""Refits run in a daemon thread: results and errors come back, and a stopping worker does not wait."""

from __future__ import annotations

import asyncio
import threading

import pytest

from streams.app import in_daemon_thread


def test_result_and_error_come_back() -> None:
    async def main() -> None:
        assert await in_daemon_thread(lambda: 6 * 7, "t") == 42
        with pytest.raises(ZeroDivisionError):
            await in_daemon_thread(lambda: 1 / 0, "t")

    asyncio.run(main())


def test_the_thread_is_a_daemon_and_does_not_block_the_loop() -> None:
    release = threading.Event()
    seen: dict[str, bool] = {}

    def task() -> str:
        seen["daemon"] = threading.current_thread().daemon
        release.wait(5)
        return "done"

    async def main() -> str:
        pending = asyncio.ensure_future(in_daemon_thread(task, "refit-test"))
        await asyncio.sleep(0)  # the loop keeps running while the task blocks
        ticks = 0
        while not seen and ticks < 500:
            await asyncio.sleep(0.01)
            ticks += 1
        release.set()
        return await pending

    assert asyncio.run(main()) == "done"
    assert seen["daemon"] is True

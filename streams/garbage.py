"""The worker's cyclic garbage collector: tuned for a long-running stream processor, and timed.

CPython collects its youngest generation every 700 container objects allocated net, and every collection of the
oldest generation goes through every object the process holds: the modules of faust, the model libraries and the
app (about 357,000 objects after a worker's start) and what it keeps (windows, models, latest predictions).
Measured on ``aip bench fleet --quick --gpus 2000`` (two workers, 2026-12-05, :data:`CLOCK` per worker): with
Python's defaults, 800-1,300 young collections and 4-5 full ones (0.17-0.34 s each, the event loop stopped meanwhile)
in a run, 1.2-1.6 s of each worker's 11-16 s of CPU.  :func:`tune` takes the objects of the start out of every later
collection (:func:`gc.freeze`) and collects the young generation every ``gen0_threshold`` allocations: 9-19 young
collections and no full one then, 0.1-0.16 s a worker.  Garbage without cycles is freed by reference counting at once
either way; what waits longer is only garbage in cycles, until the next young collection (seconds apart).
"""

from __future__ import annotations

import gc
import time
from typing import Any

GENERATIONS = 3


class GcClock:
    """Seconds and collections per generation of the collector, from :data:`gc.callbacks` (two clock reads a
    collection).

    >>> c = GcClock()
    >>> c("start", {"generation": 0}); c("stop", {"generation": 0, "collected": 3})
    >>> c.collections, c.seconds[0] >= 0.0
    ([1, 0, 0], True)
    """

    def __init__(self) -> None:
        self.seconds = [0.0] * GENERATIONS
        self.collections = [0] * GENERATIONS
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        g = info["generation"]
        self.seconds[g] += time.perf_counter() - self._started
        self.collections[g] += 1

    def install(self) -> GcClock:
        """Time every collection of this process from now on (once: a second call changes nothing)."""
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self


CLOCK = GcClock()
"""The process's clock (the collector is the process's: several apps in one process share it)."""


def tune(gen0_threshold: int) -> int:
    """Collect once, freeze what is left out of every later collection, and collect the young generation every
    ``gen0_threshold`` container allocations, net (the setting ``gc_gen0_threshold``; Python's default is 700; the
    older generations' thresholds as they were); return how many objects were frozen.  ``gen0_threshold`` 0:
    Python's collector as it is (0 returned).  Called once a worker has started (its libraries imported, its app
    built): what is frozen then lives as long as the worker."""
    if gen0_threshold <= 0:
        return 0
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)
    return gc.get_freeze_count()

"""The arithmetic of the definitions (docs/ARCHITECTURE.md, "Definitions"): percent changes, throughput, interference rates.

Pure functions: no Kafka, no faust, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from events import PARAMETER_FIELDS, PARAMETERS

KEYS = (*PARAMETERS, "M")
"""Window-mean keys: the six parameters and memory used (MB)."""

FIELDS = (*(PARAMETER_FIELDS[p] for p in PARAMETERS), "mem_used_mb")
"""MetricSample field of each key in :data:`KEYS`, same order."""


def percent_change(mean: float | None, solo: float | None) -> float | None:
    """``(mean - solo) / solo * 100``; None when either is unknown or solo is 0.

    >>> percent_change(150.0, 100.0)
    50.0
    >>> percent_change(80.0, 0.0) is None
    True
    """
    if mean is None or solo is None or solo == 0:
        return None
    return (mean - solo) / solo * 100.0


def interference_rate(solo_throughput: float | None, colocated_throughput: float | None) -> float | None:
    """Slowdown in percent: ``(solo / colocated - 1) * 100``; 0 means none.

    >>> interference_rate(10.0, 8.0)
    25.0
    >>> interference_rate(10.0, None) is None
    True
    """
    if not solo_throughput or not colocated_throughput or solo_throughput <= 0 or colocated_throughput <= 0:
        return None
    return (solo_throughput / colocated_throughput - 1.0) * 100.0


def throughput(progress: Sequence[tuple[float, float | None]]) -> float | None:
    """Steps per second from progress reports ``(steps_done, step_time_s)``.

    Each report says ``steps_done`` steps took ``step_time_s`` each; the rate is
    total steps over total time (a step-weighted harmonic mean).  ``steps_done``
    None (the first report of a job) counts as one step.

    >>> throughput([(10, 0.1), (30, 0.2)])
    5.714285714285714
    >>> throughput([]) is None
    True
    """
    steps = 0.0
    seconds = 0.0
    for done, step_time in progress:
        if step_time is None or step_time <= 0:
            continue
        n = 1.0 if done is None or done <= 0 else float(done)
        steps += n
        seconds += n * step_time
    return steps / seconds if seconds > 0 else None


def means(sums: Sequence[float], counts: Sequence[int]) -> dict[str, float | None]:
    """Window means per key (None where no sample had the field).

    >>> means([300.0] + [0.0] * 6, [2] + [0] * 6)["E"]
    150.0
    """
    return {k: (s / c if c else None) for k, s, c in zip(KEYS, sums, counts, strict=True)}

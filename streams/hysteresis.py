"""Alert hysteresis: raise at the threshold, clear only below the clear level; the value a job's alert judges."""

from __future__ import annotations

from collections.abc import Iterable

from events import Observation, Prediction
from events.records import AlertSource, AlertState

MAX_RAISED = 16
"""Raised alerts a GPU remembers (its latest jobs')."""


def next_state(raised: bool, value: float, threshold: float, clear_level: float) -> bool:
    """The alert state after seeing ``value``.

    Between the clear level and the threshold the state is kept, so a value
    wandering around the threshold never flaps.

    >>> next_state(False, 55.0, 50.0, 35.0)
    True
    >>> next_state(True, 45.0, 50.0, 35.0)
    True
    >>> next_state(True, 30.0, 50.0, 35.0)
    False
    """
    if raised:
        return value >= clear_level
    return value >= threshold


def judge(raised: list[str], job_id: str, value: float, threshold: float, clear_level: float) -> AlertState | None:
    """Feed ``value`` to the hysteresis of ``job_id`` on a GPU whose jobs with a raised alert are ``raised``
    (updated in place, at most :data:`MAX_RAISED`); ``"raised"`` or ``"cleared"`` when the state changes, else None.

    >>> gpu: list[str] = []
    >>> [judge(gpu, "j", v, 50.0, 35.0) for v in (60.0, 40.0, 30.0)], gpu
    (['raised', None, 'cleared'], [])
    """
    before = job_id in raised
    after = next_state(before, value, threshold, clear_level)
    if after == before:
        return None
    if after:
        raised.append(job_id)
        del raised[:-MAX_RAISED]  # jobs that finished raised, long ago
        return "raised"
    raised.remove(job_id)
    return "cleared"


def alert_value(obs: Observation, predictions: Iterable[Prediction]) -> tuple[float | None, AlertSource]:
    """The value a job's alert hysteresis judges for this observation, and its source: the measured rate when the
    job reports progress, else the observed-mode prediction among ``predictions`` (None: there is none); a job alone
    on its GPU (a solo window) is not slowed.  The same value is the Prometheus series the alert rule reads
    (:mod:`streams.interference_metrics`)."""
    if obs.occupancy == "solo":
        return 0.0, "measured"
    if obs.interference_pct is not None:
        return obs.interference_pct, "measured"
    for p in predictions:
        if p.mode == "observed":
            return p.interference_pct, "predicted"
    return None, "predicted"

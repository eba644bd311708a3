"""Alert hysteresis: raise at the threshold, clear only below the clear level."""

from __future__ import annotations


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


class AlertStates:
    """Alert state per key (gpu_uuid, job_id), bounded: the least recently seen keys are forgotten."""

    def __init__(self, threshold: float, clear_level: float, capacity: int = 100_000) -> None:
        self.threshold = threshold
        self.clear_level = clear_level
        self.capacity = capacity
        self._raised: dict[tuple[str, str], bool] = {}

    def update(self, key: tuple[str, str], value: float) -> str | None:
        """Feed one value; return ``"raised"`` or ``"cleared"`` when the state changes, else None."""
        before = self._raised.pop(key, False)
        after = next_state(before, value, self.threshold, self.clear_level)
        self._raised[key] = after
        if len(self._raised) > self.capacity:
            del self._raised[next(iter(self._raised))]
        if after == before:
            return None
        return "raised" if after else "cleared"

    def is_raised(self, key: tuple[str, str]) -> bool:
        return self._raised.get(key, False)

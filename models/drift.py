"""Drift of what is served: an ADWIN detector per mode (river's ``drift.ADWIN``) on the absolute error of the served
prediction, computed before the observation is learned.  A rise of the error (a fall is learning, not drift) requests
a refit.  No Kafka, no faust.
"""

from __future__ import annotations

from typing import Any

from events import MODES


class ServedErrorDrift:
    """Per mode, an ADWIN detector on the served prediction's absolute error; :attr:`detected` until :meth:`reset`."""

    def __init__(self) -> None:
        self.events = 0
        """Rises of the error detected so far."""
        self.detected = False
        self.detectors: dict[str, Any] = {}
        self.reset()

    def reset(self) -> None:
        """Fresh detectors, nothing detected (after a refit)."""
        from river import drift

        self.detectors = {mode: drift.ADWIN(delta=0.002, clock=16) for mode in MODES}
        self.detected = False

    def update(self, mode: str, error: float) -> None:
        det = self.detectors[mode]
        before = det.estimation
        det.update(error)
        if det.drift_detected and det.estimation > before:  # the error rose (a fall is learning, not drift)
            self.detected = True
            self.events += 1

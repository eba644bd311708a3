"""Topic names and which record each one carries.

Every name can carry a prefix (setting ``topic_prefix``), so that tests and
tenants get their own topics on a shared broker.
"""

from __future__ import annotations

from dataclasses import dataclass

from events.records import (
    Alert,
    DeadLetter,
    HostJobEvents,
    HostMetrics,
    JobEvent,
    Leaderboard,
    MetricSample,
    Observation,
    ObservationBatch,
    Prediction,
    SoloProfile,
)

METRICS = "gpu.metrics"
LIFECYCLE = "jobs.lifecycle"
OBSERVATIONS = "interference.observations"
PREDICTIONS = "interference.predictions"
ALERTS = "interference.alerts"
LEADERBOARD = "models.leaderboard"
DEADLETTER = "aip.deadletter"
PROFILES = "interference.profiles"
STAGE1_CHANGELOG = "aip.stage1.changelog"
SNAPSHOTS = "models.snapshots"
INTERNAL = (STAGE1_CHANGELOG, SNAPSHOTS)
"""Topics the workers keep their own state in (no record class: not for other readers)."""
COMPACTED = (PROFILES, STAGE1_CHANGELOG, SNAPSHOTS)
"""Topics whose records are the latest value per key (``cleanup.policy=compact``)."""

RECORD_OF: dict[str, type] = {
    METRICS: MetricSample,
    LIFECYCLE: JobEvent,
    OBSERVATIONS: Observation,
    PREDICTIONS: Prediction,
    ALERTS: Alert,
    LEADERBOARD: Leaderboard,
    DEADLETTER: DeadLetter,
    PROFILES: SoloProfile,
}
ALL = tuple(RECORD_OF)
BATCH_OF: dict[str, type] = {METRICS: HostMetrics, LIFECYCLE: HostJobEvents, OBSERVATIONS: ObservationBatch}
"""Topics that also carry batches of their record: one per host and tick, :class:`HostMetrics` on ``gpu.metrics``
and :class:`HostJobEvents` on ``jobs.lifecycle``; one per environment and stage-1 input batch, :class:`ObservationBatch`
on ``interference.observations``."""


class _Name:
    """A topic's full name under the prefix of the :class:`Topics` it is read from (its base name on the class)."""

    def __init__(self, base: str) -> None:
        self.base = base

    def __get__(self, topics: Topics | None, owner: type | None = None) -> str:
        return self.base if topics is None else topics.prefix + self.base


@dataclass(frozen=True)
class Topics:
    """The project's topic names under one prefix.

    >>> Topics("t1.").metrics
    't1.gpu.metrics'
    >>> Topics("t1.").base("t1.jobs.lifecycle")
    'jobs.lifecycle'
    """

    prefix: str = ""

    metrics = _Name(METRICS)
    lifecycle = _Name(LIFECYCLE)
    observations = _Name(OBSERVATIONS)
    predictions = _Name(PREDICTIONS)
    alerts = _Name(ALERTS)
    leaderboard = _Name(LEADERBOARD)
    deadletter = _Name(DEADLETTER)
    profiles = _Name(PROFILES)
    stage1_changelog = _Name(STAGE1_CHANGELOG)
    snapshots = _Name(SNAPSHOTS)

    def all(self) -> tuple[str, ...]:
        return tuple(self.prefix + name for name in ALL)

    def internal(self) -> tuple[str, ...]:
        return tuple(self.prefix + name for name in INTERNAL)

    def name(self, base: str) -> str:
        """Full name of a base topic name; a name that already has the prefix is kept."""
        if base.startswith(self.prefix) and base[len(self.prefix) :] in RECORD_OF:
            return base
        return self.prefix + base

    def base(self, name: str) -> str:
        """The base name (without prefix) of a full topic name."""
        return name[len(self.prefix) :] if self.prefix and name.startswith(self.prefix) else name

    def record_of(self, name: str) -> type | None:
        return RECORD_OF.get(self.base(name))

"""The state of an environment's models (:meth:`models.environment.EnvironmentModels.to_state`): msgspec Structs,
estimators' bytes included, the one form that local persistence (:mod:`models.persist`) and serving snapshots
(:mod:`models.snapshot`) both write and read.
"""

from __future__ import annotations

import msgspec

from models.candidates import EstimatorState, RecordState
from models.datasets import Sample
from models.live import MeasurementsState
from models.modelconfig import ModelConfig

FORMAT = 3
"""The state format (2: estimators in files beside the state; not read)."""


class CandidateState(msgspec.Struct):
    key: tuple[str, str, str]
    kind: str
    record: RecordState
    estimator: EstimatorState | None = None


class ComposeState(msgspec.Struct, array_like=True):
    """A saved :class:`models.compose.ComposeScore`'s sums."""

    n: int
    composed_abs: float
    served_abs: float


class EnvironmentState(msgspec.Struct):
    format: int
    environment: str
    seed: int
    config: ModelConfig
    observations: int
    last_refit: float | None
    refit_seconds: float | None
    refits: int
    since_refit: int
    clipped: int
    measurements: MeasurementsState
    own_slots: list[str]
    candidates: list[CandidateState]
    history: list[Sample]
    compose: dict[str, ComposeState] = {}
    """:attr:`EnvironmentModels.compose_scores <models.environment.EnvironmentModels.compose_scores>` by ``seen``
    (``"true"``/``"false"``)."""
    many_residuals: list[float] = []
    seen_residuals: list[float] = []
    novel_residuals: list[float] = []
    """The environment's log-ratio residual windows (the intervals they widen are served too)."""
    serving: bool = False
    """Only what serving needs (:meth:`models.selector.Selector.served_keys`' candidates, no history): a snapshot."""
    window_counts: list[tuple[float, int]] = []
    """:attr:`EnvironmentModels.window_counts <models.environment.EnvironmentModels.window_counts>` as (window end,
    observations) pairs."""

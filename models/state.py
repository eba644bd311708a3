"""The saved state of an environment's models: msgspec Structs, encoded by :func:`models.persist.write_state`.

Estimators are saved beside it in their own formats (:mod:`models.persist`): what the state holds of each
candidate is its record and where its estimator is (or, for a baseline, the estimator itself).
"""

from __future__ import annotations

import msgspec

from models.candidates import EstimatorState, RecordState
from models.datasets import Sample
from models.live import MeasurementsState
from models.modelconfig import ModelConfig

FORMAT = 2
"""The state format (1: before issue 22, hand-written JSON; not read)."""


class CandidateState(msgspec.Struct):
    key: tuple[str, str, str]
    kind: str
    record: RecordState
    estimator: EstimatorState | None = None


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

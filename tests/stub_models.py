"""Environment models with fixed, hand-computable answers, for the what-if checks of serving."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from events import Observation
from models.environment import PlacementAsk, PredictionResult

SERVED_PCT = 7.0
"""What the stub answers for a running job (both modes)."""


def linear_pct(solo: Mapping[str, float | None], co_solos: Sequence[Mapping[str, float | None]]) -> float:
    """The stub's slowdown of a job: 0.1 x its own solo power plus 0.01 x its co-runners' summed, in %."""
    return 0.1 * float(solo["E"] or 0.0) + 0.01 * sum(float(c["E"] or 0.0) for c in co_solos)


class LinearModels:
    """Stands in for :class:`models.environment.EnvironmentModels` where serving reads it: a what-if's slowdown is
    :func:`linear_pct` of the profiles asked about; a running job's is :data:`SERVED_PCT`."""

    def __init__(self, environment: str = "v100") -> None:
        self.environment = environment
        self.refits = 0
        self.observations = 0
        self.measurements = SimpleNamespace(types=set())
        self.config = SimpleNamespace(max_pct=300.0)
        self.asks: list[PlacementAsk] = []

    def predict_placements(self, asks: Sequence[PlacementAsk], *, pairs: Any = None) -> list[PredictionResult | None]:
        self.asks.extend(asks)
        return [PredictionResult(linear_pct(solo, co_solos), "stub", "all", "placement", None) for _, solo, _, co_solos in asks]

    def pair_table(self, profiles: Mapping[str, Mapping[str, float | None]]) -> dict[Any, PredictionResult | None]:
        """No pairs tabled: every question reaches :meth:`predict_placements`, whose asks the tests read."""
        return {}

    def serve(self, obs: Observation) -> Any:
        results = {mode: PredictionResult(SERVED_PCT, "stub", "all", mode, None) for mode in ("observed", "placement")}
        return SimpleNamespace(results=results, withheld=0)

    def learn(self, obs: Observation, served: Any = None) -> None:
        self.observations += 1

"""The interface the stream hosts: all models of one environment (GPU model).

The stream calls, per environment:

* ``learn(obs)`` for every labelled observation (``interference_pct`` known);
  online learners update prequentially (predict, score, then learn);
* ``predict(obs, mode)`` for an observation of a running co-location, in
  ``observed`` mode (percent changes) or ``placement`` mode (solo profiles);
* ``predict_placement(...)`` for what-if questions about a hypothetical job set;
* ``refit_due()``, then ``task = refit_task()`` (a snapshot: a plain function
  the stream runs in an executor), then ``apply_refit(task())`` on the event loop;
* ``leaderboard()`` for the ``models.leaderboard`` record;
* ``save(dir)`` / ``EnvironmentModels.load(dir)`` for local persistence.

This module never imports kafka or faust.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from events import CATEGORIES, PARAMETERS, Leaderboard, LeaderboardEntry, Observation

PLACEMENT_KEYS = (*PARAMETERS, "M", "throughput")


@dataclass(frozen=True)
class PredictionResult:
    interference_pct: float
    model: str
    category: str
    mode: str
    expected_error_pct: float | None


def observed_features(obs: Observation, category: str = "all") -> dict[str, float]:
    """Percent changes of the category's parameters (missing ones left out)."""
    out = {}
    for p in CATEGORIES[category]:
        value = obs.pct(p)
        if value is not None:
            out[f"{p}_pct"] = value
    return out


def placement_features(
    job_solo: Mapping[str, float | None], co_solos: Sequence[Mapping[str, float | None]], category: str = "all"
) -> dict[str, float]:
    """The job's solo profile and the summed solo profiles of its co-runners."""
    keys = (*CATEGORIES[category], "M")
    out: dict[str, float] = {"n_co": float(len(co_solos))}
    for k in keys:
        v = job_solo.get(k)
        if v is not None:
            out[f"solo_{k}"] = float(v)
        total = sum(float(s[k]) for s in co_solos if s.get(k) is not None)
        if co_solos:
            out[f"other_solo_{k}"] = total
    return out


class EnvironmentModels:
    """Minimal implementation: one river LinearRegression per mode x category, prequential MAE."""

    def __init__(self, environment: str, *, seed: int = 0) -> None:
        from river import linear_model, optim, preprocessing

        self.environment = environment
        self.seed = seed
        self.observations = 0
        self.last_refit: float | None = None
        self._learners: dict[tuple[str, str], Any] = {}
        self._abs_err: dict[tuple[str, str], list[float]] = {}
        for mode in ("observed", "placement"):
            for cat in CATEGORIES:
                self._learners[(mode, cat)] = preprocessing.StandardScaler() | linear_model.LinearRegression(
                    optimizer=optim.SGD(0.01), l2=0.001
                )
                self._abs_err[(mode, cat)] = []

    def _features(self, obs: Observation, mode: str, cat: str) -> dict[str, float]:
        if mode == "observed":
            return observed_features(obs, cat)
        return placement_features(obs.solo, obs.co_solo, cat)

    def learn(self, obs: Observation) -> None:
        if obs.interference_pct is None:
            return
        self.observations += 1
        for (mode, cat), learner in self._learners.items():
            x = self._features(obs, mode, cat)
            if not x:
                continue
            err = self._abs_err[(mode, cat)]
            err.append(abs(float(learner.predict_one(x)) - obs.interference_pct))
            del err[:-500]
            learner.learn_one(x, obs.interference_pct)

    def _best_category(self, mode: str) -> str:
        def mae(cat: str) -> float:
            err = self._abs_err[(mode, cat)]
            return sum(err) / len(err) if err else float("inf")

        return min(CATEGORIES, key=mae)

    def predict(self, obs: Observation, mode: str) -> PredictionResult | None:
        if self.observations == 0:
            return None
        cat = self._best_category(mode)
        x = self._features(obs, mode, cat)
        if not x:
            return None
        err = self._abs_err[(mode, cat)]
        return PredictionResult(
            float(self._learners[(mode, cat)].predict_one(x)), "river.LinearRegression", cat, mode, sum(err) / len(err) if err else None
        )

    def predict_placement(
        self,
        job_type: str,
        job_solo: Mapping[str, float | None],
        co_job_types: Sequence[str],
        co_solos: Sequence[Mapping[str, float | None]],
    ) -> PredictionResult | None:
        if self.observations == 0:
            return None
        cat = self._best_category("placement")
        x = placement_features(job_solo, co_solos, cat)
        err = self._abs_err[("placement", cat)]
        return PredictionResult(
            float(self._learners[("placement", cat)].predict_one(x)),
            "river.LinearRegression",
            cat,
            "placement",
            sum(err) / len(err) if err else None,
        )

    def refit_due(self) -> bool:
        return False

    def refit_task(self) -> Callable[[], Any]:
        return lambda: None

    def apply_refit(self, result: Any) -> None:
        self.last_refit = time.time()

    def leaderboard(self) -> Leaderboard:
        entries = []
        selected = {}
        for (mode, cat), err in self._abs_err.items():
            entries.append(
                LeaderboardEntry(
                    model="river.LinearRegression", category=cat, mode=mode, kind="online", samples=len(err),
                    mae=sum(err) / len(err) if err else None,
                )
            )
            selected[f"{mode}:{cat}"] = "river.LinearRegression"
        return Leaderboard(
            ts=time.time(), environment=self.environment, entries=entries, selected=selected,
            observations=self.observations, last_refit=self.last_refit,
        )

    def save(self, directory: Path) -> None:
        raise NotImplementedError("persistence comes with the models issue")

    @classmethod
    def load(cls, directory: Path) -> EnvironmentModels:
        raise NotImplementedError("persistence comes with the models issue")

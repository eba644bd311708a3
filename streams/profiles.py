"""Solo profiles: the running mean of a job type's solo windows per environment."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PROFILE_KEYS = ("E", "T", "S", "V", "R", "W", "M", "throughput")


def update_mean(mean: float, count: int, value: float) -> tuple[float, int]:
    """One step of a running mean.

    >>> update_mean(10.0, 1, 20.0)
    (15.0, 2)
    """
    count += 1
    return mean + (value - mean) / count, count


class SoloProfiles:
    """Running means of six parameters, memory and throughput per (environment, job type).

    Each key keeps its own count, so a window without progress reports still
    updates the parameters and leaves the throughput alone.

    >>> p = SoloProfiles()
    >>> p.add("v100", "resnet", {"E": 100.0, "throughput": 10.0})
    >>> p.add("v100", "resnet", {"E": 200.0, "throughput": None})
    >>> p.get("v100", "resnet")["E"], p.get("v100", "resnet")["throughput"]
    (150.0, 10.0)
    """

    def __init__(self) -> None:
        self._data: dict[tuple[str, str], dict[str, list[float]]] = {}

    def add(self, environment: str, job_type: str, values: Mapping[str, float | None]) -> None:
        entry = self._data.setdefault((environment, job_type), {})
        for k in PROFILE_KEYS:
            v = values.get(k)
            if v is None:
                continue
            mean, count = entry.get(k, (0.0, 0))
            entry[k] = list(update_mean(mean, int(count), float(v)))

    def get(self, environment: str, job_type: str) -> dict[str, float | None] | None:
        entry = self._data.get((environment, job_type))
        if entry is None:
            return None
        return {k: (entry[k][0] if k in entry else None) for k in PROFILE_KEYS}

    def windows(self, environment: str, job_type: str) -> int:
        entry = self._data.get((environment, job_type), {})
        return int(max((c for _m, c in entry.values()), default=0))

    def __len__(self) -> int:
        return len(self._data)

    def to_dict(self) -> dict[str, Any]:
        return {f"{env}\x1f{jt}": entry for (env, jt), entry in self._data.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SoloProfiles:
        p = cls()
        for key, entry in data.items():
            env, _, jt = key.partition("\x1f")
            p._data[(env, jt)] = {k: [float(v[0]), int(v[1])] for k, v in entry.items()}
        return p

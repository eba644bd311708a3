"""Solo profiles: the running mean of a job type's solo windows per environment, shared by every worker.

A profile is kept as one share per *source* (the stage-1 input partition whose GPUs
ran the solo windows).  A partition has one owner at a time, so each share has one
writer; the profile is the count-weighted mean of its shares.  Workers publish the
shares on the compacted ``interference.profiles`` topic and every worker merges
every share it reads: for one source the share with more windows wins (ties broken
by update time), so workers that have read the same records hold the same profiles
whatever the order they read them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from events import ProfileSource, SoloProfile
from events.records import TS_MIN_S

PROFILE_KEYS = ("E", "T", "S", "V", "R", "W", "M", "throughput")
LOCAL = "local"


def update_mean(mean: float, count: int, value: float) -> tuple[float, int]:
    """One step of a running mean.

    >>> update_mean(10.0, 1, 20.0)
    (15.0, 2)
    """
    count += 1
    return mean + (value - mean) / count, count


class Share:
    """One source's running means (each key with its own count), window count and update time."""

    __slots__ = ("counts", "means", "updated_ts", "windows")

    def __init__(
        self,
        means: Mapping[str, float] | None = None,
        counts: Mapping[str, int] | None = None,
        windows: int = 0,
        updated_ts: float = 0.0,
    ) -> None:
        self.means: dict[str, float] = dict(means or {})
        self.counts: dict[str, int] = dict(counts or {})
        self.windows = windows
        self.updated_ts = updated_ts

    def add(self, values: Mapping[str, float | None], ts: float) -> None:
        for k in PROFILE_KEYS:
            v = values.get(k)
            if v is None:
                continue
            self.means[k], self.counts[k] = update_mean(self.means.get(k, 0.0), self.counts.get(k, 0), float(v))
        self.windows += 1
        self.updated_ts = max(self.updated_ts, ts)

    def newer_than(self, other: Share | None) -> bool:
        return other is None or (self.windows, self.updated_ts) > (other.windows, other.updated_ts)

    def source(self, name: str) -> ProfileSource:
        counts = {k: float(c) for k, c in self.counts.items()}
        return ProfileSource(name, self.windows, dict(self.means), counts, max(self.updated_ts, TS_MIN_S))  # type: ignore[arg-type]

    def to_list(self) -> list[Any]:
        return [self.means, self.counts, self.windows, self.updated_ts]

    @classmethod
    def from_list(cls, data: Any) -> Share:
        means, counts, windows, ts = data
        return cls({k: float(v) for k, v in means.items()}, {k: int(v) for k, v in counts.items()}, int(windows), float(ts))


class SoloProfiles:
    """Running means of six parameters, memory and throughput per (environment, job type), by source.

    Each key keeps its own count, so a window without progress reports still
    updates the parameters and leaves the throughput alone.

    >>> p = SoloProfiles()
    >>> p.add("v100", "resnet", {"E": 100.0, "throughput": 10.0}, source="0")
    >>> p.add("v100", "resnet", {"E": 200.0, "throughput": None}, source="1")
    >>> p.get("v100", "resnet")["E"], p.get("v100", "resnet")["throughput"]
    (150.0, 10.0)
    >>> q = SoloProfiles()
    >>> q.merge(p.record("v100", "resnet"))
    True
    >>> q.get("v100", "resnet") == p.get("v100", "resnet")
    True
    """

    def __init__(self) -> None:
        self._shares: dict[tuple[str, str], dict[str, Share]] = {}
        self._merged: dict[tuple[str, str], dict[str, float | None]] = {}
        self.dirty: set[tuple[str, str]] = set()  # keys with own updates not yet published

    def add(
        self, environment: str, job_type: str, values: Mapping[str, float | None], *, source: str = LOCAL, ts: float = 0.0
    ) -> None:
        key = (environment, job_type)
        shares = self._shares.setdefault(key, {})
        share = shares.get(source)
        if share is None:
            share = shares[source] = Share()
        share.add(values, ts)
        self._merged.pop(key, None)
        self.dirty.add(key)

    def get(self, environment: str, job_type: str) -> dict[str, float | None] | None:
        key = (environment, job_type)
        merged = self._merged.get(key)
        if merged is None:
            shares = self._shares.get(key)
            if not shares:
                return None
            merged = self._merged[key] = _combine(s for _src, s in sorted(shares.items()))  # one order: equal sums everywhere
        return merged

    def windows(self, environment: str, job_type: str) -> int:
        return sum(s.windows for s in self._shares.get((environment, job_type), {}).values())

    def known(self) -> list[tuple[str, str]]:
        return list(self._shares)

    def __len__(self) -> int:
        return len(self._shares)

    # --------------------------------------------------------------- the topic
    def record(self, environment: str, job_type: str) -> SoloProfile:
        """The profile as it is published on ``interference.profiles``."""
        shares = self._shares.get((environment, job_type), {})
        merged = self.get(environment, job_type) or {}
        return SoloProfile(
            environment=environment,
            job_type=job_type,
            updated_ts=max([TS_MIN_S, *(s.updated_ts for s in shares.values())]),
            **{k: merged.get(k) for k in PROFILE_KEYS[:7]},
            throughput_steps_per_s=merged.get("throughput"),
            windows=sum(s.windows for s in shares.values()),
            sources=[share.source(src) for src, share in sorted(shares.items())],
        )

    def merge(self, record: SoloProfile) -> bool:
        """Merge a published profile: per source, the share with more windows wins.  True when anything changed."""
        key = (record.environment, record.job_type)
        shares = self._shares.setdefault(key, {})
        changed = False
        for src in record.sources:
            theirs = Share(
                {k: float(v) for k, v in src.means.items() if v is not None},
                {k: int(v) for k, v in src.counts.items() if v is not None},
                src.windows,
                src.updated_ts,
            )
            if theirs.newer_than(shares.get(src.source)):
                shares[src.source] = theirs
                changed = True
        if changed:
            self._merged.pop(key, None)
        elif not shares:
            del self._shares[key]
        return changed

    def take_dirty(self) -> list[tuple[str, str]]:
        out = sorted(self.dirty)
        self.dirty.clear()
        return out

    def view(self) -> dict[str, dict[str, Any]]:
        """``"<environment>|<job_type>"`` -> merged means and windows (the workers' /profiles view)."""
        from events import profile_key

        return {
            profile_key(env, jt): {**(self.get(env, jt) or {}), "windows": self.windows(env, jt)}
            for env, jt in sorted(self._shares)
        }

    # ------------------------------------------------------------- checkpoint
    def to_dict(self) -> dict[str, Any]:
        return {f"{env}\x1f{jt}": {src: s.to_list() for src, s in shares.items()} for (env, jt), shares in self._shares.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SoloProfiles:
        """Load :meth:`to_dict`; a checkpoint of the single-worker format (one share per key) becomes the ``local`` share."""
        p = cls()
        for key, entry in data.items():
            env, _, jt = key.partition("\x1f")
            if entry and all(isinstance(v, list) and len(v) == 2 for v in entry.values()):  # {param: [mean, count]}
                means = {k: float(v[0]) for k, v in entry.items()}
                counts = {k: int(v[1]) for k, v in entry.items()}
                p._shares[(env, jt)] = {LOCAL: Share(means, counts, max(counts.values(), default=0))}
            else:
                p._shares[(env, jt)] = {src: Share.from_list(v) for src, v in entry.items()}
        return p


def _combine(shares: Iterable[Share]) -> dict[str, float | None]:
    """Count-weighted means over shares, per key (None where no share has the key; the mean itself where one share
    has it: no rounding).  The sums go in the shares' order (equal sums in every process that orders them alike).

    >>> _combine([Share({"E": 10.0}, {"E": 1}), Share({"E": 20.0, "T": 5.0}, {"E": 3, "T": 2})])["E"]
    17.5
    >>> _combine([Share({"E": 10.0}, {"E": 1}), Share({"E": 20.0, "T": 5.0}, {"E": 3, "T": 2})])["T"]
    5.0
    """
    held = [(s.means, s.counts) for s in shares]
    out: dict[str, float | None] = {}
    for k in PROFILE_KEYS:  # a loop per key: a third of the time of one per share (a solo window's profile asks it)
        total, count, n, mean = 0.0, 0, 0, 0.0
        for means, counts in held:
            c = counts.get(k)
            if c and k in means:
                mean = means[k]
                total += mean * c
                count += c
                n += 1
        out[k] = None if not count else mean if n == 1 else total / count
    return out

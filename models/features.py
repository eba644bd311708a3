"""Feature dicts for the two prediction modes.

* observed: the percent changes of a running co-location (the paper's AIP);
* placement: the solo profiles of the job and of its co-runners, plus what the
  job types tell (model family and batch size), known before co-locating them.

Features are plain ``dict[str, float]``; a feature that is unknown is left out
(never 0), and models handle the gap.  Keys containing ``=`` are indicators
(1.0 when present; absent means 0).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence

from events import CATEGORIES, PARAMETERS

_PARAMS = frozenset(PARAMETERS)

PROFILE_KEYS = ("M", "throughput")
"""Solo-profile keys used in every placement category besides the category's parameters."""

_BATCH = re.compile(r"^\s*(?P<family>.*?)\s*\(\s*batch\s*size\s*(?P<batch>\d+)\s*\)\s*$", re.IGNORECASE)
_SUFFIX_BATCH = re.compile(r"^(?P<family>.*?)[\s_:@-]+(?:bs|b|batch)[\s_=-]*(?P<batch>\d+)$", re.IGNORECASE)


@functools.lru_cache(maxsize=8192)
def parse_job_type(job_type: str) -> tuple[str, int | None]:
    """Model family and batch size from a job type name (memoised: a what-if asks it of every job type ~100 times).

    >>> parse_job_type("ResNet-18 (batch size 64)")
    ('resnet-18', 64)
    >>> parse_job_type("bert_bs8")
    ('bert', 8)
    >>> parse_job_type("A3C")
    ('a3c', None)
    """
    for pattern in (_BATCH, _SUFFIX_BATCH):
        m = pattern.match(job_type)
        if m:
            return m.group("family").strip().lower(), int(m.group("batch"))
    return job_type.strip().lower(), None


def observed_features(pcts: Mapping[str, float | None], category: str = "all") -> dict[str, float]:
    """Percent changes of the category's parameters, keyed ``<P>_pct``; missing ones left out.

    >>> observed_features({"E": 10.0, "T": None, "S": 3.0}, "1")
    {'E_pct': 10.0}
    """
    out: dict[str, float] = {}
    for p in CATEGORIES[category]:
        value = pcts.get(p)
        if value is not None and math.isfinite(value):
            out[f"{p}_pct"] = float(value)
    return out


ATTRIBUTION_KEYS = ("proc_sm_util_pct", "sm_share_pct")
"""Per-process attribution, a feature candidate: the job's own SM utilisation in the window and its share
of the co-located jobs' summed SM utilisation (Observation fields).  In no category: GPUs that cannot
attribute (MIG, older drivers) leave them null, and every existing feature set stays as it is."""


def attribution_features(values: Mapping[str, object]) -> dict[str, float]:
    """The attribution candidates present in ``values`` (an observation's fields); missing ones left out.

    >>> attribution_features({"proc_sm_util_pct": 45.0, "sm_share_pct": None, "E_pct": 3.0})
    {'proc_sm_util_pct': 45.0}
    """
    out: dict[str, float] = {}
    for k in ATTRIBUTION_KEYS:
        v = values.get(k)
        if isinstance(v, int | float) and math.isfinite(v):
            out[k] = float(v)
    return out


def restrict(features: Mapping[str, float], category: str) -> dict[str, float]:
    """Drop the features of parameters outside ``category`` (``E_pct``, ``solo_E``, ``other_solo_E``, ...).

    >>> restrict({"E_pct": 1.0, "S_pct": 2.0, "solo_S": 3.0, "solo_M": 4.0, "n_co": 1.0}, "1")
    {'E_pct': 1.0, 'solo_M': 4.0, 'n_co': 1.0}
    """
    return {k: features[k] for k in _kept(tuple(features), category)}


@functools.lru_cache(maxsize=8192)
def _kept(keys: tuple[str, ...], category: str) -> tuple[str, ...]:
    """Those of ``keys`` (in order) that :func:`restrict` keeps: feature dicts come in few shapes."""
    keep = CATEGORIES[category]
    return tuple(k for k in keys if (p := _parameter_of(k)) not in _PARAMS or p in keep)


@functools.lru_cache(maxsize=8192)
def _parameter_of(key: str) -> str:
    """The GPU parameter a feature name measures (``E_pct`` -> ``E``, ``other_solo_S`` -> ``S``), else ``""``."""
    if key.endswith("_pct") and len(key) == 5:
        return key[0]
    if key.startswith(("solo_", "other_solo_", "other_max_")):
        return key.rsplit("_", 1)[1]
    return ""


def _log(v: float) -> float:
    return math.log1p(max(v, 0.0))


_PROFILE_NAMES = {
    category: tuple((k, f"solo_{k}", f"other_solo_{k}", f"other_max_{k}") for k in (*params, *PROFILE_KEYS))
    for category, params in CATEGORIES.items()
}
"""Per category, each solo-profile key with its feature names (made once: a what-if makes ~100 feature dicts)."""


def placement_features(
    job_solo: Mapping[str, float | None],
    co_solos: Sequence[Mapping[str, float | None]],
    category: str = "all",
    *,
    job_type: str | None = None,
    co_job_types: Sequence[str] | None = None,
) -> dict[str, float]:
    """Solo profile of the job and summed solo profiles of its co-runners, plus job-type features.

    >>> f = placement_features({"E": 100.0, "throughput": 10.0}, [{"E": 50.0}], "1",
    ...                        job_type="resnet (batch size 32)", co_job_types=["lm"])
    >>> f["solo_E"], f["other_solo_E"], f["n_co"], f["fam=resnet"], f["co_fam=lm"], f["log2_batch"]
    (100.0, 50.0, 1.0, 1.0, 1.0, 5.0)
    """
    isfinite = math.isfinite
    one = co_solos[0] if len(co_solos) == 1 else None  # the usual case (a pair): no list per key
    out: dict[str, float] = {"n_co": float(len(co_solos))}
    for k, solo_k, other_k, max_k in _PROFILE_NAMES[category]:
        v = job_solo.get(k)
        if v is not None and isfinite(v):
            out[solo_k] = 0.0 + float(v)  # -0.0 becomes 0.0, as for the co-runners: equal profiles, the same features
        if one is not None:
            c = one.get(k)
            if c is not None and isfinite(float(c)):
                out[other_k] = 0.0 + float(c)  # what sum() makes of one value (-0.0 becomes 0.0)
            continue
        values = [float(c) for s in co_solos if (c := s.get(k)) is not None and isfinite(float(c))]
        if values:
            out[other_k] = sum(values)
            if len(co_solos) > 1:
                out[max_k] = max(values)
    if "solo_throughput" in out:
        out["log_solo_throughput"] = _log(out["solo_throughput"])
    if "other_solo_throughput" in out:
        out["log_other_solo_throughput"] = _log(out["other_solo_throughput"])
    if job_type is not None:
        family, batch = parse_job_type(job_type)
        out[f"fam={family}"] = 1.0
        if batch is not None:
            out["log2_batch"] = math.log2(batch)
            if "solo_throughput" in out:
                out["log_samples_per_s"] = _log(out["solo_throughput"] * batch)
    if co_job_types:
        batches = []
        for t in co_job_types:
            family, batch = parse_job_type(t)
            out[f"co_fam={family}"] = out.get(f"co_fam={family}", 0.0) + 1.0
            if batch is not None:
                batches.append(batch)
            if job_type is not None and t == job_type:
                out["same_type"] = out.get("same_type", 0.0) + 1.0
        if batches:
            out["co_log2_batch"] = sum(math.log2(b) for b in batches) / len(batches)
            thr = [s.get("throughput") for s in co_solos]
            if len(thr) == len(co_job_types) and all(t is not None for t in thr):
                samples = 0.0
                for t, bt in zip(co_job_types, thr, strict=True):
                    _, b = parse_job_type(t)
                    samples += float(bt or 0.0) * float(b or 1)
                out["log_other_samples_per_s"] = _log(samples)
    return out

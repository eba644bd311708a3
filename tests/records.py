"""Hypothesis strategies for every record type, and small factories for tests."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from hypothesis import strategies as st

from events import (
    Alert,
    DeadLetter,
    GpuProcess,
    JobEvent,
    Leaderboard,
    LeaderboardEntry,
    MetricSample,
    Observation,
    Prediction,
    ProfileSource,
    SoloProfile,
    WhatIf,
)
from events.schema import TS_MAX_S, TS_MIN_S, Spec

_text = st.text(max_size=40)


def _value(spec: Spec) -> st.SearchStrategy[Any]:
    kind = spec.kind
    if kind == "float":
        lo = spec.lo if spec.lo is not None else -1e9
        hi = spec.hi if spec.hi is not None else 1e9
        return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False)
    if kind == "int":
        lo = int(spec.lo) if spec.lo is not None else -(2**40)
        hi = int(spec.hi) if spec.hi is not None else 2**40
        return st.integers(min_value=lo, max_value=hi)
    if kind == "str":
        return _text
    if kind == "bool":
        return st.booleans()
    if kind == "enum":
        return st.sampled_from(spec.choices)
    if kind == "list_str":
        return st.lists(_text, max_size=4)
    if kind == "dict_float":
        return st.dictionaries(st.text(max_size=8), st.none() | st.floats(allow_nan=False, allow_infinity=False), max_size=4)
    if kind == "dict_str":
        return st.dictionaries(st.text(max_size=8), _text, max_size=4)
    if kind == "list_dict_float":
        return st.lists(_value(Spec("dict_float")), max_size=3)
    if kind == "interval":
        return st.lists(st.floats(min_value=-100.0, max_value=1e4, allow_nan=False), min_size=2, max_size=2).map(sorted)
    if kind == "record":
        assert spec.record is not None
        return records_of(spec.record)
    if kind == "list_record":
        assert spec.record is not None
        return st.lists(records_of(spec.record), max_size=3)
    raise AssertionError(kind)


def records_of(cls: type) -> st.SearchStrategy[Any]:
    """Valid instances of ``cls``: every field drawn within its spec, optionals sometimes null."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):
        if f.name == "schema_version":
            continue
        strategy = _value(f.metadata["spec"])
        fields[f.name] = st.none() | strategy if f.metadata.get("optional") else strategy
    strategy = st.builds(cls, **fields)
    if cls is JobEvent:  # progress needs steps and step_time_s
        strategy = strategy.filter(lambda e: e.kind != "progress" or (e.steps is not None and e.step_time_s is not None))
    return strategy


RECORD_TYPES = [
    MetricSample, JobEvent, Observation, Prediction, Alert, Leaderboard, DeadLetter, SoloProfile,
    GpuProcess, WhatIf, LeaderboardEntry, ProfileSource,
]  # fmt: skip
TOP_LEVEL = [MetricSample, JobEvent, Observation, Prediction, Alert, Leaderboard, DeadLetter, SoloProfile]


def now() -> float:
    return time.time()


def sample(**kw: Any) -> MetricSample:
    base: dict[str, Any] = dict(
        ts=now(), host="host-a", gpu_uuid="GPU-0000", gpu_index=0, gpu_model="v100", seq=0,
        power_w=150.0, temp_c=60.0, sm_util_pct=70.0, mem_util_pct=40.0, mem_used_mb=8000.0, mem_total_mb=16000.0,
        pcie_rx_kbps=1000.0, pcie_tx_kbps=800.0,
    )
    base.update(kw)
    return MetricSample(**base)


def job_event(kind: str = "started", **kw: Any) -> JobEvent:
    base: dict[str, Any] = dict(ts=now(), kind=kind, job_id="job-1", job_type="resnet50", gpu_uuid="GPU-0000", host="host-a")
    if kind == "progress":
        base.update(steps=100, step_time_s=0.1)
    base.update(kw)
    return JobEvent(**base)


ts_range = (TS_MIN_S, TS_MAX_S)

"""Hypothesis strategies for every record type, and small factories for tests."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import msgspec.inspect as mi
from hypothesis import strategies as st

import events
from events import RECORD_OF, HostJobEvents, HostMetrics, JobEvent, MetricSample, Observation, ObservationBatch, Prediction
from events.records import TS_MAX_S, TS_MIN_S
from events.topics import BATCH_OF


def _value(t: mi.Type) -> st.SearchStrategy[Any]:
    """Values within the constraints of a msgspec type (numbers kept to a readable range)."""
    if isinstance(t, mi.FloatType):
        return st.floats(min_value=max(t.ge, -1e9), max_value=min(t.le, 1e9), allow_nan=False, allow_infinity=False)
    if isinstance(t, mi.IntType):
        return st.integers(min_value=max(t.ge, -(2**40)), max_value=min(t.le, 2**40))
    if isinstance(t, mi.StrType):
        return st.text(max_size=min(t.max_length or 40, 40))
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.UnionType):
        return st.one_of([_value(u) for u in t.types])
    if isinstance(t, mi.ListType):
        if t.min_length == 2 and t.max_length == 2:  # an interval [lo, hi]
            return st.lists(st.floats(min_value=-100.0, max_value=1e4), min_size=2, max_size=2).map(sorted)
        return st.lists(_value(t.item_type), max_size=3)
    if isinstance(t, mi.DictType):
        return st.dictionaries(_value(t.key_type), _value(t.value_type), max_size=4)
    if isinstance(t, mi.StructType):
        return records_of(t.cls)
    raise AssertionError(t)


HOST_BATCHES: dict[type, tuple[str, type]] = {HostMetrics: ("samples", MetricSample), HostJobEvents: ("events", JobEvent)}
"""A host batch's field of items, and their type."""


@functools.cache  # one strategy per type: building it anew for every example was most of the tests' time
def records_of(cls: type) -> st.SearchStrategy[Any]:
    """Valid instances of ``cls``: every field drawn within its Struct's constraints, optionals sometimes null."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    fields = {f.name: _value(f.type) for f in info.fields if f.name != "schema_version"}
    if cls is JobEvent:  # progress needs steps and step_time_s
        progress = {"kind": st.just("progress"), "steps": st.integers(0, 2**40), "step_time_s": st.floats(0.0, 1e9)}
        others = st.builds(cls, **{**fields, "kind": st.sampled_from(["started", "finished"])})
        return others | st.builds(cls, **{**fields, **progress})
    if cls in HOST_BATCHES:  # every sample (job event) of the batch's host
        items, item_cls = HOST_BATCHES[cls]
        return st.builds(
            lambda host, ts, xs, producer_id: cls(
                ts=ts, host=host, producer_id=producer_id, **{items: [msgspec.structs.replace(x, host=host) for x in xs]}
            ),
            fields["host"], fields["ts"], st.lists(records_of(item_cls), min_size=1, max_size=3), fields["producer_id"],
        )  # fmt: skip
    if cls is ObservationBatch:  # every observation of the batch's environment
        return st.builds(
            lambda env, observations: ObservationBatch(
                environment=env, observations=[msgspec.structs.replace(x, environment=env) for x in observations]
            ),
            fields["environment"], st.lists(records_of(Observation), min_size=1, max_size=3),
        )  # fmt: skip
    return st.builds(cls, **fields)


TOP_LEVEL = [*RECORD_OF.values(), *BATCH_OF.values()]  # a topic's record each, in the topics' order, then the batches
NESTED = (events.GpuProcess, events.WhatIf, events.LeaderboardEntry, events.ProfileSource)  # records inside others
RECORD_TYPES = [*TOP_LEVEL, *NESTED]  # and those nested in them


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


def trained_on_pairs(models: Any, names: list[str], rounds: int, sample_of: Callable[[str, str], Any]) -> Any:
    """``models`` (an ``EnvironmentModels``) taught ``sample_of(a, b)`` for every ordered pair of ``names``,
    ``rounds`` times over, then refitted."""
    for _ in range(rounds):
        for a in names:
            for b in names:
                models.learn_sample(sample_of(a, b))
    models.refit_now()
    return models


@dataclass
class Message:
    """The part of a faust message that a worker reads."""

    topic: str
    partition: int
    offset: int
    value: bytes = b""
    key: bytes | None = None


@dataclass
class Event:
    """A faust event as an agent is handed it."""

    message: Message
    value: bytes


def placement_prediction(gpu: str, cost_pct: float, ts: float, job_id: str | None = None) -> Prediction:
    """A placement prediction of an ``LM`` job on ``gpu`` whose what-if for a newcomer of type ``X`` costs
    ``cost_pct`` in all, half the newcomer's own slowdown and half the existing jobs'."""
    return Prediction(
        ts=ts, gpu_uuid=gpu, environment="v100", job_id=job_id or f"{gpu}-j", job_type="LM", job_set=["LM"],
        mode="placement", interference_pct=1.0, model="m", category="all",
        what_if=[events.WhatIf(job_type="X", newcomer_pct=cost_pct / 2, existing_pct=cost_pct / 2)],
    )  # fmt: skip

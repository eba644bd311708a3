"""Bad input with a known verdict per record.

:func:`fuzz_cases` mixes a valid simulated stream with malformed and hostile
records for ``gpu.metrics`` and ``jobs.lifecycle``.  Every case says what the
worker must do with it: ``reject`` (dead letter with a reason), ``accept``
(valid: processed; unknown fields are ignored by design), ``duplicate`` (an
exact resend: detected, not counted twice) or ``anomaly`` (valid records in an
impossible order on GPUs of their own: processed without a crash).

>>> cases, valid = fuzz_cases(200, seed=1)
>>> sum(c.expect == "reject" for c in cases) > 100, len(valid) > 0
(True, True)
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from events import JobEvent, MetricSample, encode, to_dict
from events.topics import LIFECYCLE, METRICS

START_TS = 1_700_000_000.0
FUZZ_GPU_MODEL = "p100"


@dataclass(frozen=True)
class FuzzCase:
    topic: str  # base topic name
    key: bytes | None
    value: bytes | None
    expect: str  # reject | accept | duplicate | anomaly
    mutation: str


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=True).encode()


def _set(field: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda d: {**d, field: value}


def _drop(field: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda d: {k: v for k, v in d.items() if k != field}


_COMMON: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "ts string": _set("ts", "yesterday"),
    "ts far future": _set("ts", 1e13),
    "ts far past": _set("ts", 12.0),
    "ts negative": _set("ts", -1.0),
    "ts NaN": _set("ts", float("nan")),
    "ts inf": _set("ts", float("inf")),
    "ts bool": _set("ts", True),
    "missing ts": _drop("ts"),
    "missing gpu_uuid": _drop("gpu_uuid"),
    "gpu_uuid number": _set("gpu_uuid", 12345),
    "gpu_uuid null": _set("gpu_uuid", None),
    "host huge": _set("host", "h" * 1_000_000),
    "host list": _set("host", ["a", "b"]),
    "schema_version 99": _set("schema_version", 99),
    "schema_version string": _set("schema_version", "1"),
}

_METRIC: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    **_COMMON,
    "power negative": _set("power_w", -5.0),
    "power NaN": _set("power_w", float("nan")),
    "power inf": _set("power_w", float("inf")),
    "power -inf": _set("power_w", float("-inf")),
    "power string": _set("power_w", "150W"),
    "sm_util over 100": _set("sm_util_pct", 100.5),
    "mem_util over 100": _set("mem_util_pct", 1e6),
    "sm_util negative": _set("sm_util_pct", -1.0),
    "temp absurd": _set("temp_c", 5000.0),
    "seq negative": _set("seq", -1),
    "seq float": _set("seq", 1.5),
    "seq huge string": _set("seq", "9" * 100_000),
    "gpu_index negative": _set("gpu_index", -3),
    "processes not a list": _set("processes", {"pid": 1}),
    "processes bad pid": _set("processes", [{"pid": -7}]),
    "unavailable not strings": _set("unavailable", [1, 2]),
    "missing gpu_model": _drop("gpu_model"),
    "missing seq": _drop("seq"),
}

_LIFECYCLE: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    **_COMMON,
    "kind unknown": _set("kind", "exploded"),
    "kind number": _set("kind", 3),
    "missing kind": _drop("kind"),
    "missing job_id": _drop("job_id"),
    "job_id huge": _set("job_id", "j" * 300_000),
    "steps negative": _set("steps", -10),
    "step_time NaN": _set("step_time_s", float("nan")),
    "step_time negative": _set("step_time_s", -0.5),
    "progress without steps": lambda d: {**d, "kind": "progress", "steps": None},
    "batch_size zero": _set("batch_size", 0),
    "pid string": _set("pid", "1234"),
}

_RAW: dict[str, bytes | None] = {
    "not JSON": b"{not json",
    "empty": b"",
    "tombstone": None,
    "JSON array": b"[1,2,3]",
    "JSON string": b'"sample"',
    "JSON null": b"null",
    "invalid UTF-8": b'{"ts": "\xff\xfe\xfa", "host": "\xc3\x28"}',
    "truncated": b'{"ts": 1700000000.0, "host": "h", "gpu_uuid": "GPU',
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "NaN literal": b'{"ts": NaN}',
    "binary": bytes(range(256)),
    "huge blob": b'{"host": "' + b"x" * 900_000 + b'"}',
}


HUGE = frozenset({"host huge", "job_id huge", "seq huge string", "deep nesting", "huge blob"})
"""Mutations of 100 kB to 1 MB: a few per thousand records (they are about size, not number)."""


def valid_stream(seed: int, duration_s: float, gpus: int = 1, gpu_model: str = FUZZ_GPU_MODEL) -> list[tuple[str, Any]]:
    """The valid records the fuzz is interleaved with: a simulated fleet, in time order."""
    from producers.sim import Simulator

    return list(Simulator(gpus=gpus, gpu_model=gpu_model, seed=seed, start_ts=START_TS, duration_s=duration_s).events())


def _anomalies(rng: random.Random, n: int) -> list[FuzzCase]:
    """Valid lifecycle records in impossible orders, each on a GPU of its own (never late, never joined)."""
    out = []
    for i in range(n):
        gpu = f"GPU-fuzz-{rng.getrandbits(48):012x}"
        ts = START_TS + rng.uniform(0, 3600)
        base = dict(job_id=f"fj{i}", job_type="resnet50", gpu_uuid=gpu, host="fuzz")
        kind = i % 4
        if kind == 0:  # finished before started
            events = [JobEvent(ts=ts, kind="finished", **base), JobEvent(ts=ts + 1, kind="started", **base)]
        elif kind == 1:  # progress for a job never started
            events = [JobEvent(ts=ts, kind="progress", steps=5, step_time_s=0.1, **base)]
        elif kind == 2:  # started twice, finished twice, progress after the end
            events = [
                JobEvent(ts=ts, kind="started", **base),
                JobEvent(ts=ts + 2, kind="started", **base),
                JobEvent(ts=ts + 3, kind="finished", **base),
                JobEvent(ts=ts + 4, kind="finished", **base),
                JobEvent(ts=ts + 5, kind="progress", steps=9, step_time_s=0.2, **base),
            ]
        else:  # time running backwards, steps going down
            events = [
                JobEvent(ts=ts + 10, kind="progress", steps=100, step_time_s=0.1, **base),
                JobEvent(ts=ts, kind="progress", steps=5, step_time_s=0.1, **base),
            ]
        out.extend(FuzzCase(LIFECYCLE, gpu.encode(), encode(e), "anomaly", "impossible order") for e in events)
    return out


def fuzz_cases(
    per_topic: int, seed: int = 0, valid_duration_s: float | None = None
) -> tuple[list[FuzzCase], list[tuple[str, Any]]]:
    """``per_topic`` fuzzed records per input topic interleaved with a valid stream.

    Returns (every case in send order, the valid records in send order).  The
    valid stream keeps its time order; duplicates of valid metric samples follow
    their original; rejected records go to the valid GPU's key, a random key or none.
    """
    rng = random.Random(seed)
    # about 0.6 valid samples per fuzzed record; more GPUs rather than a longer stream, so that
    # event time does not run hundreds of times faster than wall time while records are sent
    gpus = max(1, per_topic // 1000)
    duration = valid_duration_s if valid_duration_s is not None else max(600.0, per_topic * 0.6 / gpus)
    valid = valid_stream(seed, duration, gpus)
    gpu = valid[0][1].gpu_uuid.encode() if valid else b"GPU-none"
    templates = {
        METRICS: [to_dict(r) for t, r in valid if t == METRICS][:50],
        LIFECYCLE: [to_dict(r) for t, r in valid if t == LIFECYCLE][:50],
    }
    bad: list[FuzzCase] = []
    for topic, mutations in ((METRICS, _METRIC), (LIFECYCLE, _LIFECYCLE)):
        names = sorted(n for n in [*mutations, *_RAW] if n not in HUGE)
        huge = sorted(n for n in [*mutations, *_RAW] if n in HUGE) * max(2, per_topic // 1000)
        n_anomalies = per_topic // 10 if topic == LIFECYCLE else 0
        n_dupes = per_topic // 10 if topic == METRICS else 0
        for i in range(per_topic - n_anomalies - n_dupes):
            name = huge[i] if i < len(huge) else names[i % len(names)]
            key = rng.choice([gpu, gpu, f"GPU-x{rng.getrandbits(32):08x}".encode(), None])
            if name in _RAW:
                key = key if key is not None or _RAW[name] is not None else gpu  # Kafka needs a key or a value
                bad.append(FuzzCase(topic, key, _RAW[name], "reject", name))
            else:
                template = rng.choice(templates[topic])
                bad.append(FuzzCase(topic, key, _dumps(mutations[name](template)), "reject", name))
        if n_anomalies:
            anomalies = _anomalies(rng, n_anomalies)
            bad.extend(anomalies[:n_anomalies])
    rng.shuffle(bad)
    # interleave: the valid stream in order, bad records at random positions, duplicates right after originals
    cases: list[FuzzCase] = []
    n_dupes = per_topic // 10
    metric_positions = [i for i, (t, _r) in enumerate(valid) if t == METRICS]
    dup_at = set(rng.sample(metric_positions, min(n_dupes, len(metric_positions))))
    per_valid = len(bad) / max(1, len(valid))
    owed = 0.0
    bad_iter = iter(bad)
    for i, (topic, record) in enumerate(valid):
        owed += per_valid
        while owed >= 1:
            case = next(bad_iter, None)
            owed -= 1
            if case is not None:
                cases.append(case)
        data = to_dict(record)
        extra = rng.random() < 0.05  # unknown fields are ignored by design (newer producers may add some)
        value = _dumps({**data, "x_unknown_field": "hello"}) if extra else encode(record)
        cases.append(FuzzCase(topic, record.key.encode(), value, "accept", "unknown field" if extra else "valid"))
        if i in dup_at:
            cases.append(FuzzCase(topic, record.key.encode(), encode(record), "duplicate", "exact resend"))
    cases.extend(bad_iter)
    return cases, valid


def expected_counts(cases: list[FuzzCase]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for c in cases:
        out.setdefault(c.topic, {}).setdefault(c.expect, 0)
        out[c.topic][c.expect] += 1
    return out


__all__ = ["FuzzCase", "MetricSample", "expected_counts", "fuzz_cases", "valid_stream"]

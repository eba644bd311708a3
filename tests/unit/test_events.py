"""The wire contract: round trips, validation, and robustness against any input."""

from __future__ import annotations

import functools
import json
import math
from typing import get_args

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from records import RECORD_TYPES, TOP_LEVEL, job_event, records_of, sample

from events import (
    CATEGORIES,
    RECORD_OF,
    SCHEMA_VERSION,
    GpuProcess,
    JobEvent,
    MetricSample,
    Observation,
    Prediction,
    RecordError,
    Topics,
    WhatIf,
    decode,
    decode_obj,
    encode,
    to_dict,
)
from events.jsonschema import schema_of
from events.records import Category, Version

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("cls", RECORD_TYPES, ids=lambda c: c.__name__)
@FAST
@given(data=st.data())
def test_every_valid_record_round_trips(cls: type, data: st.DataObject) -> None:
    record = data.draw(records_of(cls))
    assert decode(cls, encode(record)) == record


@pytest.mark.parametrize("cls", TOP_LEVEL, ids=lambda c: c.__name__)
@FAST
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_record_error(cls: type, raw: bytes) -> None:
    try:
        decode(cls, raw)
    except RecordError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=20,
)


@pytest.mark.parametrize("cls", TOP_LEVEL, ids=lambda c: c.__name__)
@FAST
@given(value=json_values)
def test_arbitrary_json_raises_only_record_error(cls: type, value: object) -> None:
    try:
        decode(cls, json.dumps(value).encode())
    except RecordError:
        pass


@pytest.mark.parametrize("cls", TOP_LEVEL, ids=lambda c: c.__name__)
@FAST
@given(data=st.data())
def test_valid_record_with_one_field_corrupted_is_rejected_or_valid(cls: type, data: st.DataObject) -> None:
    """Replacing any field by an arbitrary JSON value either still validates or raises RecordError."""
    obj = to_dict(data.draw(records_of(cls)))
    name = data.draw(st.sampled_from(sorted(obj)))
    obj[name] = data.draw(json_values)
    try:
        record = decode(cls, json.dumps(obj).encode())
    except RecordError as exc:
        assert _one_line_naming(str(exc), name) or str(exc).startswith("not valid JSON: JSON is malformed"), str(exc)
    else:
        assert decode(cls, encode(record)) == record


def test_metric_sample_rejects_out_of_range_values() -> None:
    good = to_dict(sample())
    cases = {
        "sm_util_pct": 100.5,
        "mem_util_pct": -1,
        "power_w": -3.0,
        "mem_used_mb": -1,
        "pcie_rx_kbps": -5,
        "seq": -1,
        "gpu_index": 1.5,
        "host": 7,
        "ts": 1e15,
    }
    for name, bad in cases.items():
        obj = dict(good, **{name: bad})
        with pytest.raises(RecordError, match=name):
            decode(MetricSample, json.dumps(obj).encode())


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_numbers_are_rejected(literal: bytes) -> None:
    raw = encode(sample()).replace(b'"power_w":150.0', b'"power_w":' + literal)
    with pytest.raises(RecordError, match="not valid JSON"):
        decode(MetricSample, raw)
    for value in (math.inf, -math.inf, math.nan, 1e400):
        with pytest.raises(RecordError, match="power_w"):
            decode_obj(MetricSample, dict(to_dict(sample()), power_w=value))
    with pytest.raises(RecordError, match="power_w"):
        decode(MetricSample, encode(sample()).replace(b'"power_w":150.0', b'"power_w":1e400'))  # inf once parsed


def test_missing_required_field_and_unknown_kind() -> None:
    obj = to_dict(job_event())
    del obj["job_id"]
    with pytest.raises(RecordError, match="missing required field `job_id`"):
        decode_obj(JobEvent, obj)
    with pytest.raises(RecordError, match="kind"):
        decode_obj(JobEvent, dict(to_dict(job_event()), kind="paused"))


def test_progress_needs_steps_and_step_time() -> None:
    obj = to_dict(job_event("progress"))
    obj["steps"] = None
    with pytest.raises(RecordError, match=r"^progress: steps and step_time_s are required$"):
        decode_obj(JobEvent, obj)
    with pytest.raises(RecordError, match=r"^progress: steps and step_time_s are required$"):
        decode(JobEvent, json.dumps(obj))
    with pytest.raises(RecordError, match="progress"):  # nor can one be built in Python
        job_event("progress", step_time_s=None)
    assert decode(JobEvent, json.dumps(dict(obj, kind="started"))).steps is None  # only progress needs them


def test_unsupported_field_is_null_not_zero() -> None:
    record = sample(pcie_rx_kbps=None, pcie_tx_kbps=None)
    obj = json.loads(encode(record))
    assert obj["pcie_rx_kbps"] is None
    assert decode(MetricSample, encode(record)).pcie_rx_kbps is None


def test_schema_version_is_checked() -> None:
    """Any version but this one is refused; a record without the field is read as this version."""
    obj = to_dict(sample())
    for version in (SCHEMA_VERSION + 1, 0, "1", True, None):
        with pytest.raises(RecordError, match="schema_version"):
            decode(MetricSample, json.dumps(dict(obj, schema_version=version)))
    del obj["schema_version"]
    assert decode(MetricSample, json.dumps(obj)).schema_version == SCHEMA_VERSION
    assert get_args(Version) == (SCHEMA_VERSION,)


LATER_OPTIONAL = ("interval_pct", "regime", "window_end")
"""Prediction's fields added after version 1: the interval and the attribution (its regime, the window it is of)."""


def test_records_written_without_a_newer_optional_field_still_decode() -> None:
    """Old producers' records (no ``interval_pct``, no attribution fields) read with those fields as None,
    every other field as written."""
    full = Prediction(ts=1.7e9, gpu_uuid="G", environment="v100", job_id="j", job_type="t", job_set=["t"],
                      mode="observed", interference_pct=3.0, model="m", category="all", interval_pct=[1.0, 5.0],
                      regime="seen", window_end=1.7e9 - 5, what_if=[WhatIf(job_type="u", newcomer_pct=2.0,
                      existing_pct=1.0, interval_pct=[0.0, 4.0])])  # fmt: skip
    obj = to_dict(full)
    for name in LATER_OPTIONAL:
        del obj[name]
    del obj["what_if"][0]["interval_pct"]
    old = decode(Prediction, json.dumps(obj))
    assert all(getattr(old, name) is None for name in LATER_OPTIONAL) and old.what_if[0].interval_pct is None
    expected = msgspec.structs.replace(full, what_if=[msgspec.structs.replace(full.what_if[0], interval_pct=None)],
                                       **dict.fromkeys(LATER_OPTIONAL))  # fmt: skip
    assert old == expected


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    obj = dict(to_dict(sample()), future_field=[1, 2])
    assert decode_obj(MetricSample, obj) == sample(ts=obj["ts"])


@pytest.mark.parametrize(
    "field, value",
    [
        ("sm_util_pct", 120.0),  # above its bound
        ("power_w", math.nan),  # JSON would write null
        ("pcie_rx_kbps", math.inf),
        ("seq", 3.0),  # a float in an int field
        ("host", 7),
        ("processes", [GpuProcess(pid=-1)]),  # a nested record beyond a bound
        ("processes", [{"pid": -1}]),  # likewise, as a dict
        ("unavailable", [1]),  # not strings
        ("gpu_index", 2**64),  # beyond 64 bits
        ("mem_used_mb", object()),
    ],
)
def test_encode_refuses_invalid_records(field: str, value: object) -> None:
    with pytest.raises(RecordError) as err:
        encode(sample(**{field: value}))
    assert _one_line_naming(str(err.value), field) or "cannot be written as JSON" in str(err.value)


def test_integral_floats_are_not_integers() -> None:
    """``3.0`` for an int field is refused (producers write ints as ints), ``3`` for a float field is a float."""
    obj = to_dict(sample())
    with pytest.raises(RecordError, match="seq"):
        decode(MetricSample, json.dumps(dict(obj, seq=3.0)))
    assert decode(MetricSample, json.dumps(dict(obj, power_w=150))).power_w == 150.0


def test_huge_strings_and_invalid_utf8_are_rejected() -> None:
    with pytest.raises(RecordError, match=r"length <= 256 - at `\$.host`"):
        decode_obj(MetricSample, dict(to_dict(sample()), host="x" * 10_000))
    with pytest.raises(RecordError, match="not valid JSON"):
        decode(MetricSample, b'{"host": "\xff\xfe"}')
    with pytest.raises(RecordError, match="not valid JSON"):  # even where a wrong type comes first
        decode(MetricSample, b'{"ts": "\xff\xfe", "host": 1}')
    with pytest.raises(RecordError, match="nested too deeply"):
        decode(MetricSample, b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def test_observation_identity_is_deterministic() -> None:
    obs = Observation(
        window_start=1.7e9,
        window_end=1.7e9 + 10,
        gpu_uuid="GPU-1",
        environment="v100",
        job_id="j",
        job_type="t",
        co_job_types=["u"],
    )
    assert obs.observation_id == "GPU-1|1700000000.000|j"
    assert obs.key == "v100"


def test_topics_prefix() -> None:
    t = Topics("x.")
    assert t.all() == tuple("x." + n for n in RECORD_OF)
    assert t.record_of("x.gpu.metrics") is MetricSample
    assert t.name("gpu.metrics") == t.name("x.gpu.metrics") == "x.gpu.metrics"


def test_every_category_has_its_parameters() -> None:
    assert set(CATEGORIES) == set(get_args(Category))


def _one_line_naming(message: str, name: str) -> bool:
    """An error is one line that names the field (or the cross-field rule that failed)."""
    return "\n" not in message and (f"`{name}`" in message or f"$.{name}" in message or message.startswith("progress:"))


@pytest.mark.parametrize("cls", TOP_LEVEL, ids=lambda c: c.__name__)
@FAST
@given(data=st.data())
def test_a_bad_field_is_named_in_a_one_line_error(cls: type, data: st.DataObject) -> None:
    """A valid record with one field out of its bounds, of a wrong type or removed: rejected, naming that field."""
    obj = to_dict(data.draw(records_of(cls)))
    required = [f.name for f in msgspec.structs.fields(cls) if f.required]
    name = data.draw(st.sampled_from(sorted(obj)))
    if data.draw(st.booleans()) and name in required:
        del obj[name]
    else:
        obj[name] = data.draw(st.sampled_from([{"nested": [1]}, True, "x" * 300, -1e300, 2**70]))
    try:
        record = decode(cls, json.dumps(obj))
    except RecordError as exc:
        assert _one_line_naming(str(exc), name), str(exc)
    else:  # a value its field happens to accept (a long string where no length is bounded, ...)
        assert to_dict(record)[name] == obj[name]
        # ... and that its field really accepts, by the published JSON Schema (another validator) ...
        assert field_schema_errors(cls, name, obj[name]) == [], f"decoded `{name}` = {str(obj[name])[:40]} that the schema refuses"
        assert decode(cls, encode(record)) == record  # ... and by encode's own check


@functools.cache
def _field_validator(cls: type, name: str) -> Draft202012Validator:
    schema = schema_of(cls)
    return Draft202012Validator({"$defs": schema.get("$defs", {}), **schema["properties"][name]})


def field_schema_errors(cls: type, name: str, value: object) -> list[str]:
    """What the published JSON Schema (jsonschema, not msgspec) finds wrong with ``value`` as ``cls``'s field ``name``."""
    return [e.message for e in _field_validator(cls, name).iter_errors(value)]


def _is_json(value: bytes | None) -> bool:
    """Whether ``value`` is JSON by the standard library (no NaN or Infinity literals)."""

    def refuse(name: str) -> None:
        raise ValueError(name)

    try:
        json.loads(value, parse_constant=refuse)  # type: ignore[arg-type]
    except (ValueError, TypeError, RecursionError):
        return False
    return True


def test_fuzzed_records_keep_their_dead_letter_categories() -> None:
    """The fault tests' hostile records: rejected in one line, as undecodable exactly where they are not JSON."""
    from aip.faults.fuzz import fuzz_cases
    from streams.metrics import dead_letter_reason

    cases, _valid = fuzz_cases(600, seed=3)
    for case in cases:
        try:
            decode(RECORD_OF[case.topic], case.value)
        except RecordError as exc:
            assert case.expect == "reject" and "\n" not in str(exc), case
            want = "invalid_record" if _is_json(case.value) else "undecodable"
            assert dead_letter_reason(f"invalid {case.topic} record: {exc}") == want, (case.mutation, str(exc))
        else:
            assert case.expect != "reject", case

"""The wire contract: round trips, validation, and robustness against any input."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from records import RECORD_TYPES, TOP_LEVEL, job_event, records_of, sample

from events import (
    RECORD_OF,
    SCHEMA_VERSION,
    JobEvent,
    MetricSample,
    Observation,
    RecordError,
    Topics,
    decode,
    decode_obj,
    encode,
    to_dict,
)

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
        assert str(exc)
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
    with pytest.raises(RecordError):
        decode(MetricSample, raw)
    with pytest.raises(RecordError, match="finite"):
        decode_obj(MetricSample, dict(to_dict(sample()), power_w=math.inf))


def test_missing_required_field_and_unknown_kind() -> None:
    obj = to_dict(job_event())
    del obj["job_id"]
    with pytest.raises(RecordError, match="job_id: required field missing"):
        decode_obj(JobEvent, obj)
    with pytest.raises(RecordError, match="kind"):
        decode_obj(JobEvent, dict(to_dict(job_event()), kind="paused"))


def test_progress_needs_steps_and_step_time() -> None:
    obj = to_dict(job_event("progress"))
    obj["steps"] = None
    with pytest.raises(RecordError, match="progress"):
        decode_obj(JobEvent, obj)
    with pytest.raises(RecordError, match="progress"):
        encode(JobEvent(**dict(obj, schema_version=SCHEMA_VERSION)))


def test_unsupported_field_is_null_not_zero() -> None:
    record = sample(pcie_rx_kbps=None, pcie_tx_kbps=None)
    obj = json.loads(encode(record))
    assert obj["pcie_rx_kbps"] is None
    assert decode(MetricSample, encode(record)).pcie_rx_kbps is None


def test_schema_version_is_checked() -> None:
    obj = to_dict(sample())
    obj["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(RecordError, match="schema_version"):
        decode_obj(MetricSample, obj)
    del obj["schema_version"]
    with pytest.raises(RecordError, match="schema_version"):
        decode_obj(MetricSample, obj)


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    obj = dict(to_dict(sample()), future_field=[1, 2])
    assert decode_obj(MetricSample, obj) == sample(ts=obj["ts"])


def test_encode_refuses_invalid_records() -> None:
    with pytest.raises(RecordError, match="sm_util_pct"):
        encode(sample(sm_util_pct=120.0))


def test_huge_strings_and_invalid_utf8_are_rejected() -> None:
    with pytest.raises(RecordError, match="longer than"):
        decode_obj(MetricSample, dict(to_dict(sample()), host="x" * 10_000))
    with pytest.raises(RecordError, match="JSON"):
        decode(MetricSample, b'{"host": "\xff\xfe"}')


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


@pytest.mark.parametrize("cls", TOP_LEVEL, ids=lambda c: c.__name__)
@FAST
@given(data=st.data())
def test_compiled_validator_agrees_with_the_general_checker(cls: type, data: st.DataObject) -> None:
    """The fast path (plain dicts) and the general path (any Mapping) accept and reject the same values."""
    from types import MappingProxyType

    from events.schema import from_dict

    obj = to_dict(data.draw(records_of(cls)))
    obj.pop("schema_version")
    for name in data.draw(st.lists(st.sampled_from(sorted(obj)), max_size=3)):
        obj[name] = data.draw(json_values | st.floats())
    outcomes = []
    for value in (obj, MappingProxyType(obj)):
        try:
            outcomes.append(("ok", from_dict(cls, value)))
        except RecordError as exc:
            outcomes.append(("error", str(exc)))
    assert outcomes[0] == outcomes[1]


def _outcome(fn: object, cls: type, payload: bytes) -> tuple[str, object]:
    try:
        return ("ok", fn(cls, payload))  # type: ignore[operator]
    except RecordError as exc:
        return ("error", str(exc))


@pytest.mark.parametrize("cls", TOP_LEVEL, ids=lambda c: c.__name__)
@FAST
@given(data=st.data())
def test_msgspec_fast_path_agrees_with_the_general_path(cls: type, data: st.DataObject) -> None:
    """decode (msgspec first) and decode_general accept the same payloads, build equal records, word the same errors."""
    from events.codec import decode_general
    from events.fast import fast_decoder

    obj = to_dict(data.draw(records_of(cls)))
    for name in data.draw(st.lists(st.sampled_from(sorted(obj)), max_size=3)):
        if data.draw(st.booleans()):
            obj.pop(name, None)
        else:
            obj[name] = data.draw(json_values | st.floats() | st.integers(min_value=2**62, max_value=2**65))
    payload = json.dumps(obj, allow_nan=True).encode()
    assert _outcome(decode, cls, payload) == _outcome(decode_general, cls, payload)
    fast = fast_decoder(cls)
    assert fast is not None  # msgspec is a dependency
    try:
        record = fast(payload)
        getattr(record, "check", lambda: None)()  # decode runs the cross-field check after the mirror
    except Exception:
        return
    assert _outcome(decode_general, cls, payload) == ("ok", record)  # what the mirror accepts is valid


def test_msgspec_fast_path_agrees_on_every_fuzzed_record() -> None:
    """The fault tests' fuzzed records (wrong types, NaN, huge strings, invalid UTF-8, ...) decode identically."""
    from aip.faults.fuzz import fuzz_cases
    from events.codec import decode_general

    cases, _valid = fuzz_cases(600, seed=3)
    rejected = 0
    for case in cases:
        cls = RECORD_OF[case.topic]
        if case.value is None:
            continue
        fast, general = _outcome(decode, cls, case.value), _outcome(decode_general, cls, case.value)
        assert fast == general, case
        rejected += fast[0] == "error"
    assert rejected > 500


@pytest.mark.parametrize("cls", TOP_LEVEL, ids=lambda c: c.__name__)
@FAST
@given(data=st.data())
def test_msgspec_fast_encode_agrees_with_the_general_encode(cls: type, data: st.DataObject) -> None:
    """encode (msgspec check first) and encode_general give the same bytes or the same error, NaN and inf included."""
    import copy

    from events.codec import encode_general

    record = copy.copy(data.draw(records_of(cls)))
    for name in data.draw(st.lists(st.sampled_from([n for n in to_dict(record) if n != "schema_version"]), max_size=3)):
        object.__setattr__(record, name, data.draw(json_values | st.floats() | st.integers(min_value=2**62, max_value=2**65)))

    def outcome(fn: object) -> tuple[str, object]:
        try:
            return ("ok", fn(record))  # type: ignore[operator]
        except RecordError as exc:
            return ("error", str(exc))

    assert outcome(encode) == outcome(encode_general)

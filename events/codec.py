"""JSON codec for records: bytes <-> validated dataclass instances."""

from __future__ import annotations

import base64
from typing import Any, TypeVar

from events.fast import fast_checker, fast_decoder
from events.schema import SCHEMA_VERSION, RecordError, from_dict, to_dict, validate_dict

try:  # orjson is strict (no NaN literals) and several times faster than json
    import orjson as _json

    def _dumps(obj: Any) -> bytes:
        return _json.dumps(obj)

    def _loads(data: bytes) -> Any:
        return _json.loads(data)

    _JSONError: tuple[type[Exception], ...] = (_json.JSONDecodeError, TypeError)
    _DUMPS_RECORDS = True  # orjson serialises dataclass instances itself
except ImportError:  # pragma: no cover - exercised where orjson is absent
    import json as _stdjson

    def _dumps(obj: Any) -> bytes:
        return _stdjson.dumps(obj, allow_nan=False, separators=(",", ":")).encode()

    def _reject_constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    def _loads(data: bytes) -> Any:
        return _stdjson.loads(data, parse_constant=_reject_constant)

    _JSONError = (ValueError, TypeError, RecursionError)
    _DUMPS_RECORDS = False

T = TypeVar("T")


def encode(record: Any) -> bytes:
    """Validate ``record`` and serialise it to JSON bytes.

    >>> from events.records import GpuProcess
    >>> encode(GpuProcess(pid=7, used_mem_mb=512.0))
    b'{"pid":7,"used_mem_mb":512.0,"sm_util_pct":null,"mem_util_pct":null}'
    """
    fast = fast_checker(type(record)) if _DUMPS_RECORDS else None
    if fast is not None:
        try:
            fast(record)
        except Exception:  # not plainly valid: the general path accepts it or words the error
            pass
        else:
            _cross_check(record)
            return _serialise(record)  # orjson writes dataclasses as to_dict would
    return encode_general(record)


def encode_general(record: Any) -> bytes:
    """:func:`encode` without the msgspec fast path (the reference the fast path is tested against)."""
    data = to_dict(record)
    validate_dict(type(record), data)
    _cross_check(record)
    return _serialise(data)


def _cross_check(record: Any) -> None:
    """The record's own cross-field rules (``check()``), where it has any."""
    check = getattr(record, "check", None)
    if check is not None:
        check()


def _serialise(obj: Any) -> bytes:
    try:
        return _dumps(obj)
    except (TypeError, ValueError) as exc:  # e.g. an integer beyond 64 bits in a float field
        raise RecordError(f"cannot be written as JSON: {exc}") from None


def decode(cls: type[T], data: bytes | bytearray | memoryview | str | None) -> T:
    """Parse and validate ``data`` as a ``cls`` record; raise :class:`RecordError` otherwise.

    >>> from events.records import GpuProcess
    >>> decode(GpuProcess, b'{"pid": 7}')
    GpuProcess(pid=7, used_mem_mb=None, sm_util_pct=None, mem_util_pct=None)
    >>> decode(GpuProcess, b'{"pid": -1}')
    Traceback (most recent call last):
    ...
    events.schema.RecordError: pid: -1 is below the minimum 0
    """
    if data is None:
        raise RecordError("empty message (null value)")
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    fast = fast_decoder(cls)
    if fast is not None:
        try:
            record: T = fast(data)
        except Exception:  # not plainly valid: the general path accepts it or words the error
            pass
        else:
            _cross_check(record)
            return record
    return decode_general(cls, data)


def decode_general(cls: type[T], data: bytes | bytearray | memoryview) -> T:
    """:func:`decode` without the msgspec fast path (the reference the fast path is tested against)."""
    try:
        obj = _loads(bytes(data))
    except _JSONError as exc:
        raise RecordError(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise RecordError("not valid JSON: nested too deeply") from None
    return decode_obj(cls, obj)


def decode_obj(cls: type[T], obj: Any) -> T:
    """Validate an already-parsed JSON value as a ``cls`` record."""
    if isinstance(obj, dict) and "schema_version" in obj:
        version = obj["schema_version"]
        if version != SCHEMA_VERSION or isinstance(version, bool):
            raise RecordError(f"schema_version {version!r:.20} is not supported (this build reads {SCHEMA_VERSION})")
    elif isinstance(obj, dict) and getattr(cls, "__dataclass_fields__", {}).get("schema_version") is not None:
        raise RecordError("schema_version: required field missing")
    record: T = from_dict(cls, obj)
    _cross_check(record)
    return record


def b64(data: bytes | None) -> str:
    return base64.b64encode(data or b"").decode("ascii")

"""Field specifications and the validator shared by every record.

A record class declares each field with :func:`spec`; ``validate_fields``
checks a plain dict against those declarations and returns the keyword
arguments for the dataclass.  Everything that is wrong is reported through
:class:`RecordError` with a message naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

SCHEMA_VERSION = 1

# Timestamps are epoch seconds; anything outside this range is a unit or clock error.
TS_MIN_S = 946_684_800.0  # 2000-01-01
TS_MAX_S = 4_102_444_800.0  # 2100-01-01
MAX_STR_LEN = 256
MAX_LIST_LEN = 1024
_FLOAT_MAX = 1.7976931348623157e308


class RecordError(ValueError):
    """Raised for any record that cannot be decoded or does not validate."""


@dataclasses.dataclass(frozen=True)
class Spec:
    kind: str  # float int str bool enum list_str dict_float dict_str list_dict_float interval record list_record
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    record: type | None = None
    max_len: int = MAX_STR_LEN


def spec(kind: str, *, optional: bool = False, default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """Declare a dataclass field with its validation spec.

    ``optional`` fields may be absent or null and default to ``None``.
    """
    meta = {"spec": Spec(kind, **kw), "optional": optional}
    if optional and default is dataclasses.MISSING:
        default = None
    if kind.startswith(("list_", "dict_")) and default is not dataclasses.MISSING and default is not None:
        factory = list if kind.startswith("list_") else dict
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_number(name: str, value: Any, s: Spec) -> float:
    if not _is_number(value):
        raise RecordError(f"{name}: expected a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise RecordError(f"{name}: must be finite, got {value!r}")
    if s.lo is not None and value < s.lo:
        raise RecordError(f"{name}: {value!r} is below the minimum {s.lo:g}")
    if s.hi is not None and value > s.hi:
        raise RecordError(f"{name}: {value!r} is above the maximum {s.hi:g}")
    return float(value)


def _check_str(name: str, value: Any, s: Spec) -> str:
    if not isinstance(value, str):
        raise RecordError(f"{name}: expected a string, got {type(value).__name__}")
    if len(value) > s.max_len:
        raise RecordError(f"{name}: longer than {s.max_len} characters ({len(value)})")
    return value


def _check_value(name: str, value: Any, s: Spec) -> Any:
    kind = s.kind
    if kind == "float":
        return _check_number(name, value, s)
    if kind == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            if _is_number(value) and float(value).is_integer() and math.isfinite(value):
                value = int(value)
            else:
                raise RecordError(f"{name}: expected an integer, got {value!r:.40}")
        if abs(value) > 2**63:
            raise RecordError(f"{name}: integer out of range")
        _check_number(name, value, s)
        return value
    if kind == "str":
        return _check_str(name, value, s)
    if kind == "bool":
        if not isinstance(value, bool):
            raise RecordError(f"{name}: expected true or false, got {type(value).__name__}")
        return value
    if kind == "enum":
        if not isinstance(value, str) or value not in s.choices:
            raise RecordError(f"{name}: {value!r:.40} is not one of {', '.join(s.choices)}")
        return value
    if kind == "list_str":
        items = _check_list(name, value)
        return [_check_str(f"{name}[{i}]", v, s) for i, v in enumerate(items)]
    if kind == "dict_float":
        return _check_dict_float(name, value, s)
    if kind == "dict_str":
        if not isinstance(value, Mapping) or len(value) > MAX_LIST_LEN:
            raise RecordError(f"{name}: expected an object of at most {MAX_LIST_LEN} entries")
        return {_check_str(f"{name} key", k, s): _check_str(f"{name}.{k}", v, s) for k, v in value.items()}
    if kind == "list_dict_float":
        items = _check_list(name, value)
        return [_check_dict_float(f"{name}[{i}]", v, s) for i, v in enumerate(items)]
    if kind == "interval":
        if not isinstance(value, list) or len(value) != 2:
            raise RecordError(f"{name}: expected [lo, hi], got {type(value).__name__}")
        return [_check_number(f"{name}[{i}]", v, s) for i, v in enumerate(value)]
    if kind == "record":
        assert s.record is not None
        return from_dict(s.record, value, prefix=f"{name}.")
    if kind == "list_record":
        assert s.record is not None
        items = _check_list(name, value)
        return [from_dict(s.record, v, prefix=f"{name}[{i}].") for i, v in enumerate(items)]
    raise AssertionError(f"unknown spec kind {kind}")


def _check_list(name: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise RecordError(f"{name}: expected a list, got {type(value).__name__}")
    if len(value) > MAX_LIST_LEN:
        raise RecordError(f"{name}: more than {MAX_LIST_LEN} items")
    return value


_KEY_SPEC = Spec("str", max_len=64)
_FLOAT_SPEC = Spec("float")


def _check_dict_float(name: str, value: Any, s: Spec) -> dict[str, float | None]:
    if not isinstance(value, Mapping):
        raise RecordError(f"{name}: expected an object, got {type(value).__name__}")
    if len(value) > MAX_LIST_LEN:
        raise RecordError(f"{name}: more than {MAX_LIST_LEN} entries")
    out: dict[str, float | None] = {}
    for k, v in value.items():
        key = _check_str(f"{name} key", k, _KEY_SPEC)
        out[key] = None if v is None else _check_number(f"{name}.{key}", v, _FLOAT_SPEC)
    return out


def check_field(name: str, value: Any, field: dataclasses.Field[Any]) -> Any:
    if value is None:
        if field.metadata.get("optional"):
            return None
        raise RecordError(f"{name}: required, got null")
    return _check_value(name, value, field.metadata["spec"])


@functools.cache
def _field_plan(cls: type) -> tuple[tuple[str, bool, bool, Spec], ...]:
    """(name, optional, may_be_absent, spec) per validated field of ``cls``, computed once."""
    plan = []
    for f in dataclasses.fields(cls):
        if f.name == "schema_version":
            continue
        optional = bool(f.metadata.get("optional"))
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        plan.append((f.name, optional, optional or has_default, f.metadata["spec"]))
    return tuple(plan)


_MISSING = object()


@functools.cache
def _compiled(cls: type) -> Any:
    """A validator specialised to ``cls``: scalar fields checked inline, anything unusual
    (wrong type, out of range, NaN, nested values) handed to the general checker, which
    accepts exactly the same values and words the error.  About 4x faster on MetricSample.
    """
    lines = ["def validate(data, prefix):", "    kw = {}"]
    env: dict[str, Any] = {"_MISSING": _MISSING, "RecordError": RecordError, "_check_value": _check_value}
    for i, (name, optional, may_be_absent, s) in enumerate(_field_plan(cls)):
        env[f"s{i}"] = s
        lines.append(f"    v = data.get({name!r}, _MISSING)")
        if may_be_absent:
            lines.append("    if v is _MISSING: pass")
        else:
            lines.append(f"    if v is _MISSING: raise RecordError(prefix + {name + ': required field missing'!r})")
        if optional:
            lines.append(f"    elif v is None: kw[{name!r}] = None")
        else:
            lines.append(f"    elif v is None: raise RecordError(prefix + {name + ': required, got null'!r})")
        lo = -_FLOAT_MAX if s.lo is None else s.lo
        hi = _FLOAT_MAX if s.hi is None else s.hi
        if s.kind == "float":
            lines.append(f"    elif (type(v) is float or type(v) is int) and {lo!r} <= v <= {hi!r}: kw[{name!r}] = float(v)")
        elif s.kind == "int":
            ilo = max(lo, -(2**63))
            ihi = min(hi, 2**63)
            lines.append(f"    elif type(v) is int and {ilo!r} <= v <= {ihi!r}: kw[{name!r}] = v")
        elif s.kind == "str":
            lines.append(f"    elif type(v) is str and len(v) <= {s.max_len}: kw[{name!r}] = v")
        elif s.kind == "enum":
            env[f"c{i}"] = frozenset(s.choices)
            lines.append(f"    elif type(v) is str and v in c{i}: kw[{name!r}] = v")
        elif s.kind == "list_str":
            lines.append(
                f"    elif type(v) is list and len(v) <= {MAX_LIST_LEN} and all(type(x) is str and len(x) <= {s.max_len} for x in v):"
                f" kw[{name!r}] = v"
            )
        elif s.kind == "list_record":
            assert s.record is not None
            env[f"r{i}"] = s.record
            env[f"v{i}"] = _compiled(s.record)
            lines += [
                f"    elif type(v) is list and len(v) <= {MAX_LIST_LEN} and all(type(x) is dict for x in v):",
                f"        try: kw[{name!r}] = [r{i}(**v{i}(x, '')) for x in v]",
                f"        except RecordError: kw[{name!r}] = _check_value(prefix + {name!r}, v, s{i})",
            ]
        lines.append(f"    else: kw[{name!r}] = _check_value(prefix + {name!r}, v, s{i})")
    lines.append("    return kw")
    exec("\n".join(lines), env)
    return env["validate"]


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Validate ``data`` against the fields of ``cls`` and build an instance.

    Unknown keys are ignored, so that newer producers may add optional fields.
    """
    if type(data) is dict:
        return cls(**_compiled(cls)(data, prefix))
    if not isinstance(data, Mapping):
        raise RecordError(f"{prefix or cls.__name__}: expected a JSON object, got {type(data).__name__}")
    kwargs: dict[str, Any] = {}
    for name, optional, may_be_absent, s in _field_plan(cls):
        if name not in data:
            if may_be_absent:
                continue
            raise RecordError(f"{prefix}{name}: required field missing")
        value = data[name]
        if value is None:
            if optional:
                kwargs[name] = None
                continue
            raise RecordError(f"{prefix}{name}: required, got null")
        kwargs[name] = _check_value(prefix + name, value, s)
    return cls(**kwargs)


def validate_dict(cls: type, data: dict[str, Any]) -> None:
    """Check the plain-dict form of a ``cls`` record (``to_dict``'s output) as decoding would."""
    _compiled(cls)(data, "")


def validate_instance(record: Any) -> None:
    """Check an already-built record, field by field (the general path)."""
    for f in dataclasses.fields(record):
        if f.name == "schema_version":
            continue
        value = getattr(record, f.name)
        if f.metadata["spec"].kind in ("record", "list_record") and value is not None:
            for item in value if isinstance(value, list) else [value]:
                if not dataclasses.is_dataclass(item):
                    raise RecordError(f"{f.name}: expected a record, got {type(item).__name__}")
                validate_instance(item)
            continue
        check_field(f.name, value, f)
    check = getattr(record, "check", None)
    if check is not None:
        check()


_NAMES: dict[Any, tuple[str, ...]] = {}


def _names(cls: Any) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def to_dict(record: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _names(type(record)):
        value = getattr(record, name)
        if dataclasses.is_dataclass(value):
            value = to_dict(value)
        elif type(value) is list and value and dataclasses.is_dataclass(value[0]):
            value = [to_dict(v) for v in value]
        out[name] = value
    return out

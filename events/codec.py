"""JSON codec for records: bytes <-> validated record instances, all by msgspec from the record's Struct.

Integers are JSON integers: ``3.0`` in an int field is rejected (every producer writes ints as ints).
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable
from typing import Annotated, Any, NamedTuple, TypeVar

import msgspec
import msgspec.inspect
from msgspec import Meta

from events.records import MAX_GPUS_PER_HOST, HostMetrics, MetricSample, RecordError, Str, Ts, Version

T = TypeVar("T")

_ENCODER = msgspec.json.Encoder()
_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}


def _decoder(cls: type[T]) -> msgspec.json.Decoder[T]:
    decoder = _DECODERS.get(cls)
    if decoder is None:
        decoder = _DECODERS[cls] = msgspec.json.Decoder(cls)
    return decoder


def encode(record: Any) -> bytes:
    """Validate ``record`` and serialise it to JSON bytes.

    msgspec validates what it decodes, not a Struct built in Python: :func:`check` does, so that
    nothing invalid is published (a value beyond its bounds, of a wrong type, NaN or infinity).

    >>> from events.records import GpuProcess
    >>> encode(GpuProcess(pid=7, used_mem_mb=512.0))
    b'{"pid":7,"used_mem_mb":512.0,"sm_util_pct":null,"mem_util_pct":null}'
    >>> encode(GpuProcess(pid=7, sm_util_pct=101.0))
    Traceback (most recent call last):
    ...
    events.records.RecordError: Expected `float` <= 100.0 - at `$.sm_util_pct`
    """
    check(record)
    return _ENCODER.encode(record)


def check(record: Any) -> None:
    """Validate a record built in Python as decoding would, its nested records included."""
    cls: Any = type(record)
    try:
        msgspec.convert(_fields(cls)(record), cls)
    except msgspec.ValidationError as exc:
        raise RecordError(str(exc)) from None
    except TypeError as exc:  # to_builtins of an object JSON has no form for
        raise RecordError(f"cannot be written as JSON: {exc}") from None


@functools.cache
def _fields(cls: Any) -> Callable[[Any], Any]:
    """A record's fields as ``convert`` checks them all: ``convert`` takes a nested record instance as it is,
    so a record holding records goes as builtins; any other as its field dict, which is cheaper."""

    def holds_records(t: msgspec.inspect.Type) -> bool:
        if isinstance(t, msgspec.inspect.UnionType):
            return any(holds_records(u) for u in t.types)
        return isinstance(t, msgspec.inspect.ListType) and isinstance(t.item_type, msgspec.inspect.StructType)

    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    return msgspec.to_builtins if any(holds_records(f.type) for f in info.fields) else msgspec.structs.asdict


def decode(cls: type[T], data: bytes | bytearray | memoryview | str | None) -> T:
    """Parse and validate ``data`` as a ``cls`` record; raise :class:`RecordError` otherwise.

    >>> from events.records import GpuProcess
    >>> decode(GpuProcess, b'{"pid": 7}')
    GpuProcess(pid=7, used_mem_mb=None, sm_util_pct=None, mem_util_pct=None)
    >>> decode(GpuProcess, b'{"pid": -1}')
    Traceback (most recent call last):
    ...
    events.records.RecordError: Expected `int` >= 0 - at `$.pid`
    """
    if data is None:
        raise RecordError("empty message (null value)")
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    try:
        return _decoder(cls).decode(data)
    except msgspec.ValidationError as exc:  # not a valid record (the cross-field checks included) ...
        _check_json(data)  # ... unless not JSON at all, which the typed decoder may stop before it sees
        raise RecordError(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise RecordError(f"not valid JSON: {exc}") from None
    except RecursionError:  # an unknown field nested thousands deep
        raise RecordError("not valid JSON: nested too deeply") from None


def _check_json(data: bytes | bytearray | memoryview) -> None:
    """Raise :class:`RecordError` ("not valid JSON") unless ``data`` is well-formed JSON (UTF-8, nesting)."""
    try:
        msgspec.json.decode(data)
    except msgspec.ValidationError:  # well-formed, but a number beyond a float's range
        pass
    except msgspec.DecodeError as exc:
        raise RecordError(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise RecordError("not valid JSON: nested too deeply") from None


def _as_bytes(data: bytes | bytearray | memoryview | str | None) -> bytes | bytearray | None:
    if isinstance(data, str):
        return data.encode("utf-8", "surrogatepass")
    return bytes(data) if isinstance(data, memoryview) else data


class _HostMetricsView(msgspec.Struct, frozen=True, gc=False):
    """:class:`HostMetrics` with each sample left undecoded, to read a batch sample by sample (same fields)."""

    ts: Ts
    host: Str
    samples: Annotated[list[msgspec.Raw], Meta(min_length=1, max_length=MAX_GPUS_PER_HOST)]
    producer_id: Str | None = None
    schema_version: Version = 1


BATCH_MARK = b'"samples"'
"""Only a :class:`HostMetrics` has this key (a MetricSample that carries it as an unknown field is still read as one)."""


class Rejected(NamedTuple):
    """One sample of a batch that cannot be used: its own JSON and why."""

    payload: bytes
    error: str


class MetricsRecord(NamedTuple):
    """What one ``gpu.metrics`` record holds: its valid samples, the rejected ones, and whether it was a batch."""

    samples: list[MetricSample]
    rejected: list[Rejected]
    batched: bool


def metric_samples(data: bytes | bytearray | memoryview | str | None) -> MetricsRecord:
    """The per-GPU samples of one ``gpu.metrics`` record: a :class:`MetricSample`, or a :class:`HostMetrics`.

    A batch whose envelope (``ts``, ``host``, ``samples``, ...) is invalid raises :class:`RecordError`, as an
    invalid per-GPU record does; an invalid sample inside a valid envelope is returned in ``rejected``
    and the others are kept.

    >>> one = b'{"ts": 1.7e9, "host": "h", "gpu_uuid": "GPU-1", "gpu_index": 0, "gpu_model": "v100", "seq": 0}'
    >>> bad = one.replace(b'"seq": 0', b'"seq": -1')
    >>> out = metric_samples(b'{"ts": 1.7e9, "host": "h", "samples": [' + one + b", " + bad + b"]}")
    >>> [s.gpu_uuid for s in out.samples], [r.error for r in out.rejected], out.batched
    (['GPU-1'], ['samples[1]: Expected `int` >= 0 - at `$.seq`'], True)
    >>> metric_samples(one).batched
    False
    """
    data = _as_bytes(data)
    if data is None or BATCH_MARK not in data:
        return MetricsRecord([decode(MetricSample, data)], [], False)
    try:
        return MetricsRecord(list(_decoder(HostMetrics).decode(data).samples), [], True)  # one call for a valid batch
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        pass
    try:
        view = decode(_HostMetricsView, data)
    except RecordError as not_a_batch:
        try:
            return MetricsRecord([decode(MetricSample, data)], [], False)
        except RecordError:
            raise not_a_batch from None
    samples: list[MetricSample] = []
    rejected: list[Rejected] = []
    for i, raw in enumerate(view.samples):
        try:
            sample = decode(MetricSample, bytes(raw))
        except RecordError as exc:
            rejected.append(Rejected(bytes(raw), f"samples[{i}]: {exc}"))
            continue
        if sample.host != view.host:
            rejected.append(Rejected(bytes(raw), f"samples[{i}]: host {sample.host!r} is not the batch's host {view.host!r}"))
            continue
        samples.append(sample)
    return MetricsRecord(samples, rejected, True)


def decode_on_topic(cls: type[T], data: bytes | bytearray | memoryview | str | None) -> T | HostMetrics:
    """:func:`decode`, except that where ``cls`` is :class:`MetricSample` a :class:`HostMetrics` batch is read too
    (whole: any invalid sample fails it; stage 1 reads batches with :func:`metric_samples`)."""
    data = _as_bytes(data)
    if cls is MetricSample and data is not None and BATCH_MARK in data:
        try:
            return decode(HostMetrics, data)
        except RecordError as not_a_batch:
            try:
                return decode(cls, data)
            except RecordError:
                raise not_a_batch from None
    return decode(cls, data)


def decode_obj(cls: type[T], obj: Any) -> T:
    """Validate an already-parsed JSON value (``json.loads``' output) as a ``cls`` record."""
    try:
        return msgspec.convert(obj, cls)
    except msgspec.ValidationError as exc:
        raise RecordError(str(exc)) from None


def to_dict(record: Any) -> dict[str, Any]:
    """The plain-JSON form of ``record`` (nested records as dicts), as :func:`encode` writes it."""
    out: dict[str, Any] = msgspec.to_builtins(record)
    return out


def b64(data: bytes | None) -> str:
    return base64.b64encode(data or b"").decode("ascii")

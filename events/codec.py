"""JSON codec for records: bytes <-> validated record instances, all by msgspec from the record's Struct.

Integers are JSON integers: ``3.0`` in an int field is rejected (every producer writes ints as ints).
"""

from __future__ import annotations

import base64
import functools
from typing import Annotated, Any, NamedTuple, TypeVar

import msgspec
import msgspec.inspect

from events.records import (
    MAX_OBSERVATIONS_PER_BATCH,
    HostJobEvents,
    HostMetrics,
    JobEvent,
    MetricSample,
    Observation,
    ObservationBatch,
    Prediction,
    RecordError,
)

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
    b'{"pid":7,"used_mem_mb":512.0,"sm_util_pct":null,"mem_util_pct":null,"namespace":null,"pod":null,"container":null}'
    >>> encode(GpuProcess(pid=7, sm_util_pct=101.0))
    Traceback (most recent call last):
    ...
    events.records.RecordError: Expected `float` <= 100.0 - at `$.sm_util_pct`
    """
    check(record)
    return _ENCODER.encode(record)


def check(record: Any) -> None:
    """Validate a record built in Python as decoding would, its nested records included.

    A prediction's what-if entries checked once are not checked again while :data:`CHECKED_LISTS` remembers their
    list (the same list object: serving hands one job set's entries to every prediction of it, 26 entries checked
    in about 10 us, and nothing changes them once made); nothing else of the prediction depends on them."""
    cls: Any = type(record)
    nested = _nested(cls)
    try:
        if not nested:
            msgspec.convert(msgspec.structs.asdict(record), cls)
            return
        fields = msgspec.structs.asdict(record)
        fresh = []
        for name in nested:
            value = fields[name]
            remembered = name == "what_if" and cls is Prediction
            if remembered and value and _CHECKED_LISTS.get(id(value)) is value:
                fields[name] = []
                continue
            fields[name] = msgspec.to_builtins(value)
            if remembered and value:
                fresh.append(value)
        msgspec.convert(fields, cls)
    except msgspec.ValidationError as exc:
        raise RecordError(str(exc)) from None
    except TypeError as exc:  # to_builtins of an object JSON has no form for
        raise RecordError(f"cannot be written as JSON: {exc}") from None
    if len(_CHECKED_LISTS) + len(fresh) > CHECKED_LISTS:
        _CHECKED_LISTS.clear()
    _CHECKED_LISTS.update((id(v), v) for v in fresh)


CHECKED_LISTS = 4096
"""What-if lists :func:`check` remembers as checked (each kept alive, so that its id stays its own)."""

_CHECKED_LISTS: dict[int, list[Any]] = {}


@functools.cache
def _nested(cls: Any) -> tuple[str, ...]:
    """A record's fields that hold records (lists of them): ``convert`` takes a nested record instance as it is,
    so those go as builtins; the others as they are, which is cheaper."""

    def holds_records(t: msgspec.inspect.Type) -> bool:
        if isinstance(t, msgspec.inspect.UnionType):
            return any(holds_records(u) for u in t.types)
        return isinstance(t, msgspec.inspect.ListType) and isinstance(t.item_type, msgspec.inspect.StructType)

    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    return tuple(f.name for f in info.fields if holds_records(f.type))


def decode(cls: type[T], data: bytes | bytearray | memoryview | str | None) -> T:
    """Parse and validate ``data`` as a ``cls`` record; raise :class:`RecordError` otherwise.

    >>> from events.records import GpuProcess
    >>> decode(GpuProcess, b'{"pid": 7}')
    GpuProcess(pid=7, used_mem_mb=None, sm_util_pct=None, mem_util_pct=None, namespace=None, pod=None, container=None)
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


@functools.cache
def _undecoded(batch: type, field: str) -> Any:
    """``batch`` with its list ``field`` left undecoded (each item a :class:`msgspec.Raw`, the list under the same
    constraints), to read a batch item by item: the same fields, declared once, in ``events.records``."""
    fields: list[Any] = []
    for f in msgspec.structs.fields(batch):
        kind: Any = Annotated[list[msgspec.Raw], *f.type.__metadata__] if f.name == field else f.type
        fields.append((f.name, kind) if f.default is msgspec.NODEFAULT else (f.name, kind, f.default))
    return msgspec.defstruct(f"_{batch.__name__}View", fields, frozen=True, gc=False)


class _Batching(NamedTuple):
    """How a topic's batch is read: its record, its batch, the batch undecoded, the list's key, and the field that
    every record of a batch shares with it (``host``; ``environment`` for observations)."""

    item: type
    batch: type
    field: str
    group: str = "host"

    @property
    def view(self) -> Any:
        """The batch with its records left undecoded."""
        return _undecoded(self.batch, self.field)

    @property
    def mark(self) -> bytes:
        """Only the batch has this key (a record that carries it as an unknown field is still read as one)."""
        return f'"{self.field}"'.encode()


_BATCHING: dict[type, _Batching] = {
    MetricSample: _Batching(MetricSample, HostMetrics, "samples"),
    JobEvent: _Batching(JobEvent, HostJobEvents, "events"),
    Observation: _Batching(Observation, ObservationBatch, "observations", "environment"),
}


class Rejected(NamedTuple):
    """One record of a batch that cannot be used: its own JSON and why."""

    payload: bytes
    error: str


class MetricsRecord(NamedTuple):
    """What one ``gpu.metrics`` record holds: its valid samples, the rejected ones, and whether it was a batch."""

    samples: list[MetricSample]
    rejected: list[Rejected]
    batched: bool


class ObservationsRecord(NamedTuple):
    """What one ``interference.observations`` record holds: its valid observations, the rejected ones, and whether
    it was a batch (:class:`ObservationBatch`)."""

    observations: list[Observation]
    rejected: list[Rejected]
    batched: bool


class JobsRecord(NamedTuple):
    """What one ``jobs.lifecycle`` record holds: its valid events, the rejected ones, and whether it was a batch."""

    events: list[JobEvent]
    rejected: list[Rejected]
    batched: bool


def _read(b: _Batching, data: bytes | bytearray | memoryview | str | None) -> tuple[list[Any], list[Rejected], bool]:
    """(valid records, rejected ones, batched) of one message that is a ``b.item`` or a ``b.batch``."""
    data = _as_bytes(data)
    if data is None or b.mark not in data:
        return [decode(b.item, data)], [], False
    try:
        return list(getattr(_decoder(b.batch).decode(data), b.field)), [], True  # one call for a valid batch
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        pass
    try:
        view: Any = decode(b.view, data)
    except RecordError as not_a_batch:
        try:
            return [decode(b.item, data)], [], False
        except RecordError:
            raise not_a_batch from None
    items: list[Any] = []
    rejected: list[Rejected] = []
    for i, raw in enumerate(getattr(view, b.field)):
        try:
            item: Any = decode(b.item, bytes(raw))
        except RecordError as exc:
            rejected.append(Rejected(bytes(raw), f"{b.field}[{i}]: {exc}"))
            continue
        mine, theirs = getattr(item, b.group), getattr(view, b.group)
        if mine != theirs:
            rejected.append(Rejected(bytes(raw), f"{b.field}[{i}]: {b.group} {mine!r} is not the batch's {b.group} {theirs!r}"))
            continue
        items.append(item)
    return items, rejected, True


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
    return MetricsRecord(*_read(_BATCHING[MetricSample], data))


def job_events(data: bytes | bytearray | memoryview | str | None) -> JobsRecord:
    """The job events of one ``jobs.lifecycle`` record: a :class:`JobEvent`, or a :class:`HostJobEvents`
    (read as :func:`metric_samples` reads samples).

    >>> one = b'{"ts": 1.7e9, "kind": "started", "job_id": "j1", "job_type": "r50", "gpu_uuid": "GPU-1", "host": "h"}'
    >>> other = one.replace(b'"host": "h"', b'"host": "g"')
    >>> out = job_events(b'{"ts": 1.7e9, "host": "h", "events": [' + one + b", " + other + b"]}")
    >>> [e.job_id for e in out.events], [r.error for r in out.rejected], out.batched
    (['j1'], ["events[1]: host 'g' is not the batch's host 'h'"], True)
    """
    return JobsRecord(*_read(_BATCHING[JobEvent], data))


def observations(data: bytes | bytearray | memoryview | str | None) -> ObservationsRecord:
    """The observations of one ``interference.observations`` record: an :class:`Observation`, or an
    :class:`ObservationBatch` (read as :func:`metric_samples` reads samples: an invalid observation inside a valid
    envelope is returned in ``rejected``, the others are kept).

    >>> one = encode(Observation(window_start=1.7e9, window_end=1.7e9 + 10, gpu_uuid="GPU-1", environment="v100",
    ...                          job_id="j1", job_type="r50", co_job_types=["vgg"]))
    >>> other = one.replace(b'"environment":"v100"', b'"environment":"a100"')
    >>> out = observations(b'{"environment": "v100", "observations": [' + one + b", " + other + b"]}")
    >>> [o.job_id for o in out.observations], [r.error for r in out.rejected], out.batched
    (['j1'], ["observations[1]: environment 'a100' is not the batch's environment 'v100'"], True)
    >>> observations(one).batched
    False
    """
    return ObservationsRecord(*_read(_BATCHING[Observation], data))


def observation_batches(records: list[Observation], max_bytes: int) -> list[tuple[str, bytes, int]]:
    """``records`` as :class:`ObservationBatch` messages: ``(environment, value, observations in it)``, one per
    environment in the order each first appears, split where the next observation would take a value past
    ``max_bytes`` or past :data:`MAX_OBSERVATIONS_PER_BATCH` (an observation bigger than ``max_bytes`` goes alone).

    Each observation is validated and encoded once (:func:`encode`); the envelope is written around the encoded
    observations, which is what encoding the :class:`ObservationBatch` would write.

    >>> o = Observation(window_start=1.7e9, window_end=1.7e9 + 10, gpu_uuid="GPU-1", environment="v100",
    ...                 job_id="j1", job_type="r50", co_job_types=["vgg"])
    >>> [(env, n) for env, _value, n in observation_batches([o, o, o], max_bytes=2 * len(encode(o)) + 80)]
    [('v100', 2), ('v100', 1)]
    >>> env, value, n = observation_batches([o], 1 << 20)[0]
    >>> decode(ObservationBatch, value) == ObservationBatch(environment="v100", observations=[o])
    True
    """
    by_env: dict[str, list[bytes]] = {}
    for record in records:
        by_env.setdefault(record.environment, []).append(encode(record))
    out: list[tuple[str, bytes, int]] = []
    for env, parts in by_env.items():
        head = b'{"environment":' + _ENCODER.encode(env) + b',"observations":['
        tail = b'],"schema_version":1}'
        chunk: list[bytes] = []
        size = len(head) + len(tail)
        for part in parts:
            if chunk and (size + len(part) + 1 > max_bytes or len(chunk) >= MAX_OBSERVATIONS_PER_BATCH):
                out.append((env, head + b",".join(chunk) + tail, len(chunk)))
                chunk, size = [], len(head) + len(tail)
            chunk.append(part)
            size += len(part) + 1
        out.append((env, head + b",".join(chunk) + tail, len(chunk)))
    return out


def decode_on_topic(cls: type[T], data: bytes | bytearray | memoryview | str | None) -> T | HostMetrics | HostJobEvents:
    """:func:`decode`, except that where ``cls`` is a record a topic also carries batches of (:class:`MetricSample`,
    :class:`JobEvent`) its batch is read too (whole: any invalid record fails it; stage 1 reads batches with
    :func:`metric_samples` and :func:`job_events`)."""
    data = _as_bytes(data)
    b = _BATCHING.get(cls)
    if b is not None and data is not None and b.mark in data:
        try:
            return decode(b.batch, data)
        except RecordError as not_a_batch:
            try:
                return decode(cls, data)
            except RecordError:
                raise not_a_batch from None
    return decode(cls, data)


def read_records(cls: type[T], data: bytes | bytearray | memoryview | str | None) -> tuple[list[Any], list[Rejected]]:
    """The single records in one message of a topic whose record is ``cls``: a batch's (:class:`HostMetrics`
    samples, :class:`HostJobEvents` events, :class:`ObservationBatch` observations, read as :func:`metric_samples`
    reads them: invalid ones in ``rejected``), or the record itself. Raises :class:`RecordError` where the message
    is neither.

    >>> e = JobEvent(ts=1.7e9, kind="started", job_id="j1", job_type="r50", gpu_uuid="GPU-1", host="h")
    >>> read_records(JobEvent, encode(HostJobEvents(ts=1.7e9, host="h", events=[e, e]))) == ([e, e], [])
    True
    >>> read_records(JobEvent, encode(e)) == ([e], [])
    True
    """
    b = _BATCHING.get(cls)
    if b is None:
        return [decode(cls, data)], []
    records, rejected, _batched = _read(b, data)
    return records, rejected


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

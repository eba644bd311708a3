"""Stage-1 state in Kafka: a compacted changelog that moves a partition's GPUs to its next owner.

``aip.stage1.changelog`` has one partition per input partition; the owner of input
partition ``p`` writes to changelog partition ``p`` (explicitly, not by key hash) at each
checkpoint, right before its offsets are committed: one record per GPU it touched since
(``gpu:<uuid>``: open windows, watermarks, job set, dedup positions, and the
job-windows held for a solo profile not yet known) and then the
partition's input positions (``positions``).  A worker handed partition ``p`` reads
changelog partition ``p`` from the beginning before stage 1 touches ``p``'s events,
keeps the latest record per key, and continues those GPUs where the last owner's
checkpoint left them; the input read again from the committed offsets is deduplicated
as after a local restart.

GPU states travel in buckets (setting ``changelog_buckets``, 32): a GPU belongs to bucket ``crc32(uuid) % n``, and a
write of any GPU of a bucket writes every GPU the partition holds in it, as one record keyed ``gpus:<n>:<bucket>``.
So compaction keeps, per key, a complete bucket, and a partition of 1,000 GPUs is 32 records a checkpoint instead of
1,000: the producer's cost is per record (faust's buffer sends one at a time; measured, docs/BENCHMARKS.md "Fleet").
``changelog_buckets`` 0 writes one ``gpu:<uuid>`` record per GPU, as workers before it did; every
worker reads both, in log order (a bucket's record replaces whatever was read before of that bucket's GPUs).

Where the partition ends: the new owner writes a ``fence`` record of its own to the
partition and reads until it has seen it (the broker answered the offset of that
write).  ListOffsets is never asked (the embedded broker's undercounts: 2,341 for 3,000
readable records, measured), and the fence is correct on Apache Kafka too: the last
owner's final checkpoint is flushed before it leaves the group (revocation commits),
so it precedes any fence written after the new assignment.
"""

from __future__ import annotations

import time
import uuid
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from config import Settings
from streams import checkpoint
from streams.checkpoint import TopicPartition
from streams.stage1 import HeldWindow
from streams.windows import GpuState

GPU_PREFIX = "gpu:"
BUCKET_PREFIX = "gpus:"
POSITIONS = "positions"
FENCE = "fence"


class GpuEntry(msgspec.Struct):
    """A GPU's latest changelog record: its state and the job-windows held for a solo profile not yet known."""

    state: GpuState
    held: list[HeldWindow] = []


class BucketRecord(msgspec.Struct):
    """Every GPU a partition holds in one bucket."""

    gpus: dict[str, GpuEntry]


class PositionsRecord(msgspec.Struct):
    """A partition's input positions (:func:`streams.checkpoint.encode`), the window length and who wrote them."""

    positions: dict[str, int]
    window_s: float
    writer: str
    ts: float


class FenceRecord(msgspec.Struct):
    writer: str
    nonce: str


def gpu_record(gpu_uuid: str, state: GpuState | msgspec.Raw, held: Iterable[HeldWindow] = ()) -> tuple[bytes, bytes]:
    """One GPU's state (or its JSON, written as it is) and the job-windows held for a solo profile that has not
    arrived yet."""
    return (GPU_PREFIX + gpu_uuid).encode(), msgspec.json.encode(GpuEntry(state, list(held)))  # type: ignore[arg-type]


def bucket_of(gpu_uuid: str, buckets: int) -> int:
    """The bucket of ``gpu_uuid`` among ``buckets`` (the same in every process and version).

    >>> bucket_of("GPU-1", 32), bucket_of("GPU-1", 32) == bucket_of("GPU-1", 32)
    (8, True)
    """
    return zlib.crc32(gpu_uuid.encode()) % buckets


def bucket_record(
    bucket: int, buckets: int, gpus: Mapping[str, tuple[GpuState | msgspec.Raw, Iterable[HeldWindow]]]
) -> tuple[bytes, bytes]:
    """Every GPU of one bucket of a partition: ``{uuid: (state or its JSON, held job-windows)}``, all in ``bucket``."""
    body = BucketRecord({g: GpuEntry(state, list(held)) for g, (state, held) in gpus.items()})  # type: ignore[arg-type]
    return f"{BUCKET_PREFIX}{buckets}:{bucket}".encode(), msgspec.json.encode(body)


def positions_record(positions: Mapping[TopicPartition, int], window_s: float, writer: str) -> tuple[bytes, bytes]:
    body = PositionsRecord(checkpoint.encode(positions), window_s, writer, time.time())
    return POSITIONS.encode(), msgspec.json.encode(body)


class PartitionState:
    """What changelog partition ``p`` says: GPU states (latest per GPU) and the input positions they cover."""

    def __init__(
        self, gpus: dict[str, GpuEntry], positions: dict[TopicPartition, int], window_s: float | None, skipped: int = 0
    ) -> None:
        self.gpus = gpus
        self.positions = positions
        self.window_s = window_s
        self.skipped = skipped
        """Records that were not of this form (another version's): left out."""

    def newer_than(self, local: Mapping[TopicPartition, int]) -> bool:
        """Whether these positions are beyond ``local`` (this worker's own, restored from its checkpoint)."""
        if not self.positions:
            return False
        return any(off > local.get(tp, -1) for tp, off in self.positions.items())


def _body(name: str, value: bytes | None) -> GpuEntry | BucketRecord | PositionsRecord | None:
    """A record's value decoded as its key says (None: a deletion, a fence); ``msgspec.DecodeError`` on another form."""
    if value is None:
        return None
    if name.startswith(GPU_PREFIX):
        return msgspec.json.decode(value, type=GpuEntry)
    if name.startswith(BUCKET_PREFIX):
        return msgspec.json.decode(value, type=BucketRecord)
    if name == POSITIONS:
        return msgspec.json.decode(value, type=PositionsRecord)
    return None


def fold(records: Iterable[tuple[bytes | None, bytes | None]]) -> PartitionState:
    """The latest value per key of a changelog partition's records, in log order (a record that does not decode as
    its key says, another version's, is left out and counted in :attr:`PartitionState.skipped`).

    >>> k, v = gpu_record("GPU-1", GpuState(closed=3))  # GPU state (and held job-windows)
    >>> p, q = positions_record({TopicPartition("gpu.metrics", 0): 41}, 10.0, "w")
    >>> s = fold([(k, v), (p, q), (b"fence", b"{}")])
    >>> {g: e.state.closed for g, e in s.gpus.items()}, s.positions, s.window_s
    ({'GPU-1': 3}, {TopicPartition(topic='gpu.metrics', partition=0): 41}, 10.0)
    >>> b = bucket_of("GPU-1", 32)
    >>> fold([(k, v), bucket_record(b, 32, {"GPU-1": (GpuState(closed=4), [])})]).gpus["GPU-1"].state.closed  # the bucket replaces what was read
    4
    >>> fold([(k, v), bucket_record(b, 32, {})]).gpus  # ... GPUs it no longer holds included
    {}
    >>> fold([(k, b'{"state":{"env":"v100"}}')]).skipped  # another version's form
    1
    """
    gpus: dict[str, GpuEntry] = {}
    members: dict[tuple[int, int], set[str]] = {}  # (buckets, bucket) -> the GPUs its last record held
    others: set[str] = set()  # GPUs last read from anything but a record of ``last_n`` buckets
    last_n = 0
    positions: dict[TopicPartition, int] = {}
    window_s = None
    skipped = 0
    for key, value in records:
        if key is None:
            continue
        name = key.decode(errors="replace")
        try:
            body = _body(name, value)
        except msgspec.DecodeError:
            skipped += 1
            continue
        if name.startswith(GPU_PREFIX):
            gpu = name[len(GPU_PREFIX) :]
            if isinstance(body, GpuEntry):
                gpus[gpu] = body
                others.add(gpu)
            else:
                gpus.pop(gpu, None)
        elif isinstance(body, BucketRecord):
            n, b = (int(x) for x in name[len(BUCKET_PREFIX) :].split(":"))
            if n != last_n:  # another bucket count (a changed setting): every GPU read so far is of the others
                others, last_n = set(gpus), n
                members = {k: v for k, v in members.items() if k[0] == n}
            replaced = members.pop((n, b), set()) | {g for g in others if bucket_of(g, n) == b}
            for gpu in replaced:
                gpus.pop(gpu, None)
            others -= replaced
            for gpu, entry in body.gpus.items():
                gpus[gpu] = entry
                others.discard(gpu)
            members[(n, b)] = set(body.gpus)
        elif isinstance(body, PositionsRecord):
            positions = checkpoint.decode(body.positions)
            window_s = body.window_s
    return PartitionState(gpus, positions, window_s, skipped)


def read_partition(
    settings: Settings, topic: str, partition: int, writer: str, timeout_s: float = 60.0, consumer: Any = None
) -> PartitionState:
    """Write a fence to changelog ``partition``, read the partition from the beginning up to it, fold it (blocking).

    ``consumer`` is injectable (tests): by default a :class:`transport.RawConsumer` of the settings."""
    from transport import RawConsumer, RecordProducer

    with RawConsumer(settings, consumer) as reader:
        if partition not in reader.partitions(topic):
            return PartitionState({}, {}, None)  # no changelog (topics created by an older version): start afresh
        with RecordProducer(settings, max_block_ms=int(timeout_s * 1000)) as producer:
            fence = msgspec.json.encode(FenceRecord(writer, uuid.uuid4().hex))
            sent = producer.send_to(topic, partition, fence, key=FENCE.encode())
            fence_offset = int(sent.get(timeout=timeout_s).offset)
        records: list[tuple[bytes | None, bytes | None]] = []
        reader.assign(topic, partition)
        deadline = time.monotonic() + timeout_s
        while reader.position() <= fence_offset:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}[{partition}] up to its fence at {fence_offset} took over {timeout_s:g} s")
            records.extend((k, v) for offset, k, v in reader.poll(timeout_s=0.5, max_records=5000) if offset <= fence_offset)
    return fold(records)

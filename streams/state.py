"""Stage 1's bookkeeping around :class:`streams.stage1.Stage1`: where each GPU is read from, the input
positions applied, the local checkpoint, and the changelog in Kafka (:mod:`streams.changelog`).

Stage-1 state (per-GPU windows, job sets, dedup positions, solo profiles) is checkpointed to a
local file, and input offsets are committed only right after a checkpoint (faust's periodic
auto-commit is off): the committed offsets never run ahead of the saved state.  After a crash
the worker loads the checkpoint, faust seeks to the committed offsets, and the events read
again are dropped as duplicates (seq per producer, lifecycle resends).  The same state, per
input partition, goes to the changelog, so that a partition's next owner continues its GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from streams import changelog
from streams.checkpoint import Checkpoint, TopicPartition
from streams.checkpoint import decode as decode_offsets
from streams.checkpoint import encode as encode_offsets
from streams.stage1 import SavedStage1, Stage1

log = logging.getLogger(__name__)


class Stage1Checkpoint(msgspec.Struct):
    """The local checkpoint file: stage 1's state, the input partition each GPU is read from, the input positions."""

    version: int
    saved_at: float
    stage1: SavedStage1
    partitions: dict[str, int]
    positions: dict[str, int]
    """:func:`streams.checkpoint.encode`."""


CHECKPOINT_VERSION = 2


@dataclass(eq=False)
class Stage1State:
    """Which input partition each GPU is read from, the positions applied, the checkpoint and the changelog.

    ``send(key, value, partition)`` writes a changelog record (the worker: faust's producer, flushed
    before its commits); ``read(partition)`` reads a changelog partition up to a fence (blocking; run in
    an executor).  Both are I/O boundaries, arguments so that tests can drive the rest without Kafka.
    """

    stage1: Stage1
    checkpoint_path: Path
    _: KW_ONLY
    send: Callable[[bytes, bytes, int], Any] | None = None
    read: Callable[[int], changelog.PartitionState] | None = None
    writer_id: str = ""
    catch_up_s: float = 15.0
    offsets: Checkpoint = field(default_factory=Checkpoint)
    """The input offsets applied to stage 1."""
    buckets: int = 0
    """Changelog records per partition (0: one per GPU; see streams.changelog)."""

    def __post_init__(self) -> None:
        self.gpu_partition: dict[str, int] = {}  # GPU -> input partition it was last read from
        self.assigned: set[int] = set()  # input partitions assigned to this process
        self.touched: set[str] = set()  # GPUs whose state changed since the last changelog write
        self.enabled = False  # the changelog is used once the worker runs (unit tests drive stage 1 without a broker)
        self.checkpoints = 0
        self._prepared: bytes | None = None  # a checkpoint taken, not written yet
        self.released: list[Any] = []  # observations of adopted held job-windows whose profile was known: to publish
        self._logged: dict[int, dict[TopicPartition, int]] = {}  # input positions last written to the changelog
        self._restoring: dict[int, asyncio.Future[int]] = {}  # input partitions whose changelog is being read
        self._read: set[int] = set()  # input partitions whose changelog was read since they were assigned here
        self._ready: set[int] = set()  # ... and checked against the first offsets the group handed over (:meth:`restored`)
        self._encoded: dict[str, msgspec.Raw] | None = None  # within :meth:`encoding_once`: each GPU's state as JSON

    @contextlib.contextmanager
    def encoding_once(self) -> Iterator[None]:
        """Within it, each GPU's state is encoded at most once, for both the changelog and the checkpoint (a commit
        writes every GPU read since the last one to both: measured, each encoding was about 2 % of a worker's CPU in
        ``aip bench fleet``).  The bytes written are the same: msgspec writes a :class:`msgspec.Raw` as it is.  Only
        around code that does not change stage 1's state (:meth:`streams.commits.Commits.on_commit_initiated`)."""
        self._encoded = {}
        try:
            yield
        finally:
            self._encoded = None

    def _state_of(self, gpu: str) -> Any:
        """A GPU's state to encode: itself, or within :meth:`encoding_once` its JSON, encoded once."""
        st = self.stage1.gpus[gpu]
        if self._encoded is None:
            return st
        raw = self._encoded.get(gpu)
        if raw is None:
            raw = self._encoded[gpu] = msgspec.Raw(msgspec.json.encode(st))
        return raw

    @property
    def positions(self) -> dict[TopicPartition, int]:
        """The last input offset applied to stage 1 per input partition (``self.offsets`` holds them)."""
        return self.offsets.offsets

    def read_from(self, gpu_uuid: str, partition: int) -> None:
        """A record of ``gpu_uuid`` was read from input ``partition``: its state goes to that partition's changelog."""
        self.gpu_partition[gpu_uuid] = partition
        self.touched.add(gpu_uuid)

    def read_all_from(self, gpu_uuids: list[str], partition: int) -> None:
        """:meth:`read_from` for each GPU of a host's batch (one partition)."""
        self.gpu_partition.update(dict.fromkeys(gpu_uuids, partition))
        self.touched.update(gpu_uuids)

    def take_released(self) -> list[Any]:
        released, self.released = self.released, []
        return released

    # ------------------------------------------------------------ local file
    def load_checkpoint(self) -> bool:
        """Restore stage 1 from the checkpoint file (False when there is none or it is unreadable)."""
        try:
            data = msgspec.json.decode(self.checkpoint_path.read_bytes(), type=Stage1Checkpoint)
        except FileNotFoundError:
            return False
        except Exception as exc:  # a damaged file must not stop the worker: start afresh
            log.warning("ignoring unreadable stage-1 checkpoint %s: %s", self.checkpoint_path, exc)
            return False
        self.stage1.restore(data.stage1)
        self.gpu_partition = {g: p for g, p in data.partitions.items() if g in self.stage1.gpus}
        self.offsets.offsets = decode_offsets(data.positions)
        self.stage1.counters["restored_gpus"] += len(self.stage1.gpus)
        self.stage1.counters["restored_profiles"] += len(self.stage1.profiles)
        log.info(
            "stage 1 restored %d GPUs and %d solo profiles from %s",
            *(len(self.stage1.gpus), len(self.stage1.profiles), self.checkpoint_path),
        )
        return True

    def checkpoint(self) -> None:
        """Write stage 1's state atomically (temporary file, fsync, rename)."""
        self.prepare_checkpoint()
        self.write_prepared()

    def prepare_checkpoint(self) -> None:
        """Take stage 1's state as it is now, to be written by :meth:`write_prepared` (the worker: once the outputs
        made so far are acknowledged, right before the offsets are committed; see :mod:`streams.outputs`)."""
        saved = self.stage1.to_state()
        if self._encoded is not None:
            saved.gpus = {g: self._state_of(g) for g in saved.gpus}
        self._prepared = msgspec.json.encode(
            Stage1Checkpoint(CHECKPOINT_VERSION, time.time(), saved, self.gpu_partition, encode_offsets(self.positions))
        )
        self.stage1.dirty.clear()

    def write_prepared(self) -> bool:
        """Write the state :meth:`prepare_checkpoint` took, if not written yet (atomically: temporary file, fsync,
        rename)."""
        body, self._prepared = self._prepared, None
        if body is None:
            return False
        tmp = self.checkpoint_path.with_suffix(".json.tmp")
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.checkpoint_path)
        self.checkpoints += 1
        return True

    # -------------------------------------------------------------- changelog
    def publish_changelog(self) -> int:
        """Write the GPUs touched since the last call, then each owned partition's input positions, to the
        changelog partition of their input partition; return the records sent."""
        if self.send is None:
            self.touched.clear()
            return 0
        sent = 0
        partitions: set[int] = set()
        if self.buckets:
            sent += self._publish_buckets(partitions)
        else:
            held = self.stage1.held_by_gpu(self.touched) if self.stage1.held else {}
            for gpu in self.touched:
                partition = self.gpu_partition.get(gpu)
                if partition is None or gpu not in self.stage1.gpus:
                    continue
                self.send(*changelog.gpu_record(gpu, self._state_of(gpu), held.get(gpu, ())), partition)
                partitions.add(partition)
                sent += 1
        self.touched.clear()
        for partition in sorted(partitions | self.assigned):
            mine = self.offsets.of_partition(partition)
            if mine and mine != self._logged.get(partition):
                self.send(*changelog.positions_record(mine, self.stage1.window_s, self.writer_id), partition)
                self._logged[partition] = mine
                sent += 1
        return sent

    def _publish_buckets(self, partitions: set[int]) -> int:
        """Each (partition, bucket) holding a GPU touched since the last write, whole (:mod:`streams.changelog`)."""
        assert self.send is not None
        n = self.buckets
        dirty = {
            (p, changelog.bucket_of(g, n))
            for g in self.touched
            if (p := self.gpu_partition.get(g)) is not None and g in self.stage1.gpus
        }
        if not dirty:
            return 0
        members: dict[tuple[int, int], list[str]] = {}
        for g, p in self.gpu_partition.items():
            if g in self.stage1.gpus and (k := (p, changelog.bucket_of(g, n))) in dirty:
                members.setdefault(k, []).append(g)
        held = self.stage1.held_by_gpu([g for gs in members.values() for g in gs]) if self.stage1.held else {}
        for (p, b), gpus in sorted(members.items()):
            entries = {g: (self._state_of(g), held.get(g, ())) for g in gpus}
            self.send(*changelog.bucket_record(b, n, entries), p)
            partitions.add(p)
        return len(members)

    async def restore_partition(self, partition: int) -> int:
        """Continue input partition ``partition``'s GPUs from the changelog when it is beyond this worker's own
        state of them (a partition another worker had); return the GPUs restored."""
        assert self.read is not None
        loop = asyncio.get_running_loop()
        try:
            state = await loop.run_in_executor(None, self.read, partition)
        except Exception as exc:  # the partition's GPUs then start afresh
            log.warning("could not read the stage-1 changelog of partition %d: %s", partition, exc)
            self.stage1.counters["changelog_restore_failed"] += 1
            return 0
        finally:
            self._restoring.pop(partition, None)
            self._read.add(partition)
        self.stage1.counters["changelog_skipped_records"] += state.skipped  # another version's form
        local = self.offsets.of_partition(partition)
        if not state.newer_than(local) or state.window_s != self.stage1.window_s:
            log.warning("stage 1 keeps its own state of partition %d (changelog %s, own %s)", partition, state.positions, local)
            return 0
        stale = [g for g, p in self.gpu_partition.items() if p == partition]
        self.stage1.forget(stale)
        self.stage1.drop_held(set(stale) | set(state.gpus))
        for g in stale:
            del self.gpu_partition[g]
        adopted = released = 0
        for gpu, entry in state.gpus.items():
            self.stage1.gpus[gpu] = entry.state
            self.gpu_partition[gpu] = partition
            out = self.stage1.adopt_held(entry.held)
            adopted += len(entry.held)
            released += len(out)
            self.released.extend(out)
        self.stage1.counters["changelog_adopted_held"] += adopted
        self.offsets.take_over(partition, state.positions)  # events up to these were applied by the last owner
        self._logged[partition] = dict(state.positions)
        self.stage1.counters["changelog_restored_gpus"] += len(state.gpus)
        log.warning(
            "stage 1 continues %d GPUs of partition %d from the changelog (positions %s; %d held job-windows, %d released)",
            *(len(state.gpus), partition, state.positions, adopted, released),
        )
        return len(state.gpus)

    def _restore_task(self, partition: int) -> asyncio.Future[int]:
        future = self._restoring.get(partition)
        if future is None:
            future = self._restoring[partition] = asyncio.ensure_future(self.restore_partition(partition))
        return future

    def ready(self, partition: int) -> bool:
        """Whether events of ``partition`` may be applied: its changelog was read since it was assigned here, and
        it reached the first offsets the group handed over (:meth:`restored`)."""
        return not self.enabled or partition in self._ready

    async def restored(self, firsts: dict[int, dict[TopicPartition, int]]) -> None:
        """Read the changelog of input partitions not read since they were assigned here, before any of their
        events is applied (faust may hand over events before its assignment signal); ``firsts`` gives, per
        partition, the first offset of each input topic the group handed over.

        The group resumes a partition at the last owner's committed offset, and the last owner writes its
        changelog before it commits: a changelog whose positions stop short of that offset was read before
        the last owner's final write (it left the group late). Read it again until it reaches the offset
        (at most ``catch_up_s``), so the events in between are not skipped.  The read started at the assignment
        may have finished before the first event came: it is checked all the same."""
        for p in sorted(firsts):
            if p in self._ready:
                continue
            if p not in self._read or p in self._restoring:
                await asyncio.shield(self._restore_task(p))
            deadline = time.monotonic() + self.catch_up_s
            while not self.offsets.covers(p, firsts[p]) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                await self.restore_partition(p)
            if not self.offsets.covers(p, firsts[p]):
                log.warning("stage-1 changelog of partition %d stops short of %s: continuing from it", p, firsts[p])
                self.stage1.counters["changelog_behind"] += 1
            self._ready.add(p)

    # ------------------------------------------------------------ assignment
    def assign(self, mine: set[int]) -> None:
        """A new assignment of input partitions: read the changelog of new ones, forget GPUs of lost ones.

        Only partitions this process held and lost count: GPUs restored from the checkpoint whose
        partitions are not (yet) assigned are kept, because a restarted worker's first assignment
        can be partial while the group still counts the killed member (it gets them back a rebalance later).
        """
        lost = self.assigned - mine
        for p in sorted(mine - self.assigned) if self.enabled else ():
            self._restore_task(p)  # start reading its changelog now; stage 1 waits for it before the first event
        self._read -= lost
        self._ready -= lost
        self.assigned = mine
        if not lost:
            return
        gone = [g for g, p in self.gpu_partition.items() if p in lost]
        if gone:
            held = sum(len(v) for v in self.stage1.held_by_gpu(gone).values())
            positions = encode_offsets({tp: o for tp, o in self.positions.items() if tp.partition in lost})
            log.warning(
                "forgetting %d GPUs (%d held job-windows) of partitions %s, now assigned elsewhere; positions %s",
                *(len(gone), held, sorted(lost), positions),
            )
            self.stage1.forget(gone)
            self.stage1.drop_held(gone)
            for g in gone:
                del self.gpu_partition[g]
        self.offsets.forget(lost)
        for p in lost:
            self._logged.pop(p, None)

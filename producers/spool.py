"""A bounded on-disk spool: records wait here, in order, until the broker acknowledges them.

Records are appended to segment files of ``segment_records`` records each
(length-prefixed frames: topic, key, value).  Only the head and tail segments
are held in memory.  Each record gets a spool index that grows by one per
append; the sender reads a batch from the head with :meth:`peek` and removes it
with :meth:`commit` once the broker has it.  When more than ``max_records``
wait, the oldest are dropped and counted in :attr:`dropped`.  Segments left by
a previous process are delivered first (the head segment again from its
start: duplicates are possible, consumers detect them by ``seq``).

>>> import tempfile
>>> s = Spool(tempfile.mkdtemp(), max_records=3)
>>> for i in range(5):
...     _ = s.append("gpu.metrics", b"k", b"%d" % i)
>>> len(s), s.dropped, [value for _, _, _, value in s.peek(10)]
(3, 2, [b'2', b'3', b'4'])
>>> s.commit(s.peek(1)[0][0]), len(s)
(1, 2)
"""

from __future__ import annotations

import os
import struct
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

_HEADER = struct.Struct(">HiI")  # topic length, key length (-1: None), value length
Entry = tuple[int, str, bytes | None, bytes]  # spool index, topic, key, value


@dataclass
class _Segment:
    path: Path
    count: int = 0
    pos: int = 0  # records of this segment already committed or dropped
    records: list[tuple[str, bytes | None, bytes]] | None = field(default_factory=list)
    fh: object = None

    def load(self) -> list[tuple[str, bytes | None, bytes]]:
        if self.records is None:
            self.records = read_segment(self.path)
            self.count = len(self.records)
        return self.records


def frame(topic: str, key: bytes | None, value: bytes) -> bytes:
    t = topic.encode()
    return _HEADER.pack(len(t), -1 if key is None else len(key), len(value)) + t + (key or b"") + value


def read_segment(path: Path) -> list[tuple[str, bytes | None, bytes]]:
    """Every complete frame in a segment file (a torn last frame is ignored)."""
    data = path.read_bytes()
    out: list[tuple[str, bytes | None, bytes]] = []
    i = 0
    while i + _HEADER.size <= len(data):
        tlen, klen, vlen = _HEADER.unpack_from(data, i)
        j = i + _HEADER.size
        end = j + tlen + max(klen, 0) + vlen
        if end > len(data):
            break
        topic = data[j : j + tlen].decode()
        key = None if klen < 0 else data[j + tlen : j + tlen + klen]
        out.append((topic, key, data[j + tlen + max(klen, 0) : end]))
        i = end
    return out


class Spool:
    """Thread-safe bounded FIFO of (topic, key, value) on disk."""

    def __init__(self, directory: str | Path, max_records: int = 1_000_000, segment_records: int = 1000) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_records = max(1, max_records)
        self.segment_records = max(1, segment_records)
        self.dropped = 0
        self._lock = threading.Lock()
        self._segments: deque[_Segment] = deque()
        self._total = 0
        self._head_index = 0  # spool index of the oldest waiting record
        self._next_name = 0
        for path in sorted(self.dir.glob("*.seg")):  # left by a previous process
            seg = _Segment(path, records=None)
            seg.load()
            seg.records = None
            self._segments.append(seg)
            self._total += seg.count
            self._next_name = max(self._next_name, int(path.stem) + 1)
        for seg in [s for s in self._segments if not s.count]:
            seg.path.unlink(missing_ok=True)
            self._segments.remove(seg)
        self._trim()

    def __len__(self) -> int:
        return self._total

    @property
    def next_index(self) -> int:
        """The index the next appended record will get."""
        return self._head_index + self._total

    def append(self, topic: str, key: bytes | None, value: bytes) -> int:
        """Store one record at the tail; return its spool index."""
        with self._lock:
            tail = self._segments[-1] if self._segments else None
            if tail is None or tail.count >= self.segment_records or tail.fh is None:
                tail = self._new_segment()
            tail.fh.write(frame(topic, key, value))  # type: ignore[attr-defined]
            tail.fh.flush()  # type: ignore[attr-defined]
            if tail.records is not None:
                tail.records.append((topic, key, value))
            tail.count += 1
            self._total += 1
            index = self._head_index + self._total - 1
            self._trim()
            return index

    def _new_segment(self) -> _Segment:
        if self._segments:
            old = self._segments[-1]
            if old.fh is not None:
                old.fh.close()  # type: ignore[attr-defined]
                old.fh = None
            if len(self._segments) > 1:
                old.records = None  # middle segments live on disk only
        path = self.dir / f"{self._next_name:012d}.seg"
        self._next_name += 1
        seg = _Segment(path, fh=open(path, "ab"))
        self._segments.append(seg)
        return seg

    def _pop_oldest(self, n: int) -> int:
        """Remove up to ``n`` records from the head; the caller holds the lock."""
        removed = 0
        while removed < n and self._segments:
            head = self._segments[0]
            take = min(n - removed, head.count - head.pos)
            head.pos += take
            removed += take
            if head.pos >= head.count and (head.fh is None or head.count >= self.segment_records or len(self._segments) > 1):
                if head.fh is not None:
                    head.fh.close()  # type: ignore[attr-defined]
                head.path.unlink(missing_ok=True)
                self._segments.popleft()
            elif take == 0:
                break
        self._total -= removed
        self._head_index += removed
        return removed

    def _trim(self) -> None:
        excess = self._total - self.max_records
        if excess > 0:
            self.dropped += self._pop_oldest(excess)

    def peek(self, n: int) -> list[Entry]:
        """Up to ``n`` of the oldest records, with their spool indices (not removed)."""
        with self._lock:
            out: list[Entry] = []
            index = self._head_index
            for seg in self._segments:
                records = seg.load()
                for topic, key, value in records[seg.pos : seg.pos + n - len(out)]:
                    out.append((index, topic, key, value))
                    index += 1
                if len(out) >= n:
                    break
                if seg is not self._segments[0] and seg is not self._segments[-1]:
                    seg.records = None
            return out

    def commit(self, through_index: int) -> int:
        """Remove every waiting record with index <= ``through_index``; return how many."""
        with self._lock:
            return self._pop_oldest(max(0, through_index - self._head_index + 1))

    def close(self) -> None:
        with self._lock:
            for seg in self._segments:
                if seg.fh is not None:
                    seg.fh.close()  # type: ignore[attr-defined]
                    seg.fh = None

    def remove_if_empty(self) -> None:
        """Delete the spool directory when nothing waits in it."""
        self.close()
        if self._total == 0:
            for path in self.dir.glob("*.seg"):
                path.unlink(missing_ok=True)
            try:
                os.rmdir(self.dir)
            except OSError:
                pass

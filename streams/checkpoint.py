"""Stage 1's input offsets per ``(topic, partition)``, in one object (the shape of quix-streams' ``Checkpoint``).

The worker applies each input event to stage 1 and stores its offset here; the offsets go
into the local checkpoint file and, per input partition, into the stage-1 changelog
(:mod:`streams.state`), both right before the consumer commits them.  An offset that does
not increase is refused: it was applied before (a replay after a restart or a move), which
the caller learns from :meth:`Checkpoint.store`.

On the wire (the checkpoint file, the changelog's ``positions`` record) a partition is
written ``"<topic>:<partition>"``, as before; :func:`encode` / :func:`decode` are the only
places that spell or parse it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, NamedTuple


class TopicPartition(NamedTuple):
    """An input partition: the topic's base name (``gpu.metrics``, without the prefix) and its number."""

    topic: str
    partition: int


def encode(offsets: Mapping[TopicPartition, int]) -> dict[str, int]:
    """Offsets as the checkpoint file and the changelog write them.

    >>> encode({TopicPartition("gpu.metrics", 3): 41})
    {'gpu.metrics:3': 41}
    """
    return {f"{tp.topic}:{tp.partition}": int(offset) for tp, offset in offsets.items()}


def decode(data: Mapping[str, Any]) -> dict[TopicPartition, int]:
    """The inverse of :func:`encode`.

    >>> decode({"gpu.metrics:3": 41})
    {TopicPartition(topic='gpu.metrics', partition=3): 41}
    """
    out: dict[TopicPartition, int] = {}
    for key, offset in data.items():
        topic, _, partition = key.rpartition(":")
        out[TopicPartition(topic, int(partition))] = int(offset)
    return out


class Checkpoint:
    """The last input offset applied to stage 1 per :class:`TopicPartition`, and the commit of the inputs.

    ``commit()`` commits the input topics' acked offsets (the worker: faust's consumer, whose
    commit hook saves the state they cover first); :meth:`commit` is the one call that does.
    """

    def __init__(self, commit: Callable[[], Awaitable[bool]] | None = None) -> None:
        self.offsets: dict[TopicPartition, int] = {}
        self._commit = commit

    def store(self, tp: TopicPartition, offset: int) -> bool:
        """Store ``offset`` as applied; False (nothing stored) when it does not increase: applied before.

        >>> c = Checkpoint()
        >>> c.store(TopicPartition("gpu.metrics", 0), 7), c.store(TopicPartition("gpu.metrics", 0), 7)
        (True, False)
        """
        last = self.offsets.get(tp)
        if last is not None and offset <= last:
            return False
        self.offsets[tp] = offset
        return True

    def applied(self, tp: TopicPartition) -> int | None:
        return self.offsets.get(tp)

    def of_partition(self, partition: int) -> dict[TopicPartition, int]:
        """The offsets of input partition ``partition`` (every input topic's partition of that number)."""
        return {tp: off for tp, off in self.offsets.items() if tp.partition == partition}

    def covers(self, partition: int, first: Mapping[TopicPartition, int]) -> bool:
        """Whether the offsets of ``partition`` reach the first offsets handed over (each one's predecessor applied)."""
        return all(self.offsets.get(tp, -1) >= offset - 1 for tp, offset in first.items())

    def take_over(self, partition: int, offsets: Mapping[TopicPartition, int]) -> None:
        """The state of ``partition`` was replaced by its last owner's (from the changelog): so are the offsets it
        covers (they may be lower than this worker's own: taken as they are, not through :meth:`store`)."""
        assert all(tp.partition == partition for tp in offsets), offsets
        self.offsets.update(offsets)

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop the offsets of partitions no longer read here."""
        gone = set(partitions)
        for tp in [tp for tp in self.offsets if tp.partition in gone]:
            del self.offsets[tp]

    async def commit(self) -> bool:
        """Commit the input offsets (nothing to commit without a consumer)."""
        return bool(await self._commit()) if self._commit is not None else False

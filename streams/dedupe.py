"""Bounded memory of identities already seen (observation ids, sample sequence numbers)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class SeenSet:
    """Remember the last ``capacity`` identities; ``add`` says whether one is new.

    >>> s = SeenSet(capacity=2)
    >>> s.add("a"), s.add("a"), s.add("b"), s.add("c"), s.add("a")
    (True, False, True, True, True)
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[Hashable, None] = OrderedDict()

    def add(self, identity: Hashable) -> bool:
        if identity in self._seen:
            self._seen.move_to_end(identity)
            return False
        self._seen[identity] = None
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        return True

    def items(self) -> list[Hashable]:
        """The remembered identities, oldest first (for saving)."""
        return list(self._seen)

    def extend(self, identities: list[Hashable]) -> None:
        """Remember saved identities (oldest first), as if added in that order."""
        for identity in identities:
            self.add(identity)

    def __contains__(self, identity: Hashable) -> bool:
        return identity in self._seen

    def __len__(self) -> int:
        return len(self._seen)

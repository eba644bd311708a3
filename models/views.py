"""What a candidate is asked about: its key (mode, category, model) and a sample's views (slot, features).

:data:`VIA` is the mode whose models observed mode also weighs (served as ``placement/<model>``) and on whose
features the newcomer's feature model predicts.  No Kafka, no faust.
"""

from __future__ import annotations

from typing import NamedTuple

from models.datasets import Sample
from models.features import restrict
from models.live import slot

VIA = "placement"
"""The mode whose models observed mode also weighs (served as ``placement/<model>``, see
:meth:`models.selector.Selector.best`), and the mode of the newcomer's feature model."""


class CandidateKey(NamedTuple):
    """One candidate: its mode, category and model."""

    mode: str
    category: str
    model: str

    def name_in(self, mode: str) -> str:
        """The name it is served under in ``mode``: ``placement/<model>`` when observed mode serves placement's.

        >>> CandidateKey("placement", "all", "KNN").name_in("observed"), CandidateKey("observed", "1", "KNN").name_in("observed")
        ('placement/KNN', 'KNN')
        """
        return self.model if self.mode == mode else f"{self.mode}/{self.model}"


class Views:
    """A sample's slot and its features per mode and category, each computed on first use (a what-if needs one
    of eight)."""

    __slots__ = ("_cats", "_full", "sample", "slot")

    def __init__(self, sample: Sample) -> None:
        self.sample = sample
        self.slot = slot(sample.job_type, sample.co_job_types)
        self._full: dict[str, dict[str, float]] = {}
        self._cats: dict[tuple[str, str], dict[str, float]] = {}

    def full(self, mode: str) -> dict[str, float]:
        """Every feature of ``mode`` (empty when the sample has none: no percent changes, no solo profile)."""
        f = self._full.get(mode)
        if f is None:
            f = self._full[mode] = self.sample.features(mode, "all")
        return f

    def has(self, mode: str) -> bool:
        """Whether the sample has features of ``mode``: :meth:`full` is not empty (placement mode's never is: it
        always holds ``n_co``, so they are not made to say so)."""
        return mode == VIA or bool(self.full(mode))

    def get(self, mode: str, category: str) -> dict[str, float]:
        x = self._cats.get((mode, category))
        if x is None:
            full = self.full(mode)
            x = self._cats[(mode, category)] = full if category == "all" or not full else restrict(full, category)
        return x

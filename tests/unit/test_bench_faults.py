"""A fault scenario's figures travel with its exception into ``aip bench faults``' entry."""

from __future__ import annotations

import pytest

from aip.bench.faults import _guard
from aip.faults.scenarios import FaultCheckFailed, check


def test_a_broken_guarantee_is_reported_with_the_scenarios_figures() -> None:
    figures = {"what": "x", "sent": 10, "received": 9, "lost": 1, "recovery_s": 2.5}

    def scenario() -> dict[str, object]:
        check(figures["lost"] == 0, "1 of 10 samples lost", figures)
        return figures

    with pytest.raises(FaultCheckFailed) as raised:
        scenario()
    assert raised.value.result is figures
    entry = _guard("outage", "what the bench says", scenario, progress=lambda _: None)
    assert entry["sent"] == 10 and entry["lost"] == 1 and entry["what"] == "x"
    assert entry["error"] == "FaultCheckFailed: 1 of 10 samples lost"

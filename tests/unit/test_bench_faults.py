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


def test_lanes_run_side_by_side_and_keep_each_lanes_order() -> None:
    import threading

    from aip.bench.faults import run_lanes

    both = threading.Barrier(2, timeout=10)  # passes only while the two lanes run at the same time
    calls: list[str] = []

    def step(name: str, meet: bool = False):  # type: ignore[no-untyped-def]
        def fn() -> dict[str, object]:
            calls.append(name)
            if meet:
                both.wait()
            return {"lost": 0, "name": name}

        return name, fn

    lanes = [[step("a1", meet=True), step("a2")], [step("b1"), step("b2", meet=True)]]
    out = run_lanes(lanes, side_by_side=True, progress=lambda _: None)
    assert list(out) == ["a1", "a2", "b1", "b2"] and out["b2"] == {"lost": 0, "name": "b2"}
    assert calls.index("b1") < calls.index("b2") and calls.index("a1") < calls.index("a2")

    calls.clear()
    out = run_lanes([[step("x1"), step("x2")], [step("y1")]], side_by_side=False, progress=lambda _: None)
    assert calls == ["x1", "x2", "y1"] and list(out) == calls

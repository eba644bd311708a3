"""``aip bench fleet``'s harness: its profilers (one ``py-spy record`` per process, GIL holders only with
``AIP_BENCH_FLEET_PROFILE_GIL``) and its reader's view of a prediction."""

from __future__ import annotations

import stat
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from records import records_of

from aip.bench import fleet_harness
from events import Prediction, encode


def _fake_pyspy(tmp_path: Path) -> Path:
    exe = tmp_path / "py-spy"
    exe.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls.txt"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


@pytest.mark.parametrize(("gil", "expected"), [("", False), ("0", False), ("1", True)])
def test_profilers_sample_the_gil_holder_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gil: str, expected: bool
) -> None:
    exe = _fake_pyspy(tmp_path)
    monkeypatch.setenv("AIP_PYSPY", str(exe))
    monkeypatch.setenv(fleet_harness.PROFILE_ENV, str(tmp_path / "prof"))
    monkeypatch.setenv(fleet_harness.PROFILE_GIL_ENV, gil)
    for p in fleet_harness.start_profilers({"w0": 101, "w1": 102, "sender": None}, 30.0):
        assert p.wait(timeout=10) == 0
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert sorted(c.split()[2] for c in calls) == ["101", "102"]  # record --pid N: each process with a pid
    assert all(("--gil" in c.split()) is expected and "--nonblocking" in c.split() for c in calls)


def test_no_profilers_without_a_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AIP_PYSPY", str(_fake_pyspy(tmp_path)))
    monkeypatch.delenv(fleet_harness.PROFILE_ENV, raising=False)
    assert fleet_harness.start_profilers({"w0": 101}, 30.0) == []


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_the_reader_takes_a_predictions_stamps_as_decoding_it_would(data: st.DataObject) -> None:
    p = data.draw(records_of(Prediction))
    got = msgspec.json.decode(encode(p), type=fleet_harness.Stamps)
    assert (got.ts, got.window_end, got.occupancy) == (p.ts, p.window_end, p.occupancy)

"""`aip experiment` from the command line: rebuilding the CSV and table from recordings; one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_experiment_dataset import T0, run, write_recordings  # type: ignore[import-not-found]

from aip.cli import main


def test_convert_only_rebuilds_csv_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = tmp_path / "recordings"
    rec.mkdir()
    write_recordings(
        rec,
        [
            *run({"a": ("cnn-bs8", 0.1)}, T0, T0 + 20, power_w=100.0, sm=40.0),
            *run({"b": ("lstm-bs4", 0.2)}, T0 + 30, T0 + 50, power_w=200.0, sm=50.0),
            *run({"a2": ("cnn-bs8", 0.2), "b2": ("lstm-bs4", 0.4)}, T0 + 60, T0 + 80, power_w=300.0, sm=90.0),
        ],
    )
    assert main(["experiment", "--out", str(tmp_path), "--convert-only", "--window", "5"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == 8 and summary["groups"] == ["cnn-bs8 + lstm-bs4"]
    assert "| cnn-bs8 + lstm-bs4 | lstm-bs4 | 4 | 50.0 |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "table.csv").read_text().startswith("combination,job_type,windows,E_pct")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--jobs", "resnet51:32"], "unknown model 'resnet51'"),
        (["--interval", "2"], "1 Hz or faster"),
        (["--convert-only"], "no recordings"),
    ],
)
def test_errors_are_one_line(argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "--out", str(tmp_path / "x"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err

"""The project stands on its own: what it uses ships in it, and nothing points outside the repository."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from aip.cli import main
from models.datasets import BUILTIN

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = "../" + "shared"  # spelled in two parts so that this file does not match itself


def test_no_tracked_file_points_outside_the_repository() -> None:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in files:
        path = ROOT / name
        if path.suffix in {".json", ".csv", ".png"} or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if OUTSIDE in text or "shared" + "/data" in text:
            offenders.append(name)
    assert offenders == []


def test_shipped_datasets_have_their_licence_or_source_beside_them() -> None:
    for path in BUILTIN.values():
        assert path.is_file()
        assert (path.parent / "LICENSE").is_file() or (path.parent / "README.md").is_file()
    assert (BUILTIN["gavel"].parent / "LICENSE").read_text().startswith("MIT License")


def test_evaluate_takes_a_shipped_dataset_by_name(capsys) -> None:  # type: ignore[no-untyped-def]
    rc = main(["evaluate", "paper", "--gpu", "TeslaP40", "--models", "LinearRegression", "--folds", "2", "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == 4
    assert main(["evaluate", "no-such-dataset"]) == 2
    err = capsys.readouterr().err
    assert "shipped datasets by name: gavel, paper" in err and "Traceback" not in err

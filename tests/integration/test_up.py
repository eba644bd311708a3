"""``aip up`` end to end: broker given, simulated fleet, worker, summary as the last line."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def test_up_prints_a_summary_with_observations_predictions_and_leaderboard(broker: Any) -> None:
    prefix = f"up{uuid.uuid4().hex[:10]}."
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aip.cli",
            "up",
            "--duration",
            "35",
            "--gpus",
            "4",
            "--speedup",
            "30",
            "--broker",
            broker.address,
            "--topic-prefix",
            prefix,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-2000:]
    summary = json.loads(lines[-1])
    assert summary["errors"] == [], summary
    assert proc.returncode == 0
    assert summary["observations"] > 0 and summary["predictions"] > 0 and summary["leaderboard"] > 0, summary
    assert summary["deadletters"] == 0
    assert summary["selected"]["v100"]
    assert {"alerts", "deadletters"} <= summary.keys()

"""Short versions of the fault tests on the real broker and real ``aip worker`` processes.

``aip bench faults`` runs the long versions (10,000 fuzzed records per topic, three SIGKILLs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aip.faults import scenarios

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_bad_input_is_dead_lettered_exactly_and_valid_records_are_all_processed(settings: Any, tmp_path: Path) -> None:
    result = scenarios.bad_input(settings, tmp_path, per_topic=1000, seed=1, rate_per_s=1000)
    assert result["worker_alive"]
    assert result["lost"] == 0
    assert result["dead_letters"] == result["rejected_expected"] > 1500
    assert result["dead_letters_unexpected"] == 0
    assert result["observations_missing"] == 0 and result["observations_expected"] > 0
    assert result["observations_differing"] == 0
    assert result["duplicates_detected"] == result["duplicates_sent"] > 0


@pytest.mark.xfail(
    strict=True,
    raises=TimeoutError,
    reason="known defect (issue 7 report): after SIGKILL the restarted worker's faust table recovery of "
    "stage1-state-changelog stalls on Tansu ('No event received for active tp ... since recovery start'), so it never "
    "resumes; the test passes once recovery works",
)
def test_worker_sigkill_loses_no_window_and_learns_nothing_twice(settings: Any, tmp_path: Path) -> None:
    result = scenarios.worker_crash(settings, tmp_path, kills=1, gpus=4, sim_s=600, run_s=25, seed=3, resume_timeout_s=40)
    assert result["lost"] == 0
    assert result["learned_final"] <= result["unique_observations"]
    assert result["recovery_s"] is not None

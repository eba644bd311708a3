"""``aip report`` offline, from an ``aip tail --json`` file."""

from __future__ import annotations

import json
import random
from pathlib import Path

from aip.cli import main
from events import Leaderboard, LeaderboardEntry, Observation, Prediction, to_dict
from models.reports import pair_rates

T0 = 1_700_000_000.0
PNGS = ["interference_by_pair.png", "pct_changes.png", "leaderboard_errors.png", "predicted_vs_measured.png"]


def write_run(path: Path, n: int = 60) -> None:
    rng = random.Random(1)
    lines = []
    for i in range(n):
        y = rng.uniform(0, 150)
        obs = Observation(window_start=T0 + 10 * i, window_end=T0 + 10 * i + 10, gpu_uuid="GPU-a", environment="v100",
                          job_id=f"j{i % 3}", job_type=["A3C", "LM (batch size 20)"][i % 2], co_job_types=["ResNet-50 (batch size 64)"],
                          E_pct=y / 3, T_pct=y / 10, S_pct=-y / 4, V_pct=y * 20, R_pct=y, W_pct=None, interference_pct=y)  # fmt: skip
        pred = Prediction(ts=T0 + 10 * i, gpu_uuid="GPU-a", environment="v100", job_id=obs.job_id, job_type=obs.job_type,
                          job_set=["A3C"], mode=["observed", "placement"][i % 2], interference_pct=y + rng.gauss(0, 10),
                          model="knn", category="all", measured_pct=y)  # fmt: skip
        board = Leaderboard(ts=T0 + 10 * i, environment="v100", entries=[
            LeaderboardEntry(model="knn", category=c, mode="observed", kind="online", samples=10 + i, mae=30.0 / (1 + i / 10))
            for c in ("1", "2", "3", "all")])  # fmt: skip
        lines += [{"_topic": "interference.observations", **to_dict(obs)}, {"_topic": "interference.predictions", **to_dict(pred)},
                  {"_topic": "models.leaderboard", **to_dict(board)}]  # fmt: skip
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")


def test_report_from_a_tail_file_writes_every_plot(tmp_path: Path, capsys) -> None:
    src = tmp_path / "run.jsonl"
    write_run(src)
    assert main(["report", "--from-file", str(src), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    for name in PNGS:
        png = tmp_path / "out" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert f"]({name})" in md
    assert "60 observations" in capsys.readouterr().out and "1 lines skipped" in md


def test_report_without_predictions_leaves_their_plots_out(tmp_path: Path) -> None:
    src = tmp_path / "obs.jsonl"
    write_run(src, n=8)
    src.write_text("\n".join(line for line in src.read_text().splitlines() if "interference.observations" in line))
    assert main(["report", "--from-file", str(src), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "No predictions with a measured rate" in md and not (tmp_path / "out" / "predicted_vs_measured.png").exists()


def test_report_errors_are_one_line(tmp_path: Path, capsys) -> None:
    assert main(["report", "--from-file", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path)]) == 2
    (tmp_path / "empty.jsonl").write_text("{}\n")
    assert main(["report", "--from-file", str(tmp_path / "empty.jsonl"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("aip report: error:") for line in err)


def test_pair_rates_group_by_job_set() -> None:
    obs = [Observation(window_start=T0, window_end=T0 + 10, gpu_uuid="g", environment="v100", job_id="j", job_type=t,
                       co_job_types=["B"], interference_pct=y) for t, y in (("A", 10.0), ("A", 20.0), ("C", 5.0), ("C", None))]  # fmt: skip
    assert [(label, mean, n) for label, mean, _, n in pair_rates(obs)] == [("A | B", 15.0, 2), ("C | B", 5.0, 1)]

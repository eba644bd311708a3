"""``aip evaluate`` and models.evaluate: grouped CV, AIP choice, Gavel accuracy, reports, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aip.cli import main
from models.datasets import load, load_gavel
from models.selection import cross_validate, grouped_folds


def test_gavel_features_beat_one_hot_baseline(shared_data) -> None:  # type: ignore[no-untyped-def]
    from models.evaluate import baseline_onehot

    ds = load_gavel(shared_data / "gavel" / "physical_cluster_throughputs.json", "v100")
    assert len(ds.samples) > 500 and len({s.group for s in ds.samples}) > 250
    scores = cross_validate(ds.samples, ["placement"], models=("ExtraTrees",), categories=("all",), k=5)
    base = baseline_onehot(ds.samples, 5)
    assert scores[0].mae <= 4.5
    assert base is not None and scores[0].mae < base


def test_gavel_pairs_stay_in_one_fold(shared_data) -> None:  # type: ignore[no-untyped-def]
    ds = load_gavel(shared_data / "gavel" / "physical_cluster_throughputs.json", "k80")
    groups = [s.group for s in ds.samples]
    for train, test in grouped_folds(groups, 5):
        assert not {groups[i] for i in train} & {groups[i] for i in test}
    # both jobs of a pair share a group; [0, 0] pairs are left out
    assert all(abs(s.target) < 100 for s in ds.samples)


def _csv(path, rows: int = 40) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    lines = ["environment,job_type,co_job_types,interference_pct,E_pct,T_pct,S_pct,V_pct,R_pct,W_pct,group"]
    for i in range(rows):
        y = rng.uniform(0, 100)
        pct = [0.5 * y + rng.normal(0, 2) for _ in range(6)]
        lines.append(
            f"h200,job{i % 5},job{(i + 1) % 5};job{(i + 2) % 5},{y:.2f}," + ",".join(f"{p:.2f}" for p in pct) + f",g{i // 2}"
        )
    path.write_text("\n".join(lines) + "\n")


def test_cli_json_last_line_and_report(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "obs.csv"
    _csv(data)
    rc = main(["evaluate", str(data), "--models", "LinearRegression,DecisionTree", "--json", "--report", str(tmp_path / "r")])
    assert rc == 0
    out = capsys.readouterr()
    last = json.loads(out.out.strip().splitlines()[-1])
    assert {"selected", "mae", "relative_error", "seconds", "rows"} <= set(last)
    assert last["rows"] == 40 and last["selected"] in {"LinearRegression", "DecisionTree"}
    assert last["mae"] < 20  # the target is linear in the features
    assert "cross-validated" in out.err  # progress on stderr
    for f in ("predicted_vs_actual.png", "error_heatmap.png", "learning_curve.png", "summary.md"):
        assert (tmp_path / "r" / f).stat().st_size > 0


def test_cli_paper_rows_smoke(shared_data, capsys) -> None:  # type: ignore[no-untyped-def]
    rc = main(
        [
            "evaluate",
            str(shared_data / "aip_paper" / "colocation_rows.csv"),
            "--gpu",
            "TeslaP40",
            "--models",
            "LinearRegression,KNN",
            "--folds",
            "2",
            "--json",
        ]
    )
    assert rc == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == 4


@pytest.mark.parametrize(
    ("content", "name", "extra", "needle"),
    [
        (None, "missing.csv", [], "no such file"),
        ("a,b\n1,2\n", "bad.csv", [], "missing column interference_pct"),
        ("{}", "bad.json", [], "no GPU"),
        ("not json", "bad2.json", [], "cannot read Gavel JSON"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, content, name, extra, needle) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    assert main(["evaluate", str(path), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_mode_not_in_dataset(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "obs.csv"
    _csv(data, 10)
    assert main(["evaluate", str(data), "--mode", "placement"]) == 2
    assert "no placement-mode features" in capsys.readouterr().err
    assert load(data).modes == ("observed",)

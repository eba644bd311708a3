"""Recordings -> observations CSV, on small hand-made recordings with known answers."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from events import JobEvent, MetricSample, to_dict
from workloads import dataset, table

T0 = 1_800_000_000.0  # a window boundary for 10 s windows
GPU = "GPU-test"
ENV = "NVIDIA H200"


def sample(ts: float, power_w: float, sm: float) -> MetricSample:
    return MetricSample(
        ts=ts, host="h", gpu_uuid=GPU, gpu_index=0, gpu_model=ENV, seq=int(ts - T0), power_w=power_w, temp_c=50.0,
        sm_util_pct=sm, mem_util_pct=20.0, mem_used_mb=1000.0, mem_total_mb=80000.0, pcie_rx_kbps=100.0, pcie_tx_kbps=None,
    )  # fmt: skip


def job(ts: float, kind: str, job_id: str, job_type: str, steps: int | None = None, step_time_s: float | None = None) -> JobEvent:
    return JobEvent(
        ts=ts, kind=kind, job_id=job_id, job_type=job_type, gpu_uuid=GPU, host="h", steps=steps, step_time_s=step_time_s
    )


def run(jobs: dict[str, tuple[str, float]], start: float, end: float, power_w: float, sm: float) -> list[tuple[str, object]]:
    """Jobs {job_id: (job_type, step_time_s)} running from start to end; one sample and one progress report per second."""
    out: list[tuple[str, object]] = []
    for job_id, (jt, _) in jobs.items():
        out.append(("jobs.lifecycle", job(start, "started", job_id, jt)))
    for i in range(int(end - start)):
        t = start + i + 0.5
        out.append(("gpu.metrics", sample(t, power_w, sm)))
        for job_id, (jt, step_time) in jobs.items():
            out.append(
                ("jobs.lifecycle", job(t, "progress", job_id, jt, steps=round((i + 1) / step_time), step_time_s=step_time))
            )
    for job_id, (jt, _) in jobs.items():
        out.append(("jobs.lifecycle", job(end, "finished", job_id, jt)))
    return out


def write_recordings(tmp_path: Path, records: list[tuple[str, object]]) -> list[Path]:
    """Two files in `aip tail --json` format, deliberately not in time order across files."""
    paths = {t: tmp_path / f"{t}.jsonl" for t in ("gpu.metrics", "jobs.lifecycle")}
    for topic, path in paths.items():
        lines = [json.dumps({"_topic": t, **to_dict(r)}) for t, r in records if t == topic]
        path.write_text("\n".join(lines) + '\n{"_topic": "gpu.metrics", "_error": "undecodable"}\n')
    return list(paths.values())


@pytest.fixture
def recordings(tmp_path: Path) -> list[Path]:
    records = [
        *run({"a1": ("cnn-bs8", 0.1)}, T0, T0 + 30, power_w=100.0, sm=40.0),  # solo a: 10 steps/s
        *run({"b1": ("lstm-bs4", 0.2)}, T0 + 40, T0 + 70, power_w=200.0, sm=50.0),  # solo b: 5 steps/s
        *run({"a2": ("cnn-bs8", 0.2), "b2": ("lstm-bs4", 0.25)}, T0 + 80, T0 + 110, power_w=300.0, sm=80.0),  # together
    ]
    return write_recordings(tmp_path, records)


def test_convert_computes_percent_changes_solo_profiles_and_interference(recordings: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "observations.csv"
    summary = dataset.convert(recordings, out, window_s=10.0)
    rows = list(csv.DictReader(out.open()))
    assert summary["skipped_lines"] == 2
    assert summary["groups"] == ["cnn-bs8 + lstm-bs4"]
    assert summary["stage1"]["windows_solo"] == 6
    assert set(dataset.COLUMNS) == set(rows[0])
    # Three co-located windows, two jobs each; the first window's rate has no earlier report
    # of the same job set, but the later reports of the window still give it.
    assert len(rows) == 6
    a = [r for r in rows if r["job_type"] == "cnn-bs8"]
    b = [r for r in rows if r["job_type"] == "lstm-bs4"]
    assert len(a) == len(b) == 3
    for r in a:
        assert float(r["E_pct"]) == pytest.approx(200.0)  # (300 - 100) / 100
        assert float(r["S_pct"]) == pytest.approx(100.0)  # (80 - 40) / 40
        assert float(r["T_pct"]) == pytest.approx(0.0)
        assert r["W_pct"] == ""  # never measured: empty, not 0
        assert float(r["interference_pct"]) == pytest.approx(100.0)  # 10 steps/s solo, 5 together
        assert float(r["solo_E"]) == pytest.approx(100.0)
        assert float(r["solo_throughput"]) == pytest.approx(10.0)
        assert float(r["other_solo_E"]) == pytest.approx(200.0)
        assert float(r["other_solo_throughput"]) == pytest.approx(5.0)
        assert r["co_job_types"] == "lstm-bs4"
        assert r["group"] == "cnn-bs8 + lstm-bs4"
    for r in b:
        assert float(r["E_pct"]) == pytest.approx(50.0)
        assert float(r["interference_pct"]) == pytest.approx(25.0)  # 5 steps/s solo, 4 together


def test_csv_loads_in_both_modes_of_aip_evaluate(recordings: list[Path], tmp_path: Path) -> None:
    from models.datasets import load_csv

    out = tmp_path / "observations.csv"
    dataset.convert(recordings, out, window_s=10.0)
    ds = load_csv(out)
    assert set(ds.modes) == {"observed", "placement"}
    assert len(set(ds.groups)) == 1 and len(ds.samples) == 6
    assert ds.samples[0].features("placement")["other_solo_E"] == pytest.approx(200.0)


def test_same_records_in_any_file_order_give_the_same_csv(recordings: list[Path], tmp_path: Path) -> None:
    first, second = tmp_path / "1.csv", tmp_path / "2.csv"
    dataset.convert(recordings, first, window_s=10.0)
    dataset.convert(list(reversed(recordings)), second, window_s=10.0)
    assert first.read_text() == second.read_text()


def test_pair_without_solo_runs_gives_no_rows(tmp_path: Path) -> None:
    records = run({"a": ("cnn-bs8", 0.1), "b": ("lstm-bs4", 0.2)}, T0, T0 + 30, power_w=300.0, sm=80.0)
    out = tmp_path / "o.csv"
    summary = dataset.convert(write_recordings(tmp_path, records), out, window_s=10.0)
    assert summary["rows"] == 0 and summary["stage1"]["no_solo_profile"] == 6


def test_paper_table_averages_each_job_of_each_combination(recordings: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "observations.csv"
    dataset.convert(recordings, out, window_s=10.0)
    t = table.paper_table(table.read_rows(out))
    assert [(x["combination"], x["job_type"], x["windows"]) for x in t] == [
        ("cnn-bs8 + lstm-bs4", "cnn-bs8", 3),
        ("cnn-bs8 + lstm-bs4", "lstm-bs4", 3),
    ]
    assert t[0]["E_pct"] == pytest.approx(200.0) and t[1]["interference_pct"] == pytest.approx(25.0)
    md = table.to_markdown(t)
    assert md.count("\n") == 4 and "| cnn-bs8 + lstm-bs4 | cnn-bs8 | 3 | 200.0 |" in md


def test_the_shipped_h200_measurement_loads_by_name_from_its_gzip_csv() -> None:
    """`aip evaluate h200` reads data/h200/observations.csv.gz: all ten pairs of the five jobs, both jobs of each."""
    from models.datasets import load

    ds = load("h200")
    jobs = ("alexnet-bs128", "cnn-bs256", "lstm-bs40", "resnet50-bs32", "vgg16-bs32")
    assert len(ds.samples) == 40
    assert {frozenset((s.job_type, *s.co_job_types)) for s in ds.samples} == {
        frozenset((a, b)) for i, a in enumerate(jobs) for b in jobs[i + 1 :]
    }
    assert {s.environment for s in ds.samples} == {"NVIDIA H200"}
    assert {s.job_type for s in ds.samples} == set(jobs)
    assert all(0 < s.target < 200 for s in ds.samples)  # measured interference rates, 20.8-120.8 % per job


def test_the_shipped_h200_triples_run_loads_by_name_with_its_pairs_and_triples() -> None:
    """`aip evaluate h200-triples` reads data/h200/run2/observations.csv.gz: 6 pairs and 3 triples of 4 jobs."""
    from models.datasets import load

    ds = load("h200-triples")
    jobs = ("cnn-bs256", "lstm-bs40", "resnet50-bs32", "vgg16-bs32")
    sets = {frozenset((s.job_type, *s.co_job_types)) for s in ds.samples}
    assert len(ds.samples) == 42 and len(set(ds.groups)) == 9
    assert {x for x in sets if len(x) == 2} == {frozenset((a, b)) for i, a in enumerate(jobs) for b in jobs[i + 1 :]}
    triples = {x for x in sets if len(x) == 3}
    assert len(triples) == 3 and frozenset(("vgg16-bs32", "lstm-bs40", "cnn-bs256")) not in triples  # skipped
    assert sum(len(s.co_job_types) == 2 for s in ds.samples) == 18  # 3 jobs x 2 windows x 3 triples
    assert {s.environment for s in ds.samples} == {"NVIDIA H200"} and {s.job_type for s in ds.samples} == set(jobs)
    assert all(0 < s.target < 250 for s in ds.samples)  # measured interference rates per window, 7.5-208.9 %

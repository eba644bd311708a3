"""Planning the experiment: job specs, runs, start and end instants, configuration checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from workloads.experiment import ExperimentConfig, ExperimentError, go_instants, parse_job, plan_runs


def test_five_jobs_give_five_solos_and_ten_pairs() -> None:
    from aip.commands.experiment import DEFAULT_JOBS

    jobs = [parse_job(j) for j in DEFAULT_JOBS.split(",")]
    runs = plan_runs(jobs, triples=2)
    assert [len(r) for r in runs] == [1] * 5 + [2] * 10 + [3] * 2
    assert len({frozenset(r) for r in runs}) == len(runs)


@pytest.mark.parametrize("text", ["nope:3", "cnn:x", "cnn:0", "lstm-bs"])
def test_bad_job_specs_are_one_line_errors(text: str) -> None:
    with pytest.raises(ExperimentError):
        parse_job(text)


def test_a_job_listed_twice_is_refused() -> None:
    with pytest.raises(ExperimentError, match="once"):
        plan_runs([parse_job("cnn:8"), parse_job("cnn-bs8")])


@pytest.mark.parametrize("now", [100.0, 100.69, 100.7, 104.99])
def test_runs_start_just_before_a_boundary_and_last_whole_windows(now: float) -> None:
    go, end = go_instants(now, window_s=5.0, duration_s=23.0, lead_in_s=0.3, early_s=0.05)
    boundary = go + 0.05
    assert go >= now + 0.3 and boundary % 5.0 == pytest.approx(0.0, abs=1e-6)
    assert end - boundary == pytest.approx(25.0)  # 23 s rounds to five 5 s windows


def test_config_refuses_slow_sampling_and_windows_without_two_samples(tmp_path: Path) -> None:
    base = {"jobs": [parse_job("cnn")], "out_dir": tmp_path}
    with pytest.raises(ExperimentError, match="1 Hz"):
        ExperimentConfig(**base, sample_interval_s=2.0).check()
    with pytest.raises(ExperimentError, match="two samples"):
        ExperimentConfig(**base, window_s=1.0, sample_interval_s=0.75).check()
    ExperimentConfig(**base).check()


def test_command_sampler_stops_its_producer_and_keeps_its_summary(tmp_path: Path) -> None:
    import sys

    from config import Settings
    from workloads.experiment import CommandSampler

    # Stands in for `aip produce nvml`: says it is up, then prints its JSON summary on SIGTERM, as the command does.
    script = (
        "import json, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print(json.dumps({'source': 'nvml', 'rounds': 3})), sys.exit(0)))\n"
        "print('up', file=sys.stderr, flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "producer.log"
    sampler = CommandSampler(Settings(), 0.5, log, argv=[sys.executable, "-c", script])
    from conftest import wait_for  # type: ignore[import-not-found]

    wait_for(lambda: log.exists() and "up" in log.read_text(), timeout_s=20, what="the stand-in producer to start")
    sampler.check()
    assert sampler.close() == {"sampler": "aip produce nvml", "exit_code": 0, "source": "nvml", "rounds": 3}
    with pytest.raises(ExperimentError, match="exited with code 0"):
        sampler.check()

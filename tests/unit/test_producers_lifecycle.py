"""The job reporter library."""

from __future__ import annotations

import pytest

from producers.lifecycle import JobReporter, track_optimizer


def reporter(events: list, now: list, **kw) -> JobReporter:
    return JobReporter("t", gpu_uuid="GPU-1", publish=lambda t, r: events.append((t, r)), clock=lambda: now[0], host="h", **kw)


def test_exception_inside_the_job_reports_exit_code_1() -> None:
    events: list = []
    now = [1_700_000_000.0]
    with pytest.raises(RuntimeError), reporter(events, now):
        raise RuntimeError("boom")
    assert [(r.kind, r.exit_code) for _, r in events] == [("started", None), ("finished", 1)]
    assert {t for t, _ in events} == {"jobs.lifecycle"}
    assert [r.seq for _, r in events] == [0, 1]


def test_progress_rate_is_bounded_and_wrapped_jobs_only_report_progress() -> None:
    events: list = []
    now = [1_700_000_000.0]
    with reporter(events, now, wrapped=True, min_interval_s=2.0) as job:
        for _ in range(1000):
            now[0] += 0.01
            job.step()
    kinds = [r.kind for _, r in events]
    assert set(kinds) == {"progress"} and 4 <= len(kinds) <= 5  # 10 s of steps, one report per 2 s
    assert all(r.step_time_s == pytest.approx(0.01) for _, r in events)


def test_missing_gpu_is_a_clear_error() -> None:
    from config import Settings

    with pytest.raises(ValueError, match="GPU UUID"):
        JobReporter("t", settings=Settings(), publish=lambda t, r: None)


def test_torch_helper_counts_optimizer_steps() -> None:
    import torch

    events: list = []
    now = [1_700_000_000.0]
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with reporter(events, now) as job:
        track_optimizer(job, opt)
        for _ in range(3):
            opt.step()
        assert job.steps == 3

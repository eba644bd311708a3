"""The workloads: published architectures at full size, every one trains tiny on the CPU, the job entry point."""

from __future__ import annotations

import io
import json

import pytest
import torch

from workloads import catalog, run
from workloads.train import Trainer

# Parameter counts of the published networks (torchvision's figures for the same layers).
PUBLISHED_PARAMS_M = {"resnet50": 25.557, "vgg16": 138.358, "alexnet": 61.101}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS_M))
def test_full_networks_have_the_published_size(name: str) -> None:
    with torch.device("meta"):  # no memory, no time
        model = catalog.WORKLOADS[name].shapes["full"].build()
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(PUBLISHED_PARAMS_M[name], abs=0.01)


@pytest.mark.parametrize("name", sorted(catalog.WORKLOADS))
def test_every_workload_trains_tiny_on_the_cpu_and_reports_each_step(name: str) -> None:
    torch.set_num_threads(1)
    seen: list[float] = []
    trainer = Trainer(catalog.WORKLOADS[name], 4, size="tiny", device=torch.device("cpu"))
    first = trainer.run(max_steps=1).final_loss
    result = trainer.run(max_steps=8, on_step=seen.append)
    assert result.steps == 8 and len(seen) == 8 and all(t > 0 for t in seen)
    assert result.final_loss < first  # it learns the fixed batch


def test_job_types_name_model_and_batch() -> None:
    from models.features import parse_job_type  # the evaluator reads family and batch size back

    assert parse_job_type(catalog.WORKLOADS["alexnet"].job_type(128)) == ("alexnet", 128)


def test_run_trains_for_the_duration_and_prints_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code = run.main(
        ["--model", "cnn", "--batch-size", "4", "--tiny", "--device", "cpu", "--duration", "0.3", "--no-report", "--threads", "1"]
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and summary["job_type"] == "cnn-bs4" and summary["steps"] > 1 and summary["seconds"] >= 0.3


def test_wait_go_handshake() -> None:
    out = io.StringIO()
    assert run.wait_go(io.StringIO("go 10.5 20.25\n"), out) == (10.5, 20.25)
    assert out.getvalue() == "ready\n"
    with pytest.raises(SystemExit, match="expected 'go GO_AT END_AT'"):
        run.wait_go(io.StringIO(""), io.StringIO())

"""A GPU at capacity (``max_jobs_per_gpu``) publishes no what-if entries and says it is full; the scheduler client
never picks it and the extender's /filter drops a node whose every GPU is full.  No what-if value is published past
``[-100, prediction_max_pct]``: what a composition says beyond it is counted (``what_if_clipped``)."""

from __future__ import annotations

import pytest
from stub_models import LinearModels
from test_serving_what_if import GAN, KNOWN, LM, RESNET, _window

from clients.extender import Scorer
from clients.scheduler import SchedulerClient
from events import JobEvent, Prediction, WhatIf
from streams.serving import Serving
from streams.whatif import what_if_entries

T0 = 1_700_000_000.0


def _serving(max_jobs_per_gpu: int) -> Serving:
    serving = Serving(clock=lambda: 0.0, max_jobs_per_gpu=max_jobs_per_gpu)
    assert serving.install("v100", 1, LinearModels(), KNOWN)  # type: ignore[arg-type]
    return serving


def _placement(serving: Serving, co: dict[str, dict]) -> Prediction:
    out = serving.serve(_window("resnet", RESNET, co, gpu="GPU-A", job_id="j1", end_s=100.0), [])
    [placement] = [p for p in out.predictions if p.mode == "placement"]
    return placement


def test_a_gpu_running_as_many_jobs_as_it_may_publishes_no_what_if_and_says_it_is_full() -> None:
    serving = _serving(3)
    full = _placement(serving, {"lm": LM, "gan": GAN})
    assert full.full is True and full.what_if == []
    assert all(
        p.full for p in serving.serve(_window("resnet", RESNET, {"lm": LM, "gan": GAN}, gpu="GPU-A", job_id="j1"), []).predictions
    )
    room = _placement(serving, {"lm": LM})
    assert room.full is False and [w.job_type for w in room.what_if] == ["gan", "lm", "resnet"]
    assert serving.counters["windows_full"] == 2


@pytest.mark.parametrize("limit, co, full", [(0, {"lm": LM, "gan": GAN}, False), (2, {"lm": LM}, True), (1, {}, True)])
def test_the_limit_is_a_setting_and_0_sets_none(limit: int, co: dict[str, dict], full: bool) -> None:
    p = _placement(_serving(limit), co)
    assert p.full is full and bool(p.what_if) is not full


def _prediction(gpu: str, job_set: list[str], what_if: list[WhatIf], *, full: bool = False) -> Prediction:
    return Prediction(
        ts=T0, gpu_uuid=gpu, environment="v100", job_id=f"{gpu}-0", job_type=job_set[0], job_set=job_set,
        mode="placement", interference_pct=10.0, model="knn", category="all", window_end=T0 - 10, what_if=what_if,
        full=full,
    )  # fmt: skip


def _client_with_a_full_and_a_costly_gpu() -> SchedulerClient:
    client = SchedulerClient(clock=lambda: T0 + 5, history_complete=True)
    for gpu, host, types in (("GPU-full", "node-a", ["A3C", "GAN", "LM"]), ("GPU-free", "node-b", ["GAN"])):
        for i, t in enumerate(types):
            client.on_job_event(JobEvent(ts=T0 - 100, kind="started", job_id=f"{gpu}-{i}", job_type=t, gpu_uuid=gpu, host=host))
    client.update(_prediction("GPU-full", ["A3C", "GAN", "LM"], [], full=True))
    client.update(_prediction("GPU-free", ["GAN"], [WhatIf(job_type="LM", newcomer_pct=400.0, existing_pct=300.0)]))
    return client


def test_the_scheduler_client_never_picks_a_full_gpu() -> None:
    client = _client_with_a_full_and_a_costly_gpu()
    assert client.is_full("GPU-full") and not client.is_full("GPU-free")
    assert client.best_gpu("LM", ["GPU-full", "GPU-free"]) == "GPU-free"  # the costly one: the other takes no job
    assert client.best_gpu("LM", ["GPU-full"]) is None
    # a job leaves: the GPU takes one again (its entries are stale, so it ranks as unknown, by load)
    client.on_job_event(
        JobEvent(ts=T0 + 1, kind="finished", job_id="GPU-full-0", job_type="A3C", gpu_uuid="GPU-full", host="node-a")
    )
    assert not client.is_full("GPU-full") and client.best_gpu("LM", ["GPU-full"]) == "GPU-full"


def test_a_gpu_known_to_run_the_limit_is_full_without_a_prediction_saying_so() -> None:
    client = SchedulerClient(clock=lambda: T0 + 5, history_complete=True, max_jobs_per_gpu=2)
    for i, t in enumerate(["A3C", "GAN"]):
        client.on_job_event(JobEvent(ts=T0, kind="started", job_id=f"j{i}", job_type=t, gpu_uuid="GPU-a", host="n"))
    assert client.is_full("GPU-a") and client.best_gpu("LM", ["GPU-a"]) is None


def test_the_extenders_filter_drops_a_node_whose_every_gpu_is_full() -> None:
    client = _client_with_a_full_and_a_costly_gpu()
    scorer = Scorer(client)
    passed, failed = scorer.filter_nodes({"metadata": {"annotations": {"aip.io/job-type": "LM"}}}, ["node-a", "node-b", "node-c"])
    assert passed == ["node-b", "node-c"] and list(failed) == ["node-a"] and "full" in failed["node-a"]
    assert scorer.metrics.value("aip_extender_nodes_full_total", verb="filter") == 1.0
    # a node with one GPU free passes
    client.on_job_event(JobEvent(ts=T0 - 90, kind="started", job_id="x", job_type="GAN", gpu_uuid="GPU-a2", host="node-a"))
    client.update(_prediction("GPU-a2", ["GAN"], [WhatIf(job_type="LM", newcomer_pct=10.0, existing_pct=5.0)]))
    passed, failed = scorer.filter_nodes({"metadata": {"annotations": {"aip.io/job-type": "LM"}}}, ["node-a"])
    assert passed == ["node-a"] and failed == {}
    [score] = scorer.score_nodes("LM", ["node-a"])
    assert score.gpu == "GPU-a2"


def test_no_what_if_value_is_published_past_the_bound_and_what_was_beyond_is_counted() -> None:
    from collections import Counter

    models = LinearModels()  # bound 300: a newcomer's slowdown is 0.1 x its power + 0.01 x its co-runners'
    huge = {"E": 5000.0}  # 500 % as a newcomer next to anything: past the bound
    counters: Counter[str] = Counter()
    entries = what_if_entries(models, {"big": huge, "lm": LM}, ["resnet", "gan"], [RESNET, GAN], counters)  # type: ignore[arg-type]
    by_type = {w.job_type: w for w in entries}
    assert by_type["big"].newcomer_pct == 300.0
    # resnet next to gan and big: 10 + 54 = 64; gan next to resnet and big: 40 + 51 = 91; summed 155: within
    assert by_type["big"].existing_pct == pytest.approx(155.0)
    assert by_type["lm"].newcomer_pct == pytest.approx(25.0)
    for w in entries:
        values = [w.newcomer_pct, w.existing_pct, *(v for v in (w.interval_pct or []) if v is not None)]
        assert all(-100.0 <= v <= 300.0 for v in values)
    assert counters["what_if_clipped"] == 1

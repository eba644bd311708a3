"""Ranking rules of the scheduler client and the extender: a novel entry by its
interval's upper end unless told otherwise; an exploration bonus within a margin, off by default."""

from __future__ import annotations

import pytest

from clients.extender import Scorer
from clients.scheduler import SchedulerClient
from config import Settings
from events import JobEvent, Prediction, WhatIf

NOW = 1e9


def _predict(client: SchedulerClient, gpu: str, entry: WhatIf, host: str = "node") -> None:
    client.on_job_event(JobEvent(ts=NOW - 10, kind="started", job_id=f"j-{gpu}", job_type="A3C", gpu_uuid=gpu, host=host))
    client.update(
        Prediction(
            ts=NOW, gpu_uuid=gpu, environment="v100", job_id=f"j-{gpu}", job_type="A3C", job_set=["A3C"], mode="placement",
            interference_pct=0.0, model="m", category="all", what_if=[entry],
        )
    )  # fmt: skip


# (newcomer %, interval %, regime) of a newcomer of type X on GPU-a (node n1), then on GPU-b (node n2)
Entries = tuple[tuple[float, list[float], str], tuple[float, list[float], str]]
# GPU-a: a job set measured before, 40 % for sure; GPU-b: the newcomer's type never measured, 30 % expected but up to 90 %
FLEET: Entries = ((40.0, [35.0, 45.0], "seen"), (30.0, [5.0, 90.0], "novel"))
# GPU-a measured at 50 %; GPU-b a job set never measured at 52 % (within a 5-point margin), interval 60 wide
NEAR_TIE: Entries = ((50.0, [45.0, 55.0], "seen"), (52.0, [22.0, 82.0], "new"))


def _two_gpus(client: SchedulerClient, entries: Entries) -> None:
    for (gpu, host), (pct, interval, regime) in zip((("GPU-a", "n1"), ("GPU-b", "n2")), entries, strict=True):
        _predict(
            client, gpu, WhatIf(job_type="X", newcomer_pct=pct, existing_pct=0.0, interval_pct=interval, regime=regime), host
        )


def test_novel_entry_is_ranked_by_its_upper_end_unless_told_otherwise() -> None:
    client = SchedulerClient(history_complete=True, clock=lambda: NOW)
    _two_gpus(client, FLEET)
    # the newcomer at 90, and the job already there at the same 60-point margin above its expected 0
    assert client.cost_pct("GPU-b", "X") == 150.0 and client.cost_pct("GPU-a", "X") == 40.0
    assert client.best_gpu("X", ["GPU-b", "GPU-a"]) == "GPU-a"
    told = SchedulerClient(Settings.from_env({"AIP_NOVEL_RISK": "expected"}), history_complete=True, clock=lambda: NOW)
    _two_gpus(told, FLEET)
    assert told.cost_pct("GPU-b", "X") == 30.0 and told.best_gpu("X", ["GPU-a", "GPU-b"]) == "GPU-b"
    # the extender ranks nodes by the same rule
    scores = {s.node: s for s in Scorer(client).score_nodes("X", ["n1", "n2"])}
    assert scores["n1"].score > scores["n2"].score and (scores["n2"].newcomer_pct, scores["n2"].existing_pct) == (90.0, 60.0)
    withheld = SchedulerClient(history_complete=True, clock=lambda: NOW, novel_risk="withhold")
    _two_gpus(withheld, FLEET)
    assert withheld.cost_pct("GPU-b", "X") is None and withheld.cost_pct("GPU-a", "X") == 40.0
    with pytest.raises(ValueError, match="novel_risk"):
        SchedulerClient(novel_risk="maybe")


def _busy(client: SchedulerClient, gpu: str, running: list[str], entry: WhatIf) -> None:
    for i, job_type in enumerate(running):
        client.on_job_event(JobEvent(ts=NOW - 10, kind="started", job_id=f"{gpu}-{i}", job_type=job_type, gpu_uuid=gpu, host="n"))
    client.update(
        Prediction(
            ts=NOW, gpu_uuid=gpu, environment="v100", job_id=f"{gpu}-0", job_type=running[0], job_set=running,
            mode="placement", interference_pct=0.0, model="m", category="all", what_if=[entry],
        )
    )  # fmt: skip


def test_a_novel_entry_costs_every_job_it_would_slow_at_its_margin() -> None:
    # the accuracy bench's worst question: a novel newcomer predicted at -100 % next to three jobs has the lowest
    # upper end (163 against 256 next to one job), and the newcomer's upper end alone chose it (truly 600,000 %)
    client = SchedulerClient(history_complete=True, clock=lambda: NOW)
    _busy(client, "GPU-3", ["A3C", "LM", "CycleGAN"], WhatIf(job_type="X", newcomer_pct=-100.0, existing_pct=-70.0,
                                                            interval_pct=[-100.0, 163.0], regime="novel"))
    _busy(client, "GPU-1", ["LM"], WhatIf(job_type="X", newcomer_pct=-83.0, existing_pct=-5.0, interval_pct=[-100.0, 256.0],
                                          regime="novel"))  # fmt: skip
    assert client.cost_pct("GPU-3", "X") == 163.0 + (-70.0 + 3 * 263.0) and client.cost_pct("GPU-1", "X") == 256.0 + 334.0
    assert client.best_gpu("X", ["GPU-3", "GPU-1"]) == "GPU-1"
    told = SchedulerClient(history_complete=True, clock=lambda: NOW, novel_risk="expected")  # each at its expected: 0
    _busy(told, "GPU-3", ["A3C", "LM", "CycleGAN"], WhatIf(job_type="X", newcomer_pct=-100.0, existing_pct=-70.0,
                                                          interval_pct=[-100.0, 163.0], regime="novel"))  # fmt: skip
    assert told.cost_pct("GPU-3", "X") == 0.0


def test_exploration_prefers_a_job_set_never_measured_within_the_margin_and_is_off_by_default() -> None:
    off = SchedulerClient(history_complete=True, clock=lambda: NOW)
    _two_gpus(off, NEAR_TIE)
    assert off.best_gpu("X", ["GPU-b", "GPU-a"]) == "GPU-a"  # off: the smaller predicted cost
    on = SchedulerClient(history_complete=True, clock=lambda: NOW, explore_margin_pct=5.0, explore_width_share=0.1)
    _two_gpus(on, NEAR_TIE)
    ranked = on.ranked("X", ["GPU-a", "GPU-b"])
    assert [g for g, _ in ranked] == ["GPU-b", "GPU-a"] and dict(ranked)["GPU-b"] == 52.0  # costs reported unchanged
    scores = {s.node: s for s in Scorer(on).score_nodes("X", ["n1", "n2"])}
    assert scores["n2"].exact > scores["n1"].exact  # the extender explores the same way
    narrow = SchedulerClient(history_complete=True, clock=lambda: NOW, explore_margin_pct=1.0)
    _two_gpus(narrow, NEAR_TIE)
    assert narrow.best_gpu("X", ["GPU-b", "GPU-a"]) == "GPU-a"  # 2 points apart: outside a 1-point margin

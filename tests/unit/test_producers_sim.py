"""The simulated fleet: determinism, ordering, calibration and consistency with stream windows."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict

import pytest

from events import JobEvent, MetricSample, decode, encode
from producers import calibration as cal
from producers.sim import Simulator

T0 = 1_700_000_000.0


def _grouped(events: list, topic: str, field: str) -> dict[str, list]:
    """The records of ``topic`` by their ``field``, in the order they came."""
    out: defaultdict[str, list] = defaultdict(list)
    for t, r in events:
        if t == topic:
            out[getattr(r, field)].append(r)
    return out


@pytest.fixture(scope="module")
def run() -> tuple[Simulator, list]:
    sim = Simulator(gpus=6, seed=3, start_ts=T0, duration_s=900)
    return sim, list(sim.events())


def test_deterministic_for_a_seed_and_different_across_seeds(run) -> None:
    _, events = run
    again = list(Simulator(gpus=6, seed=3, start_ts=T0, duration_s=900).events())
    assert again == events
    other = list(Simulator(gpus=6, seed=4, start_ts=T0, duration_s=900).events())
    assert other != events


def test_events_are_time_ordered_valid_records_on_the_right_topics(run) -> None:
    _, events = run
    ts = [r.ts for _, r in events]
    assert ts == sorted(ts)
    assert ts[0] >= T0 and ts[-1] < T0 + 900
    for topic, record in events:
        cls = {"gpu.metrics": MetricSample, "jobs.lifecycle": JobEvent}[topic]
        assert isinstance(record, cls)
        assert decode(cls, encode(record)) == record


def test_metrics_at_1hz_per_gpu_with_gapless_seq(run) -> None:
    sim, events = run
    by_gpu = _grouped(events, "gpu.metrics", "gpu_uuid")
    assert set(by_gpu) == {g.uuid for g in sim.gpus}
    for samples in by_gpu.values():
        assert [s.seq for s in samples] == list(range(len(samples)))
        gaps = {round(b.ts - a.ts, 6) for a, b in itertools.pairwise(samples)}
        assert gaps == {1.0}
        assert all(s.dram_bw_util_pct is None and "dram_bw_util_pct" in s.unavailable for s in samples)


def test_lifecycle_started_progress_finished_and_bounded_progress_rate(run) -> None:
    _, events = run
    jobs = _grouped(events, "jobs.lifecycle", "job_id")
    finished = [evs for evs in jobs.values() if evs[-1].kind == "finished"]
    assert len(finished) >= 6
    for evs in jobs.values():
        assert evs[0].kind == "started"
        assert evs[0].batch_size == cal.batch_size(evs[0].job_type)
        progress = [e for e in evs if e.kind == "progress"]
        gaps = {round(b.ts - a.ts, 6) for a, b in itertools.pairwise(progress)}
        assert gaps <= {2.0}
        steps = [e.steps for e in progress]
        assert steps == sorted(steps)


def test_ten_second_window_rate_matches_ground_truth_within_two_points(run) -> None:
    sim, events = run
    progress = defaultdict(list)
    for topic, r in events:
        if topic == "jobs.lifecycle" and r.kind == "progress":
            progress[r.job_id].append(r)
    truth = sim.ground_truth
    long_ones = [t for t in truth if t["end_ts"] - t["start_ts"] >= 30]
    assert len(long_ones) >= 5
    checked = 0
    for t in long_ones:
        lo = t["start_ts"] + 5
        hi = lo + 10
        in_window = [e for e in progress[t["job_id"]] if lo < e.ts <= hi]
        if not in_window:
            continue
        rate = sum(1.0 / e.step_time_s for e in in_window) / len(in_window)
        measured = (t["solo_throughput"] / rate - 1) * 100
        # step-time noise is at most 0.5 %: within 2 points up to 300 % slowdown
        assert abs(measured - t["interference_pct"]) <= max(2.0, 0.005 * (100 + t["interference_pct"])), t
        checked += 1
    assert checked >= 5


def test_ground_truth_comes_from_gavel_pairs(run) -> None:
    sim, _ = run
    table = cal.gavel_table("v100")
    pairs = [t for t in sim.ground_truth if len(t["co_job_types"]) == 1]
    assert pairs
    for t in pairs:
        this, _other = table[t["job_type"]]["pairs"][t["co_job_types"][0]]
        expected = (table[t["job_type"]]["solo"] / this - 1) * 100
        assert t["interference_pct"] == pytest.approx(expected, abs=1e-4)
        assert {"gpu_uuid", "job_id", "job_type", "co_job_types", "start_ts", "end_ts"} <= set(t)


def test_jobs_often_start_solo_and_co_locations_last_several_windows(run) -> None:
    sim, _ = run
    solo_first = 0
    for gpu in sim.gpus:
        for job in gpu.jobs:
            others = [o for o in gpu.jobs if o is not job and o.start_k <= job.start_k < o.end_k]
            solo_first += not others
    assert solo_first >= len(sim.gpus) * 2
    durations = [t["end_ts"] - t["start_ts"] for t in sim.ground_truth]
    assert sorted(durations)[len(durations) // 2] >= 30


def test_write_ground_truth_as_json_lines(run, tmp_path) -> None:
    sim, _ = run
    path = tmp_path / "truth.jsonl"
    n = sim.write_ground_truth(path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert n == len(rows) == len(sim.ground_truth) > 0


@pytest.mark.parametrize("model", ["p100", "k80"])
def test_other_gpu_models(model: str) -> None:
    sim = Simulator(gpus=2, gpu_model=model, seed=0, start_ts=T0, duration_s=200)
    samples = [r for t, r in sim.events() if t == "gpu.metrics"]
    assert {s.gpu_model for s in samples} == {model}
    assert all(s.energy_mj is None and "energy_mj" in s.unavailable for s in samples)
    assert max(s.power_w for s in samples) <= cal.GPUS[model].power_limit_w * 1.05


def test_unknown_model_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown gpu model"):
        Simulator(gpus=1, gpu_model="a100")


def test_shipped_data_carries_its_licences() -> None:
    from importlib import resources

    data = resources.files("producers.data")
    assert "MIT" in data.joinpath("LICENSE.gavel").read_text()
    assert "MIT" in data.joinpath("LICENSE.miso_a100_solo").read_text()

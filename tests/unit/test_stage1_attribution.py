"""Stage 1 with per-process attribution and GPM DRAM bandwidth: each job's own SM share, and R/W's source."""

from __future__ import annotations

import msgspec
import pytest
from records import job_event, sample

from events import GpuProcess, Observation, decode, encode, to_dict
from models.features import ATTRIBUTION_KEYS, attribution_features, observed_features
from streams.stage1 import Stage1
from streams.windows import GpuState

BASE = 1_700_000_000.0  # a multiple of 10: windows start on it
ENV = "NVIDIA H200"
SOLO_S = 20.0
END_S = 50.0  # a solo until SOLO_S, then a and b together: co-located windows [20,30) [30,40) [40,50)
PIDS = {"a": 7, "b": 8}


def events(
    *,
    gpu: str = "GPU-A",
    env: str = ENV,
    solo_util: dict[int, tuple[float | None, float | None]] | None = None,
    co_util: dict[int, tuple[float | None, float | None]] | None = None,
    dram: tuple[float | None, float | None] = (None, None),
    pids: dict[str, int | None] | None = None,
    unavailable: list[str] | None = None,
) -> list:
    """Job a runs solo, then b joins; samples every 0.5 s carry the processes with ``(SM %, memory %)``
    (solo phase, co-located phase) and GPM DRAM bandwidth ``dram`` (solo, co-located)."""
    pids = PIDS if pids is None else pids
    solo_util = {7: (60.0, 30.0)} if solo_util is None else solo_util
    co_util = {7: (45.0, 20.0), 8: (15.0, 5.0)} if co_util is None else co_util
    evs: list = [
        job_event("started", ts=BASE - 1.0, job_id="a", job_type="resnet", gpu_uuid=gpu, pid=pids["a"]),
        job_event("started", ts=BASE + SOLO_S, job_id="b", job_type="lm", gpu_uuid=gpu, pid=pids["b"]),
    ]
    for i in range(int(END_S * 2)):
        ts = BASE + i * 0.5 + 0.01
        co = ts >= BASE + SOLO_S
        util = co_util if co else solo_util
        evs.append(
            sample(
                ts=ts,
                gpu_uuid=gpu,
                gpu_model=env,
                seq=i,
                power_w=200.0 if co else 100.0,
                dram_bw_util_pct=dram[1] if co else dram[0],
                processes=[GpuProcess(pid=p, sm_util_pct=sm, mem_util_pct=mem) for p, (sm, mem) in util.items()],
                unavailable=unavailable,
            )
        )
    evs.sort(key=lambda e: e.ts)
    return evs


def run(evs: list, stage: Stage1 | None = None, *, flush: bool = True) -> tuple[Stage1, list[Observation]]:
    stage = stage or Stage1(window_s=10.0, lateness_s=0.0)
    stage.profiles.add(ENV, "lm", {"E": 120.0, "throughput": 5.0}, ts=BASE)
    out: list[Observation] = []
    for e in evs:
        out.extend(stage.on_metric(e) if hasattr(e, "power_w") else stage.on_job(e))
    if flush:
        out.extend(stage.flush())
    return stage, out


def by_job(obs: list[Observation]) -> dict[str, list[Observation]]:
    out: dict[str, list[Observation]] = {}
    for o in obs:
        out.setdefault(o.job_id, []).append(o)
    return out


def test_each_job_gets_its_own_sm_utilisation_and_share_by_pid() -> None:
    stage, obs = run(events())
    jobs = by_job(obs)
    assert len(jobs["a"]) == len(jobs["b"]) == 3 and stage.counters["windows_solo"] == 2
    for o in jobs["a"]:
        assert (o.proc_sm_util_pct, o.proc_mem_util_pct, o.sm_share_pct) == (45.0, 20.0, 75.0)
        assert decode(Observation, encode(o)) == o
    for o in jobs["b"]:
        assert (o.proc_sm_util_pct, o.proc_mem_util_pct, o.sm_share_pct) == (15.0, 5.0, 25.0)


def test_unsupported_per_process_utilisation_leaves_the_fields_null() -> None:
    unsupported = {7: (None, None), 8: (None, None)}
    _, obs = run(
        events(solo_util=unsupported, co_util=unsupported, unavailable=["processes.mem_util_pct", "processes.sm_util_pct"])
    )
    assert sorted(o.job_id for o in obs) == ["a"] * 3 + ["b"] * 3
    # the rest of each observation is intact: both jobs ran at 200 W, a at 100 W alone, lm's profile at 120 W
    e_pct = {"a": 100.0, "b": (200.0 / 120.0 - 1.0) * 100.0}
    reference = by_job(run(events())[1])
    for o in obs:
        assert o.proc_sm_util_pct is None and o.proc_mem_util_pct is None and o.sm_share_pct is None
        assert o.E_pct == pytest.approx(e_pct[o.job_id])
        same = next(r for r in reference[o.job_id] if r.window_start == o.window_start)
        assert (o.T_pct, o.interference_pct, o.samples) == (same.T_pct, same.interference_pct, same.samples)


def test_a_share_needs_every_job_measured_and_a_pid_of_its_own() -> None:
    _, obs = run(events(co_util={7: (45.0, 20.0), 8: (None, None)}))
    a = by_job(obs)["a"]
    assert all(o.proc_sm_util_pct == 45.0 and o.sm_share_pct is None for o in a)
    _, obs = run(events(pids={"a": 7, "b": 7}))  # two jobs claim one process: attribute neither
    assert all(o.proc_sm_util_pct is None and o.sm_share_pct is None for o in obs)
    _, obs = run(events(pids={"a": None, "b": 8}))  # a reports no pid: only b is attributed
    jobs = by_job(obs)
    assert all(o.proc_sm_util_pct is None for o in jobs["a"]) and all(o.proc_sm_util_pct == 15.0 for o in jobs["b"])
    assert all(o.sm_share_pct is None for o in obs)


def test_mig_instance_has_gpm_dram_but_no_per_process_attribution() -> None:
    none = {7: (None, None), 8: (None, None)}
    stage = Stage1(window_s=10.0, lateness_s=0.0)
    stage.profiles.add(f"{ENV} MIG", "lm", {"E": 120.0, "R": 10.0, "W": 10.0}, ts=BASE)
    _, obs = run(
        events(gpu="MIG-a", env=f"{ENV} MIG", solo_util=none, co_util=none, dram=(10.0, 15.0),
               unavailable=["processes.mem_util_pct", "processes.sm_util_pct", "power_w"]),
        stage,
    )  # fmt: skip
    a = by_job(obs)["a"]
    assert a and all(o.environment == f"{ENV} MIG" for o in a)
    for o in a:
        assert o.proc_sm_util_pct is None and o.sm_share_pct is None
        assert o.rw_source == "dram_bw_util_pct" and o.R_pct == pytest.approx(50.0) and o.W_pct == pytest.approx(50.0)


def test_dram_bandwidth_is_r_and_w_where_present_and_the_source_is_named() -> None:
    _, obs = run(events(dram=(30.0, 60.0)))
    a = by_job(obs)["a"]
    for o in a:
        assert o.rw_source == "dram_bw_util_pct"
        assert o.window_means["R"] == o.window_means["W"] == pytest.approx(60.0)
        assert o.solo["R"] == pytest.approx(30.0) and o.R_pct == pytest.approx(100.0) and o.W_pct == pytest.approx(100.0)
    _, obs = run(events())  # no GPM: the PCIe counters, and the record says so
    for o in by_job(obs)["a"]:
        assert o.rw_source == "pcie_kbps" and o.window_means["R"] == pytest.approx(1000.0) and o.R_pct == pytest.approx(0.0)


def test_windows_of_the_other_rw_source_get_no_r_or_w() -> None:
    evs = events(dram=(30.0, None))  # GPM reads in the solo phase, then stops
    stage, obs = run(evs)
    assert stage.counters["rw_source_mismatch"] == 3
    for o in by_job(obs)["a"]:
        assert o.rw_source is None and o.R_pct is None and o.W_pct is None and o.window_means["R"] is None
        assert o.E_pct == pytest.approx(100.0)


def test_attribution_survives_a_state_round_trip_mid_window() -> None:
    evs = events(dram=(30.0, 60.0))
    _, whole = run(evs)
    cut = next(i for i, e in enumerate(evs) if e.ts > BASE + 35.0)
    stage, first = run(evs[:cut], flush=False)  # the open window [30,40) travels in the saved state
    saved = {g: msgspec.json.decode(msgspec.json.encode(st), type=GpuState) for g, st in stage.gpus.items()}
    assert saved["GPU-A"].extras and saved["GPU-A"].jobs["a"].pid == 7
    resumed = Stage1(window_s=10.0, lateness_s=0.0, loader=saved.get)
    resumed.profiles = stage.profiles  # shared through interference.profiles, not the GPU's state
    _, rest = run(evs[cut:], resumed)
    key = [(o.job_id, o.window_start, o.proc_sm_util_pct, o.sm_share_pct, o.R_pct) for o in whole]
    assert sorted(key) == sorted((o.job_id, o.window_start, o.proc_sm_util_pct, o.sm_share_pct, o.R_pct) for o in first + rest)


def test_the_share_is_a_feature_candidate_only_where_measured() -> None:
    _, measured = run(events())
    _, unmeasured = run(events(solo_util={7: (None, None)}, co_util={7: (None, None), 8: (None, None)}))
    a = by_job(measured)["a"][0]
    assert attribution_features(to_dict(a)) == {"proc_sm_util_pct": 45.0, "sm_share_pct": 75.0}
    assert all(attribution_features(to_dict(o)) == {} for o in unmeasured)  # absent, never 0
    pcts = {p: a.pct(p) for p in "ETSVRW"}
    assert not set(ATTRIBUTION_KEYS) & set(observed_features(pcts, "all"))  # the categories are unchanged

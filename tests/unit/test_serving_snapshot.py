"""Serving sharded by GPU, without Kafka: a model snapshot serves what the learner's models
serve; its chunks assemble into complete, newer versions only; any worker serves a GPU as any other would; a
GPU's alert state moves with its stage-1 state."""

from __future__ import annotations

import functools
import itertools
import pickle
import secrets

import msgspec
import pytest

from config import Settings, SettingsError
from events import to_dict
from models import persist
from models import snapshot as snapshots
from models.environment import EnvironmentModels
from models.synthetic import gavel_observations
from models.zoo.online import RiverState
from models.zoo.scikit import SklearnState
from models.zoo.torchmlp import MlpState
from streams import snapshots as streamed
from streams.serving import LearnAndServe, Serving
from streams.snapshots import Assembler, Schedule, chunks, next_version
from streams.stage2 import Stage2
from streams.whatif import what_if_entries
from streams.windows import GpuState

KEY = secrets.token_bytes(32)


def _learned(n: int, seed: int = 3, refit: bool = False) -> tuple[EnvironmentModels, dict, list]:
    """Models that learned ``n`` observations (and refitted), the job types' solo profiles, and 60 held-out
    observations: a fresh copy for each test, of one fit per module (a refit is the costly part)."""
    return pickle.loads(_learned_once(n, seed, refit))


@functools.cache
def _learned_once(n: int, seed: int, refit: bool) -> bytes:
    em, known = EnvironmentModels("v100"), {}
    obs = gavel_observations(n + 60, seed=seed)
    for o in obs[:n]:
        em.learn(o)
        known.setdefault(o.job_type, o.solo)
    if refit:
        em.refit_now()
    return pickle.dumps((em, known, obs[n:]))


def _same_answers(a: EnvironmentModels, b: EnvironmentModels, known: dict, held_out: list) -> None:
    for o, mode in itertools.product(held_out, ("observed", "placement")):
        assert a.predict(o, mode) == b.predict(o, mode)
    runs = {tuple(r) for r in itertools.combinations(sorted(known)[:6], 2)}
    runs |= {(o.job_type,) for o in held_out} | {tuple(sorted((o.job_type, *o.co_job_types))) for o in held_out}
    for run in sorted(runs):  # what-ifs of job sets measured (seen) and not
        solos = [known[t] for t in run if t in known]
        if len(solos) == len(run):
            assert what_if_entries(a, known, list(run), solos) == what_if_entries(b, known, list(run), solos)


@pytest.mark.parametrize("refit", [False, True])
def test_a_snapshot_serves_what_the_learner_serves_with_only_the_served_candidates(refit: bool) -> None:
    em, known, held_out = _learned(300, refit=refit)
    snap = snapshots.decode(snapshots.encode(snapshots.snapshot_of(em, known, KEY, version=7)))
    served = snapshots.serving_models(snap, KEY)
    assert snap.version == 7 and snap.known == known and snap.models.history == []
    assert snap.models.serving and snap.models.many_residuals == list(em.many_residuals.values)
    assert len(served.candidates) == len(em.selector.served_keys()) < len(em.candidates)
    assert any(em.predict(o, "placement") is not None for o in held_out)  # the comparison below compares something
    _same_answers(em, served, known, held_out)


def test_a_snapshot_signed_with_another_key_is_refused_before_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    em, known, _ = _learned(300)
    online = next(k for k, c in em.candidates.items() if c.kind == "online")
    served = em.selector.served_keys() | {online}  # a river learner served: a signed pickle in the snapshot
    monkeypatch.setattr(em.selector, "served_keys", lambda: served)
    snap = snapshots.snapshot_of(em, known, KEY)
    assert any(isinstance(c.estimator, RiverState) for c in snap.models.candidates)
    assert snapshots.serving_models(snap, KEY).candidates[online].servable
    with pytest.raises(persist.SignatureError):
        snapshots.serving_models(snap, secrets.token_bytes(32))


def test_batch_dumps_are_reused_until_the_next_refit() -> None:
    em, known, _ = _learned(300, refit=True)
    cache: snapshots.DumpCache = {}
    first = snapshots.snapshot_of(em, known, KEY, cache=cache)
    assert cache and all(k[1] == em.refits for k in cache)
    again = snapshots.snapshot_of(em, known, KEY, cache=cache)
    batch = [c.estimator for c in first.models.candidates if isinstance(c.estimator, SklearnState | MlpState)]
    assert batch and all(any(b is a.estimator for a in again.models.candidates) for b in batch)  # the same bytes, not made again


def test_a_worker_loads_a_batch_model_once_until_the_next_refit() -> None:
    em, known, held_out = _learned(300, refit=True)
    first = snapshots.serving_models(snapshots.decode(snapshots.encode(snapshots.snapshot_of(em, known, KEY))), KEY)
    for o in held_out[:20]:
        em.learn(o)  # the online learners move on; the batch models stay those of the refit
    second = snapshots.serving_models(snapshots.decode(snapshots.encode(snapshots.snapshot_of(em, known, KEY))), KEY)
    batch = {k: c.estimator for k, c in first.candidates.items() if c.kind == "batch" and c.estimator is not None}
    assert batch and all(second.candidates[k].estimator is m for k, m in batch.items())
    _same_answers(em, second, known, held_out[20:])
    em.refit_now()
    third = snapshots.serving_models(snapshots.decode(snapshots.encode(snapshots.snapshot_of(em, known, KEY))), KEY)
    assert not any(c.estimator is m for c in third.candidates.values() for m in batch.values())
    _same_answers(em, third, known, held_out[20:])


def test_chunks_assemble_into_complete_newer_versions_only() -> None:
    data_v1, data_v2 = secrets.token_bytes(5000), secrets.token_bytes(7000)
    v1, v2 = chunks("v100", 1, data_v1, 1024), chunks("v100", 2, data_v2, 1024)
    assert len(v1) == 5 and len(v2) == 7 and all(len(v) < 1200 for _, v in v1 + v2)
    a = Assembler()
    # interleaved, out of order, repeated: nothing until a version is complete
    mixed = [v2[3][1], v1[4][1], v2[0][1], v1[0][1], v2[3][1], b"not a chunk", None]
    assert a.add(mixed) == [] and a.rejected == 1
    assert a.add(v for _, v in v1[1:3]) == []  # v1 lacks chunk 3
    done = a.add(v for _, v in reversed(v2))
    assert [(c.environment, c.version, c.data) for c in done] == [("v100", 2, data_v2)]
    assert a.add(v for _, v in v1) == []  # complete now, but older than the one handed out
    assert not a.parts  # and its parts are not kept


def test_versions_increase_within_a_learner() -> None:
    v = next_version(None)
    assert next_version(v, now_s=0.0) == v + 1 and next_version(v, now_s=(v + 5000) / 1000) == v + 5000


def test_the_schedule_publishes_when_the_models_move_on() -> None:
    em, known, _ = _learned(50)
    s = Schedule(every=256, min_s=60.0)
    assert s.due(em, len(known), 0.0)
    s.done(em, len(known), 0.0)
    assert not s.due(em, len(known), 0.0)
    assert s.due(em, len(known) + 1, 0.0)  # a job type newly known
    for o in gavel_observations(50, seed=9):
        em.learn(o)
    assert s.due(em, len(known), 0.0)  # young models: as many again
    assert not Schedule().due(EnvironmentModels("v100"), 0, 0.0)  # nothing learned: nothing to publish


def _fleet_observations() -> list:
    """Co-located and solo windows of eight GPUs, in time order."""
    out = []
    for o in gavel_observations(80, seed=21):
        out.append(o)
        if len(out) % 5 == 0:
            out.append(
                msgspec.structs.replace(
                    o, job_id=o.job_id + "-alone", co_job_types=[], co_job_ids=[], co_solo=[], interference_pct=None,
                    occupancy="solo",
                )
            )  # fmt: skip
    return out


def _served(serving: Serving, observations: list, states: dict[str, GpuState]) -> list[dict]:
    out = []
    for o in observations:
        st = states.setdefault(o.gpu_uuid, GpuState())
        r = serving.serve(o, st.raised)
        out.extend(to_dict(p) for p in r.predictions)
        out.extend(to_dict(a) for a in r.alerts)
    return out


def _order(r: dict) -> tuple:
    return r["gpu_uuid"], r["job_id"], r.get("mode", ""), r.get("state", ""), r.get("window_end", r["ts"])


def test_two_workers_serve_their_gpus_as_one_worker_does_given_the_same_snapshot() -> None:
    em, known, _ = _learned(300, refit=True)
    data = snapshots.encode(snapshots.snapshot_of(em, known, KEY, version=1))
    observations = _fleet_observations()

    def worker() -> Serving:
        s = Serving(clock=lambda: 0.0)
        assert streamed.apply(s, "v100", 1, data, KEY)
        return s

    one = _served(worker(), observations, {})
    a, b = worker(), worker()
    mine = {o.gpu_uuid for o in observations if int(o.gpu_uuid[-1]) % 2 == 0}
    by_a = _served(a, [o for o in observations if o.gpu_uuid in mine], {})
    by_b = _served(b, [o for o in observations if o.gpu_uuid not in mine], {})
    assert by_a and by_b and a.counters["served"] and b.counters["served"]
    assert sorted(by_a + by_b, key=_order) == sorted(one, key=_order)
    assert any(r["what_if"] for r in one if "what_if" in r)
    assert not a.install("v100", 1, *streamed.models_of(data, KEY))  # not newer


def test_a_gpus_alerts_continue_where_its_last_server_left_them() -> None:
    obs = [o for o in gavel_observations(200, seed=5) if o.gpu_uuid == "GPU-1"]
    values = [90.0, 40.0, 40.0, 20.0, 90.0, 60.0, 10.0]
    obs = [msgspec.structs.replace(o, interference_pct=v, job_id="j") for o, v in zip(obs, values, strict=False)]
    whole = _served(Serving(clock=lambda: 0.0), obs, {})
    first, states = Serving(clock=lambda: 0.0), {}
    part = _served(first, obs[:3], states)
    moved = {g: msgspec.json.decode(msgspec.json.encode(st), type=GpuState) for g, st in states.items()}  # through the changelog record
    part += _served(Serving(clock=lambda: 0.0), obs[3:], moved)
    alerts = [r["state"] for r in part if "state" in r]
    assert alerts == ["raised", "cleared", "raised", "cleared"] and [r for r in part if "state" in r] == [
        r for r in whole if "state" in r
    ]


def test_before_a_snapshot_a_gpu_is_served_as_by_a_fresh_stage2() -> None:
    observations = _fleet_observations()[:12]
    fresh = LearnAndServe.build(clock=lambda: 0.0)
    want = [to_dict(p) for o in observations[:1] for p in fresh.on_observation(o).predictions]
    serving = Serving(clock=lambda: 0.0)
    got = _served(serving, observations[:1], {})
    assert got == want and serving.counters["served_before_snapshot"] == 1


def test_sharded_serving_needs_a_shared_key() -> None:
    with pytest.raises(SettingsError, match="snapshot_key"):
        Settings(serving="sharded").check()
    Settings(serving="sharded", snapshot_key="k" * 16).check()


def test_bench_serving_keys_and_counts() -> None:
    from aip.bench import serving as bench
    from aip.bench.stage2 import WARMUP_SHARE, units

    result = bench.measure(4, 400.0, progress=lambda _: None)
    assert all(k.startswith("serving_") for k in result)
    items = list(units(4, 400.0))
    steady = items[int(len(items) * WARMUP_SHARE) :]
    assert result["serving_units_served_steady"] == sum(1 for k, _ in steady if k != "idle") > 0
    assert result["serving_snapshots_steady"] >= 1 and result["serving_snapshot_bytes_median"] > 0
    timed = (
        "serving_learning_ms_per_observation_amortised",
        "serving_ms_per_observation_median",
        "serving_ms_per_observation_amortised",
    )
    assert all(result[k] is not None for k in timed)  # figures: the bench's, never a test's


def test_a_refit_is_published_as_a_snapshot_with_its_batch_models_dumped_off_the_loop() -> None:
    import asyncio
    from collections import Counter

    from streams.snapshots import Snapshots

    stage2 = Stage2()
    for o in gavel_observations(300, seed=3):
        stage2.on_observation(o)
    models = stage2.models["v100"]
    models.refit_now()
    sent: list[tuple[bytes, bytes]] = []
    published: Counter[str] = Counter()
    settings = Settings(serving="sharded", snapshot_key="k" * 32, snapshot_chunk_bytes=4096)
    snaps = Snapshots(settings, stage2, Serving(), lambda k, v: sent.append((k, v)), published)
    asyncio.run(snaps.after_refit("v100"))
    assert published["snapshots"] == 1 and published["snapshot_chunks"] == len(sent) > 1
    assert all(k[1] == models.refits for k in snaps.dump_caches["v100"]) and snaps.dump_caches["v100"]
    assert snaps.publish(["v100"]) == 0  # the models did not move on since
    for o in gavel_observations(300, seed=4):
        o = msgspec.structs.replace(o, job_id=o.job_id + "-later", window_end=o.window_end + 3600)  # not a replay
        stage2.on_observation(o)
        snaps.learned(o, partition=2)
    snaps.assign({0, 1})  # its observations partition moved to another worker: that one's learner publishes
    assert snaps.publish(["v100"]) == 0
    snaps.assign({2})
    assert snaps.publish(["v100"]) == 1 and published["snapshots"] == 2
    sent.clear()
    models.refit_now()
    asyncio.run(snaps.after_refit("v100"))
    assert published["snapshots"] == 3
    [done] = Assembler().add(v for _, v in sent)  # the last one
    served, _ = streamed.models_of(done.data, settings.snapshot_key.encode())
    _same_answers(models, served, stage2.job_types["v100"], gavel_observations(40, seed=8))

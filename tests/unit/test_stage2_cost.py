"""Stage 2's cost per observation: the what-if cache, the online learners' sample, the refits'
share of the time, and ``aip bench stage2``'s keys (counts only: timing is the bench's, never a test's)."""

from __future__ import annotations

import dataclasses

import msgspec
from test_streams import BASE, alone, observations

from aip.bench import stage2 as bench
from models.compose import pair_key
from models.environment import EnvironmentModels, draw
from models.modelconfig import ModelConfig
from models.synthetic import gavel_observations
from streams.serving import LearnAndServe
from streams.stage2 import Stage2
from streams.whatif import WhatIfCache, what_if_entries


def _learned(n: int, seed: int = 3) -> tuple[EnvironmentModels, dict]:
    em = EnvironmentModels("v100")
    known: dict = {}
    for o in gavel_observations(n, seed=seed):
        em.learn(o)
        known.setdefault(o.job_type, o.solo)
    return em, known


def test_the_what_if_cache_serves_what_recomputing_gives_until_the_models_change() -> None:
    em, known = _learned(300)
    cache = WhatIfCache(every=256, min_s=60.0)
    running = sorted(known)[:2]
    solos = [known[t] for t in running]
    first = cache.entries(em, known, running, solos)
    assert first == what_if_entries(em, known, running, solos) and first and cache.misses == 1
    # another window of the same job types (the other job's, in the other order): served, not recomputed
    again = cache.entries(em, known, running[::-1], solos[::-1])
    assert again is first and cache.hits == 1 and cache.misses == 1
    # a refit is a new version of the models: recomputed, and equal to what the refitted models answer
    em.refit_now()
    refitted = cache.entries(em, known, running, solos)
    assert cache.misses == 2 and refitted == what_if_entries(em, known, running, solos) and refitted != first
    # so are ``every`` more observations learned, once a minute of event time has gone by
    for o in gavel_observations(256, seed=4):
        em.learn(o)
    assert cache.entries(em, known, running, solos, event_ts=59.0) is refitted and cache.misses == 2
    later = cache.entries(em, known, running, solos, event_ts=60.0)
    assert cache.misses == 3 and later == what_if_entries(em, known, running, solos)
    # a job type newly known asks another question
    more = {**known, "new-type": known[running[0]]}
    assert {w.job_type for w in cache.entries(em, more, running, solos)} >= set(known) and cache.misses == 4


def test_stage2_serves_a_lone_job_from_the_cache_and_recomputes_after_a_refit() -> None:
    stage = LearnAndServe.build(clock=lambda: BASE)
    for o in observations():
        stage.on_observation(o)
    last = observations()[-1]
    lone = alone(last, 100, job_id="j9")
    [a] = stage.on_observation(lone).predictions
    [b] = stage.on_observation(msgspec.structs.replace(lone, gpu_uuid="GPU-B", job_id="j10")).predictions
    assert a.what_if == b.what_if and stage.serving.what_ifs.hits >= 1
    models = stage.learner.models_for("v100")
    models.refit_now()
    [c] = stage.on_observation(lone).predictions
    known = stage.learner.job_types["v100"]
    assert c.what_if == what_if_entries(models, known, [lone.job_type], [lone.solo])


def test_online_learners_take_a_deterministic_sample_and_the_baselines_every_observation() -> None:
    obs = gavel_observations(200, seed=5)
    em = EnvironmentModels("v100", config=ModelConfig(online_sample=4))
    for o in obs:
        em.learn(o)
    sampled = sum(1 for o in obs if draw(o.observation_id) % 4 == 0)
    assert 0 < sampled < len(obs)
    light = [c for k, c in em.candidates.items() if c.kind == "online" and c.key.model == "river.LinearRegression"]
    assert light and all(c.estimator.n == sampled for c in light if c.features)
    assert em.measurements.labels == len(obs) and em.observations == len(obs)  # the slot baselines' view: all
    # the sample is the observations', not the order's: the same learners' counts in another order
    other = EnvironmentModels("v100", config=ModelConfig(online_sample=4))
    for o in reversed(obs):
        other.learn(o)
    assert [c.estimator.n for c in light] == [
        c.estimator.n for k, c in other.candidates.items() if c.kind == "online" and c.key.model == "river.LinearRegression"
    ]
    every = EnvironmentModels("v100", config=ModelConfig(online_sample=1))
    for o in obs:
        every.learn(o)
    assert all(
        c.estimator.n == len(obs)
        for k, c in every.candidates.items()
        if c.kind == "online" and k.model == "river.LinearRegression"
    )


def _in_windows(obs: list, per_window: int, window_s: float = 10.0, t: float = 1_700_000_000.0) -> list:
    """``obs`` as a fleet sends them: ``per_window`` observations in each window of ``window_s``, from ``t``."""
    return [
        msgspec.structs.replace(o, window_start=t + window_s * (i // per_window), window_end=t + window_s * (i // per_window + 1))
        for i, o in enumerate(obs)
    ]


def _linear_counts(em: EnvironmentModels) -> list[int]:
    return [
        c.estimator.n
        for k, c in em.candidates.items()
        if c.kind == "online" and k.model == "river.LinearRegression" and c.features
    ]


def test_a_fleets_observations_thin_the_online_learners_sample_a_small_ones_do_not() -> None:
    obs = gavel_observations(1200, seed=7)
    config = ModelConfig(online_sample=4, online_max_per_s=10.0)  # up to 40 observations a second as they are
    at_bound = EnvironmentModels("v100", config=config)
    for o in _in_windows(obs, 400):  # 40 a second
        at_bound.learn(o)
    draws = [draw(o.observation_id) for o in _in_windows(obs, 400)]
    assert set(_linear_counts(at_bound)) == {sum(1 for d in draws if d % 4 == 0)}
    fleet = EnvironmentModels("v100", config=config)
    for o in _in_windows(obs, 600):  # 60 a second: the second window's sample is one in 8
        fleet.learn(o)
    draws = [draw(o.observation_id) for o in _in_windows(obs, 600)]
    thinned = sum(1 for d in draws[:600] if d % 4 == 0) + sum(1 for d in draws[600:] if d % 8 == 0)
    assert set(_linear_counts(fleet)) == {thinned} and thinned < sum(1 for d in draws if d % 4 == 0)
    assert fleet.measurements.labels == len(obs) == fleet.observations  # every observation measured and kept
    unbounded = EnvironmentModels("v100", config=ModelConfig(online_sample=4, online_max_per_s=0.0))
    for o in _in_windows(obs, 600):
        unbounded.learn(o)
    assert set(_linear_counts(unbounded)) == {sum(1 for d in draws if d % 4 == 0)}
    key = b"k" * 32
    restored = EnvironmentModels.from_state(fleet.to_state(key), key)
    assert restored.window_counts == fleet.window_counts == {1_700_000_010.0: 600, 1_700_000_020.0: 600}


def _newcomer_learned(em: EnvironmentModels) -> int:
    [c] = [c for c in em.candidates.values() if c.kind == "newcomer"]
    em.selector.settle()
    return int(c.estimator.residuals.observations)


def test_the_newcomer_thins_with_the_fleet_except_on_slots_measured_a_few_times() -> None:
    obs = gavel_observations(1800, seed=7)
    first, fleet = _in_windows(obs[:600], 300), _in_windows(obs[600:], 600, t=1_700_000_020.0)  # 30, then 60 a second
    draws = [draw(o.observation_id) for o in fleet]
    learned = {}
    for below in (0, 2, 10**9):
        em = EnvironmentModels("v100", config=ModelConfig(online_sample=4, online_max_per_s=10.0, newcomer_full_below=below))
        for o in first:
            em.learn(o)
        em.refit_now()  # the newcomer serves (and learns) from its first refit on
        before = _newcomer_learned(em)
        for o in fleet:
            em.learn(o)
        learned[below] = _newcomer_learned(em) - before
    # the window after one of 30 a second is not thinned; after one of 60 a second, one in 2 by the drift's draw
    assert learned[0] == 600 + sum(1 for d in draws[600:] if d % 2 == 0)
    assert learned[10**9] == 1200  # every slot "measured a few times": every observation, as a small fleet
    assert learned[0] < learned[2] < learned[10**9]  # slots measured once at most: every observation of them


def test_a_refit_holds_the_next_one_back_for_its_share_of_the_time() -> None:
    now = [1000.0]
    stage = Stage2(refit_share=0.25, refit_clock=lambda: now[0])
    for o in gavel_observations(40, seed=6):
        stage.on_observation(o)
    [(env, task)] = stage.refits_due()
    result = task()
    stage.apply_refit(env, dataclasses.replace(result, seconds=2.0))
    models = stage.models_for(env)
    models.drift.detected = True  # due again at once
    assert models.refit_due() and stage.refits_due() == [] and stage.counters["refits_waited"] == 1
    now[0] += 5.9  # a 2 s refit at a share of 0.25 waits 6 s
    assert stage.refits_due() == []
    now[0] += 0.2
    assert [e for e, _ in stage.refits_due()] == [env]


def test_bench_stage2_keys_and_counts() -> None:
    result = bench.measure(4, 400.0, progress=lambda _: None)
    headline = {
        "ms_per_observation_median",
        "ms_per_observation_p95",
        "ms_per_observation_amortised",
        "ms_per_colocated_observation_amortised",
    }
    assert headline <= result.keys()
    assert all(k.startswith(("ms_per_observation_", "ms_per_colocated_observation_", "stage2_")) for k in result)
    kinds = sum(result[f"stage2_{k}_units_steady"] for k in bench.KINDS)
    assert kinds == result["stage2_units_steady"] > 0
    assert result["stage2_colocated_units_steady"] > 0 and result["stage2_solo_units_steady"] > 0
    items = list(bench.units(4, 400.0))
    assert result["stage2_units_steady"] + result["stage2_units_warmup"] == len(items)
    answered = sum(1 for k, _ in items if k != "idle")
    assert result["stage2_what_if_hits"] + result["stage2_what_if_misses"] <= 2 * answered
    assert result["stage2_observations_learned"] == sum(1 for k, _ in items if k == "colocated")
    assert result["stage2_refits_total"] >= 1 and result["stage2_gpus"] == 4


def _close(a: float | None, b: float | None) -> bool:
    return (a is None) == (b is None) and (a is None or abs(a - b) <= 1e-9 * max(1.0, abs(b)))


def _same_entries(a: list, b: list) -> bool:
    """The same entries but for a batch model's last bits (its arithmetic may differ with the rows of its call)."""
    return len(a) == len(b) and all(
        x.job_type == y.job_type and x.regime == y.regime and _close(x.newcomer_pct, y.newcomer_pct)
        and _close(x.existing_pct, y.existing_pct)
        and (x.interval_pct is None) == (y.interval_pct is None)
        and (x.interval_pct is None or all(_close(u, v) for u, v in zip(x.interval_pct, y.interval_pct, strict=True)))
        for x, y in zip(a, b, strict=True)
    )  # fmt: skip


def test_entries_from_the_pair_table_are_the_pairwise_ones_and_the_same_whichever_set_asks_first() -> None:
    em, known = _learned(600)
    em.refit_now()  # batch candidates serving, as in a snapshot
    table = em.pair_table(known)
    assert len(table) == len(known) ** 2 and any(r is not None for r in table.values())
    sets = [sorted(known)[i : i + k] for k in (1, 2) for i in range(0, 6, 2)]
    served = {}
    for running in sets:
        solos = [known[t] for t in running]
        with_table = what_if_entries(em, known, running, solos, pairs=table)
        assert with_table and _same_entries(with_table, what_if_entries(em, known, running, solos))
        served[tuple(running)] = with_table
    # what is served for a pair is the table's: a pair doctored in it is what the entry says
    a, b = sorted(known)[:2]
    key = pair_key(b, a, known[b], known[a])
    assert table[key] is not None
    doctored = {**table, key: dataclasses.replace(table[key], interference_pct=12.5)}
    [entry] = [w for w in what_if_entries(em, known, [a], [known[a]], pairs=doctored) if w.job_type == b]
    assert entry.newcomer_pct == 12.5 != next(w for w in served[(a,)] if w.job_type == b).newcomer_pct
    # sharded serving: two caches (two workers) asked the sets in opposite orders publish the same entries, bit for bit
    one, other = WhatIfCache(pair_tables=True), WhatIfCache(pair_tables=True)
    for running in sets:
        assert one.entries(em, known, running, [known[t] for t in running]) == served[tuple(running)]
    for running in sets[::-1]:
        assert other.entries(em, known, running, [known[t] for t in running]) == served[tuple(running)]


def test_job_sets_sharing_a_question_ask_it_once_and_publish_what_each_alone_would() -> None:
    """Sharded serving: "b next to a and c" is a question of the sets a + b, b + c and a + c (as the newcomer); the
    cache asks it once per state of the models, and every set's entries are, bit for bit, what computing that set
    alone gives, in whatever order the sets come."""
    em, known = _learned(600)
    em.refit_now()
    table = em.pair_table(known)
    a, b, c, d = sorted(known)[:4]
    sets = [[a, b], [b, c], [a, c], [a, d], [c, d], [b]]
    alone = {tuple(s): what_if_entries(em, known, s, [known[t] for t in s], pairs=table) for s in sets}
    asked: list[int] = []
    predict = em.predict_placements

    def counting(asks, pairs=None):  # type: ignore[no-untyped-def]
        asked.append(len(asks))
        return predict(asks, pairs=pairs)

    em.predict_placements = counting  # type: ignore[method-assign]
    for order in (sets, sets[::-1]):
        cache = WhatIfCache(pair_tables=True)
        asked.clear()
        for s in order:
            assert cache.entries(em, known, s, [known[t] for t in s]) == alone[tuple(s)]
        questions = sum(len(known) * (1 + len(s)) for s in sets)
        assert sum(asked) < questions and len(cache.answers[em.environment]) == sum(asked)
    cache.forget(em.environment)
    assert em.environment not in cache.answers

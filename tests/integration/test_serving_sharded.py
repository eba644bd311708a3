"""One environment scales out: two ``aip worker`` processes with ``serving`` sharded on one
environment, the real broker.  Serving is spread across both (each serves the GPUs of its own input partitions),
and what they publish equals what one serving of the same snapshot gives for the same observations.

The snapshot is fixed: built here from another run's observations, published before the workers start, with a
version no learner reaches (a learner's versions are its clock in ms), so the learner's own snapshots are held
back and every prediction is served from this one.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for

from aip.faults.scenarios import produce_records, reference_observations, start_worker
from aip.faults.worker import stop_all
from config import Settings
from events import Alert, Observation, Prediction, to_dict
from events.topics import SNAPSHOTS
from models import snapshot as snapshots
from models.environment import EnvironmentModels
from producers.sim import Simulator
from streams import snapshots as streamed
from streams.serving import Serving
from streams.snapshots import chunks
from streams.windows import GpuState

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ENV = "v100"
START_TS = 1_700_000_000.0
FIXED = 2**60
"""The fixed snapshot's version: beyond any learner's (ms since 1970)."""


def _events(seed: int, gpus: int = 8, sim_s: float = 600.0) -> list[tuple[str, Any]]:
    """A fleet of one-GPU hosts (records are keyed by host: eight keys over the four partitions)."""
    return list(Simulator(gpus=gpus, gpu_model=ENV, seed=seed, start_ts=START_TS, duration_s=sim_s, gpus_per_host=1).events())


def _fixed_snapshot(settings: Settings, key: bytes) -> bytes:
    """Models learned (and refitted) on another fleet's observations: a snapshot with batch models and what-ifs."""
    em, known = EnvironmentModels(ENV), {}
    for o in reference_observations(settings, _events(seed=1, sim_s=900.0)).values():
        em.learn(o)
        known[o.job_type] = o.solo
        for t, s in zip(o.co_job_types, o.co_solo, strict=False):
            known.setdefault(t, s)
    em.refit_now()
    return snapshots.encode(snapshots.snapshot_of(em, known, key, version=FIXED))


def _publish(settings: Settings, data: bytes) -> int:
    from transport import RecordProducer

    records = chunks(ENV, FIXED, data, settings.snapshot_chunk_bytes)
    with RecordProducer(settings) as p:
        for k, v in records:
            p.send_raw(SNAPSHOTS, v, key=k)
        p.flush(60)
    return len(records)


def _read(settings: Settings, topics: list[str], until: Any, timeout_s: float) -> list[Any]:
    from transport import RecordConsumer

    with RecordConsumer(settings, topics, from_beginning=True) as c:
        items: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not until(items):
            items.extend(c.poll(timeout_s=0.5, max_records=5000))
        return items


def _without_ts(record: Prediction | Alert) -> tuple[str, ...]:
    d = to_dict(record)
    d.pop("ts")
    return (type(record).__name__, repr(sorted(d.items())))


def test_two_workers_on_one_environment_spread_serving_and_serve_as_one_does(broker: Any, tmp_path: Path) -> None:
    key = secrets.token_hex(16)
    settings = Settings(
        broker=broker.address,
        topic_prefix=f"ss{uuid.uuid4().hex[:10]}.",
        partitions=4,
        serving="sharded",
        snapshot_key=key,
        checkpoint_interval_s=2.0,
        snapshot_chunk_bytes=16 * 1024,  # several records per snapshot, as a larger environment's needs
    )
    from transport import ensure_project_topics

    ensure_project_topics(settings)
    data = _fixed_snapshot(settings, key.encode())
    assert _publish(settings, data) > 1  # chunked: larger than one record
    workers = [
        start_worker(settings.replace(state_dir=str(tmp_path / name / "state")), tmp_path, f"worker-{name}") for name in "ab"
    ]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.wait_ready()

        last: list[Any] = []

        def ready() -> bool:
            views = last[:] = [w.get("/serving") for w in workers]
            parts = [set(v["partitions"]) for v in views]
            fixed = all(v["versions"].get(ENV) == FIXED for v in views)
            return fixed and all(parts) and not parts[0] & parts[1] and parts[0] | parts[1] == set(range(4))

        try:
            wait_for(ready, timeout_s=120, interval_s=0.5, what="both workers serving the fixed snapshot, two partitions each")
        except BaseException:
            print(last, *(w.log_tail() for w in workers), sep="\n")
            raise

        events = _events(seed=7)
        produce_records(settings, events)
        expected = reference_observations(settings, events)
        labelled = {i for i, o in expected.items() if o.interference_pct is not None}
        assert len(labelled) > 50

        def all_observed(items: list[Any]) -> bool:
            return labelled <= {i.record.observation_id for i in items if isinstance(i.record, Observation)}

        observed = _read(settings, ["interference.observations"], all_observed, timeout_s=180)
        assert all_observed(observed), "the workers did not publish every window's observation"
        observations = [i.record for i in sorted(observed, key=lambda i: i.offset) if isinstance(i.record, Observation)]

        # one serving of the same snapshot, fed the same observations (in the order they were published)
        one = Serving()
        assert streamed.apply(one, ENV, FIXED, data, key.encode())
        states: dict[str, GpuState] = {}
        want: Counter[tuple[str, ...]] = Counter()
        what_ifs = 0
        for o in observations:
            out = one.serve(o, states.setdefault(o.gpu_uuid, GpuState()).raised)
            want.update(_without_ts(r) for r in [*out.predictions, *out.alerts])
            what_ifs += sum(1 for p in out.predictions if p.what_if)
        assert sum(1 for k in want if k[0] == "Prediction") > len(labelled)  # co-located and solo windows served
        assert what_ifs > len(labelled)  # with what-if entries from the snapshot

        def published(items: list[Any]) -> Counter[tuple[str, ...]]:
            served = [i.record for i in items if isinstance(i.record, Alert | Prediction)]
            return Counter(_without_ts(r) for r in served if not (isinstance(r, Prediction) and r.model == "idle"))

        def complete(items: list[Any]) -> bool:
            return sum(published(items).values()) >= sum(want.values())

        got = published(_read(settings, ["interference.predictions", "interference.alerts"], complete, timeout_s=120))
        assert got == want

        # spread: each worker served the GPUs of its own partitions, and every GPU was served by exactly one
        views = [w.get("/serving") for w in workers]
        gpus = [set(v["gpus"]) for v in views]
        assert all(g for g in gpus) and not gpus[0] & gpus[1]
        assert gpus[0] | gpus[1] == {o.gpu_uuid for o in observations}
        assert all(v["counters"].get("served", 0) > 0 and v["counters"].get("served_before_snapshot", 0) == 0 for v in views)
        # learning ran in one of them and published its own snapshots, which were held back by the fixed version
        assert sum(w.counter("aip_stream_published_records_total", topic="snapshots") for w in workers) >= 1
    finally:
        stop_all(workers)


def test_workers_joining_and_leaving_with_serving_sharded_lose_nothing(settings: Any, tmp_path: Path) -> None:
    """The rebalance fault scenario of tests/integration/test_faults.py, with serving sharded."""
    from aip.faults import scenarios

    sharded = settings.replace(
        serving="sharded", snapshot_key=secrets.token_hex(16), models_save_interval_s=2.0, checkpoint_interval_s=2.0
    )
    result = scenarios.rebalance(sharded, tmp_path, scenarios.Fleet(8, 600, 24, seed=13, resume_timeout_s=90))
    print("rebalance, serving sharded:", result)
    assert result["lost"] == 0 and result["observations_expected"] > 0
    assert result["learned_final"] == result["labelled_observations"] > 0
    assert result["profiles_agree"] and result["changelog_restored_gpus"] > 0
    assert result["input_offsets_skipped"] == 0

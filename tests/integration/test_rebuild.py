"""Stage 2 rebuilt from ``interference.observations`` on the real broker: the range read, bad records, refit first."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from aip.faults import scenarios
from events import Observation, Topics, encode, observation_batches
from producers.sim import Simulator
from streams.readers import PartitionReader
from streams.rebuild import Rebuild
from streams.refits import Refits
from streams.stage2 import Stage2

pytestmark = [pytest.mark.integration]

GARBAGE = [b"not json", b"", b'{"window_start": "yesterday"}', b"[1, 2, 3]", b"\xff\xfe"]


def _observations(settings: Any) -> list[Observation]:
    events = list(Simulator(gpus=4, gpu_model="v100", seed=3, start_ts=1_700_000_000.0, duration_s=600).events())
    out = sorted(scenarios.reference_observations(settings, events).values(), key=lambda o: (o.window_end, o.observation_id))
    assert len(out) > 150
    return out


def _labelled(observations: list[Observation]) -> int:
    return sum(o.interference_pct is not None for o in observations)


def _in_range(observations: list[Observation], batched: bool) -> list[bytes]:
    """The range's records: one per observation, or ObservationBatch records of a few each (the first with an invalid
    observation, another environment's, inside it), with bad records among them."""
    if batched:
        records = [value for _env, value, _n in observation_batches(observations, max_bytes=8192)]
        stray = encode(msgspec.structs.replace(observations[0], environment="a100"))
        head, tail = records[0].split(b"[", 1)
        records[0] = head + b"[" + stray + b"," + tail
        assert len(records) > 5
    else:
        records = [encode(o) for o in observations]
    values: list[bytes] = []
    for i, value in enumerate(records):
        values.append(value)
        if i % 25 == 3:
            values.append(GARBAGE[(i // 25) % len(GARBAGE)])
    return values


@pytest.mark.parametrize("batched", [False, True], ids=["one-per-record", "observation-batches"])
def test_a_rebuild_learns_exactly_its_range_skips_bad_records_and_refits_before_serving(
    settings: Any, tmp_path: Path, batched: bool
) -> None:
    from transport import RecordProducer, ensure_project_topics

    ensure_project_topics(settings)
    topic = Topics(settings.topic_prefix).observations
    obs = _observations(settings)
    covered, rest = obs[:40], obs[40:]
    in_range, after = rest[: len(rest) // 2], rest[len(rest) // 2 :]
    # partition 0: what the models already cover, the range to rebuild with bad records among it, what follows
    values = [encode(o) for o in covered] + _in_range(in_range, batched) + [encode(o) for o in after]
    with RecordProducer(settings) as p:
        offsets = [int(f.get(timeout=30).offset) for f in [p.send_to(topic, 0, v, key=b"v100") for v in values]]
    start, end = offsets[len(covered)], offsets[len(values) - len(after)]  # [start, end): the range and its bad records
    assert end - start == len(values) - len(covered) - len(after)

    stage2 = Stage2(state_dir=tmp_path)
    stage2.applied(0, start - 1)  # the models cover everything before ``start`` (a snapshot, say)
    published: list[tuple[str, Any]] = []

    async def publish(env: str, board: Any) -> None:
        published.append((env, board))

    refits = Refits(stage2, publish)
    ranges: list[tuple[int, int]] = []

    def reader(partition: int, first: int, stop: int) -> PartitionReader:
        ranges.append((first, stop))
        return PartitionReader(settings, topic, partition, first, stop)

    rebuild = Rebuild(stage2, refits, reader, publish)
    asyncio.run(rebuild.before(0, end))  # the agent is handed the record at ``end``: it is served after this returns

    assert ranges == [(start, end)]
    assert stage2.counters["rebuilt"] == len(in_range)  # nothing before start, nothing from end on, no bad record
    models = stage2.models_for("v100")
    assert models.observations == _labelled(in_range) > 30
    # refit, then serve: the refit's leaderboard went out before the record at ``end`` could be served
    assert [env for env, _ in published] == ["v100"]
    board = published[0][1]
    assert board.last_refit is not None and board.observations == _labelled(in_range)
    assert not models.refit_due()
    assert stage2.start_of(0) == end + 1
    asyncio.run(rebuild.before(0, end + 1))  # the next record: covered, nothing read again
    assert ranges == [(start, end)] and stage2.counters["rebuilds"] == 1

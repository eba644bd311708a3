"""ObservationBatch on ``interference.observations``: written by :func:`events.observation_batches`, read by
:func:`events.observations` and, one Received per observation, by every RecordConsumer (:func:`transport.decode_messages`)."""

from __future__ import annotations

import msgspec
import pytest
from test_streams import observations as make_observations

from events import MAX_OBSERVATIONS_PER_BATCH, ObservationBatch, Topics, decode, encode, observation_batches, observations
from events.records import RecordError
from transport import decode_messages


def test_batches_hold_every_observation_once_in_order_by_environment_within_their_bounds() -> None:
    obs = [o for pair in zip(make_observations(30), make_observations(30, env="a100"), strict=True) for o in pair]
    max_bytes = 6 * len(encode(obs[0]))
    out = observation_batches(obs, max_bytes)
    assert next(env for env, _v, _n in out) == "v100" and len(out) > 4
    read = {env: [o for e, v, _n in out if e == env for o in decode(ObservationBatch, v).observations] for env in ("v100", "a100")}
    assert read == {env: [o for o in obs if o.environment == env] for env in ("v100", "a100")}
    for _env, value, n in out:
        assert len(value) <= max_bytes and len(decode(ObservationBatch, value).observations) == n
        batch = decode(ObservationBatch, value)
        assert value == msgspec.json.encode(batch)  # what encoding the record itself would write
    assert all(n <= MAX_OBSERVATIONS_PER_BATCH for _e, _v, n in observation_batches(make_observations(1) * 1500, 1 << 30))
    assert [n for _e, _v, n in observation_batches(make_observations(1), 1024)] == [1]  # bigger than the bound: alone


def test_a_batch_envelope_must_hold_one_environment() -> None:
    o = make_observations(1)[0]
    with pytest.raises(RecordError, match="is not the batch's"):
        ObservationBatch(environment="a100", observations=[o])
    with pytest.raises(RecordError):
        decode(ObservationBatch, b'{"environment": "v100", "observations": []}')


def test_readers_get_one_received_per_observation_and_an_invalid_one_alone() -> None:
    obs = make_observations(3)
    _env, value, _n = observation_batches(obs, 1 << 20)[0]
    bad = encode(obs[0]).replace(b'"job_id":"j1"', b'"job_id":7')
    value = value.replace(b'"observations":[', b'"observations":[' + bad + b",", 1)
    topics = Topics("t.")
    got = decode_messages(topics, topics.observations, 2, 41, 0, b"v100", value)
    assert [r.record for r in got if r.error is None] == obs
    errors = [r for r in got if r.error is not None]
    assert len(errors) == 1 and errors[0].value == bad and "observations[0]" in errors[0].error
    assert {(r.partition, r.offset) for r in got} == {(2, 41)}
    assert observations(value).rejected[0].payload == bad
    single = decode_messages(topics, topics.observations, 0, 1, 0, b"v100", encode(obs[0]))
    assert [r.record for r in single] == [obs[0]]
    assert decode_messages(topics, topics.observations, 0, 2, 0, None, b'{"observations": 3}')[0].error is not None

"""The JSON Schemas msgspec generates from the record Structs accept published records and reject invalid ones."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from jsonschema import Draft202012Validator
from records import TOP_LEVEL, records_of

from events import RECORD_OF, Prediction, encode
from events.jsonschema import schema_of, topic_schemas, write

VALIDATORS = {cls: Draft202012Validator(schema_of(cls)) for cls in TOP_LEVEL}


def test_every_schema_is_a_valid_json_schema() -> None:
    schemas = topic_schemas()
    assert set(schemas) == set(RECORD_OF)
    for schema in schemas.values():
        Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("cls", TOP_LEVEL, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=__import__("hypothesis").strategies.data())
def test_valid_records_validate(cls: type, data: object) -> None:
    record = data.draw(records_of(cls))  # type: ignore[attr-defined]
    wire = json.loads(encode(record))
    errors = [e.message for e in VALIDATORS[cls].iter_errors(wire)]
    assert errors == []


@pytest.mark.parametrize(
    "cls, patch",
    [
        ("Alert", {"state": "bogus"}),
        ("Alert", {"threshold": "high"}),
        ("Prediction", {"what_if": [{"job_type": "x", "newcomer_pct": 1.0}]}),
        ("MetricSample", {"sm_util_pct": 120.0}),
        ("JobEvent", {"job_id": None}),
        ("Observation", {"schema_version": 2}),
    ],
)
def test_invalid_records_are_rejected(cls: str, patch: dict[str, object]) -> None:
    from hypothesis import Phase, find

    record_cls = next(c for c in TOP_LEVEL if c.__name__ == cls)
    # the first record drawn: the patch makes any record invalid, so shrinking it to the smallest one (seconds) adds nothing
    first = settings(phases=[Phase.generate], database=None)
    example = json.loads(encode(find(records_of(record_cls), lambda r: True, settings=first)))
    assert VALIDATORS[record_cls].is_valid(example)
    example.update(patch)
    assert not VALIDATORS[record_cls].is_valid(example)


def test_the_metrics_topic_schema_takes_per_gpu_samples_and_host_batches() -> None:
    from records import sample

    from events import HostMetrics

    validator = Draft202012Validator(topic_schemas()["gpu.metrics"])
    one = sample(host="h", gpu_uuid="GPU-1")
    batch = json.loads(encode(HostMetrics(ts=one.ts, host="h", samples=[one, sample(host="h", gpu_uuid="GPU-2")])))
    assert validator.is_valid(json.loads(encode(one))) and validator.is_valid(batch)
    assert not validator.is_valid({**batch, "samples": []})
    assert not validator.is_valid({**batch, "samples": [{**batch["samples"][0], "sm_util_pct": 120.0}]})
    assert not validator.is_valid({k: v for k, v in batch.items() if k != "host"})


def test_write_one_file_per_topic(tmp_path) -> None:
    paths = write(tmp_path)
    assert sorted(p.name for p in paths) == sorted(f"{t}.schema.json" for t in RECORD_OF)
    assert json.loads((tmp_path / "interference.alerts.schema.json").read_text())["title"] == "Alert"


def test_the_profiles_schema_in_the_integration_guide_is_the_generated_one() -> None:
    from pathlib import Path

    from events import SoloProfile

    text = (Path(__file__).resolve().parents[2] / "docs" / "INTEGRATION.md").read_text()
    block = text.split("<!-- schema:SoloProfile -->\n```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(block) == schema_of(SoloProfile)


def _published(tmp_path) -> dict[type, list[object]]:
    """What the simulator, stage 1 and stage 2 publish for a short simulated fleet, by record class."""
    from events import HostJobEvents, HostMetrics, ObservationBatch, decode, observation_batches
    from producers.batching import host_batches
    from producers.sim import Simulator
    from streams.deadletters import dead_letter
    from streams.serving import LearnAndServe
    from streams.stage1 import Stage1

    start_ts = 1_700_000_000.0
    stream = list(Simulator(gpus=2, gpu_model="v100", seed=1, start_ts=start_ts, duration_s=400.0).events())
    events = [r for _t, r in stream]
    batches = [r for _t, r in host_batches(stream) if isinstance(r, HostMetrics | HostJobEvents)]
    stage1 = Stage1(window_s=10.0, lateness_s=2.0)
    observations = [o for e in events for o in (stage1.on_metric(e) if hasattr(e, "power_w") else stage1.on_job(e))]
    stage2 = LearnAndServe.build(clock=lambda: start_ts + 400.0, max_pct=20.0, state_dir=tmp_path)
    outputs = [stage2.on_observation(o) for o in observations]
    out: dict[type, list[object]] = {}
    for record in [
        *events,
        *batches,
        *observations,
        *(decode(ObservationBatch, value) for _env, value, _n in observation_batches(observations, 256 * 1024)),
        *(stage1.profiles.record(env, job_type) for env, job_type in stage1.profiles.known()),
        *(p for o in outputs for p in o.predictions),
        *(a for o in outputs for a in o.alerts),
        *(o.leaderboard for o in outputs if o.leaderboard is not None),
        dead_letter("gpu.metrics", 0, 7, b"{", "not valid JSON", stage="stage1", now=start_ts),
    ]:
        out.setdefault(type(record), []).append(record)
    return out


def test_records_the_pipeline_publishes_validate_against_their_schemas(tmp_path) -> None:
    published = _published(tmp_path)
    assert set(published) == set(TOP_LEVEL)  # every topic
    for cls, records in published.items():
        for record in records:
            assert list(VALIDATORS[cls].iter_errors(json.loads(encode(record)))) == [], record
    assert any(p.what_if for p in published[Prediction])  # placement mode: nested records validated too

"""The generated JSON Schemas accept every valid record and reject what the validator rejects."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from jsonschema import Draft202012Validator
from records import TOP_LEVEL, records_of

from events import RECORD_OF, encode
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
    from hypothesis import find

    record_cls = next(c for c in TOP_LEVEL if c.__name__ == cls)
    example = json.loads(encode(find(records_of(record_cls), lambda r: True)))
    assert VALIDATORS[record_cls].is_valid(example)
    example.update(patch)
    assert not VALIDATORS[record_cls].is_valid(example)


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

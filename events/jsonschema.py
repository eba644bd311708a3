"""JSON Schemas (draft 2020-12) of the records, generated from their field specs.

For consumers in other languages: ``python -m events.jsonschema DIR`` writes one
``<topic>.schema.json`` per topic.  The schemas say what the validator in
:mod:`events.schema` accepts (types, bounds, choices, required fields); unknown
keys are allowed, so that newer producers may add optional fields.

>>> from events.records import WhatIf
>>> s = schema_of(WhatIf)
>>> s["required"], s["properties"]["newcomer_pct"]
(['job_type', 'newcomer_pct', 'existing_pct'], {'type': 'number'})
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from events.schema import MAX_LIST_LEN, SCHEMA_VERSION, Spec
from events.topics import RECORD_OF

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _number(s: Spec, kind: str) -> dict[str, Any]:
    out: dict[str, Any] = {"type": kind}
    if s.lo is not None:
        out["minimum"] = s.lo
    if s.hi is not None:
        out["maximum"] = s.hi
    return out


def _dict_float() -> dict[str, Any]:
    return {
        "type": "object",
        "maxProperties": MAX_LIST_LEN,
        "propertyNames": {"maxLength": 64},
        "additionalProperties": {"type": ["number", "null"]},
    }


def spec_schema(s: Spec) -> dict[str, Any]:
    """The JSON Schema of one field spec (without null).

    >>> spec_schema(Spec("float", lo=0.0, hi=100.0))
    {'type': 'number', 'minimum': 0.0, 'maximum': 100.0}
    >>> spec_schema(Spec("enum", choices=("raised", "cleared")))
    {'type': 'string', 'enum': ['raised', 'cleared']}
    """
    kind = s.kind
    if kind == "float":
        return _number(s, "number")
    if kind == "int":
        return _number(s, "integer")
    if kind == "str":
        return {"type": "string", "maxLength": s.max_len}
    if kind == "bool":
        return {"type": "boolean"}
    if kind == "enum":
        return {"type": "string", "enum": list(s.choices)}
    if kind == "list_str":
        return {"type": "array", "maxItems": MAX_LIST_LEN, "items": {"type": "string", "maxLength": s.max_len}}
    if kind == "dict_float":
        return _dict_float()
    if kind == "dict_str":
        return {
            "type": "object",
            "maxProperties": MAX_LIST_LEN,
            "additionalProperties": {"type": "string", "maxLength": s.max_len},
        }
    if kind == "list_dict_float":
        return {"type": "array", "maxItems": MAX_LIST_LEN, "items": _dict_float()}
    if kind == "interval":
        return {"type": "array", "minItems": 2, "maxItems": 2, "items": _number(s, "number")}
    if kind == "record":
        assert s.record is not None
        return schema_of(s.record, top=False)
    if kind == "list_record":
        assert s.record is not None
        return {"type": "array", "maxItems": MAX_LIST_LEN, "items": schema_of(s.record, top=False)}
    raise ValueError(f"unknown spec kind {kind}")


def schema_of(cls: type, *, top: bool = True) -> dict[str, Any]:
    """The JSON Schema of a record class (``top``: with ``$schema``, title and description)."""
    props: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        if f.name == "schema_version":
            props[f.name] = {"const": SCHEMA_VERSION}
            required.append(f.name)
            continue
        s: Spec = f.metadata["spec"]
        sub = spec_schema(s)
        optional = bool(f.metadata.get("optional"))
        if optional:
            sub = {"anyOf": [sub, {"type": "null"}]}
        props[f.name] = sub
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if not optional and not has_default:
            required.append(f.name)
    out: dict[str, Any] = {"type": "object", "properties": props, "required": required}
    if top:
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        out = {"$schema": DIALECT, "title": cls.__name__, "description": " ".join(doc.split()), **out}
    return out


def topic_schemas() -> dict[str, dict[str, Any]]:
    """Base topic name -> the schema of its record."""
    return {topic: schema_of(cls) for topic, cls in RECORD_OF.items()}


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for topic, schema in topic_schemas().items():
        path = directory / f"{topic}.schema.json"
        path.write_text(json.dumps(schema, indent=2) + "\n")
        paths.append(path)
    return paths


__all__ = ["schema_of", "spec_schema", "topic_schemas", "write"]

if __name__ == "__main__":  # pragma: no cover
    for p in write(Path(sys.argv[1] if len(sys.argv) > 1 else "schemas")):
        print(p)

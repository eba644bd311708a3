"""The wire contract: one record per topic, validation, and the JSON codec."""

from events.codec import b64, decode, decode_obj, encode
from events.records import (
    ALERT_SOURCES,
    ALERT_STATES,
    CATEGORIES,
    JOB_KINDS,
    MODES,
    PARAMETER_FIELDS,
    PARAMETERS,
    Alert,
    DeadLetter,
    GpuProcess,
    JobEvent,
    Leaderboard,
    LeaderboardEntry,
    MetricSample,
    Observation,
    Prediction,
    WhatIf,
)
from events.schema import SCHEMA_VERSION, RecordError, to_dict
from events.topics import RECORD_OF, Topics

__all__ = [
    "ALERT_SOURCES",
    "ALERT_STATES",
    "CATEGORIES",
    "JOB_KINDS",
    "MODES",
    "PARAMETERS",
    "PARAMETER_FIELDS",
    "RECORD_OF",
    "SCHEMA_VERSION",
    "Alert",
    "DeadLetter",
    "GpuProcess",
    "JobEvent",
    "Leaderboard",
    "LeaderboardEntry",
    "MetricSample",
    "Observation",
    "Prediction",
    "RecordError",
    "Topics",
    "WhatIf",
    "b64",
    "decode",
    "decode_obj",
    "encode",
    "to_dict",
]

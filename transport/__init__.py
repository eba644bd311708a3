"""Kafka clients for producers and tools (kafka-python), speaking ``events`` records."""

from transport.kafka import (
    RawConsumer,
    Received,
    RecordConsumer,
    RecordProducer,
    admin,
    decode_message,
    decode_messages,
    ensure_project_topics,
    ensure_topics,
    group_offsets,
    kafka_config,
)
from transport.probe import BrokerUnavailable, check_reachable

__all__ = [
    "BrokerUnavailable",
    "RawConsumer",
    "Received",
    "RecordConsumer",
    "RecordProducer",
    "admin",
    "check_reachable",
    "decode_message",
    "decode_messages",
    "ensure_project_topics",
    "ensure_topics",
    "group_offsets",
    "kafka_config",
]

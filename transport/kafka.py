"""A small typed layer over kafka-python for producers and tools.

Records go out through :class:`RecordProducer` (encoded by ``events``, keyed by
the record's key) and come back through :class:`RecordConsumer` as
:class:`Received` items that carry either a record or the reason it could not
be decoded, so a reader never stops on bad input.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from config import Settings
from events import RecordError, Topics, decode, encode

log = logging.getLogger(__name__)


class BrokerUnavailable(ConnectionError):
    """The broker could not be reached or refused us; the message says where and why."""


def kafka_config(settings: Settings) -> dict[str, Any]:
    """kafka-python keyword arguments for the connection and security settings."""
    cfg: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "client_id": settings.client_id,
        "security_protocol": settings.security_protocol,
        "request_timeout_ms": int(settings.request_timeout_s * 1000),
    }
    if settings.uses_sasl:
        cfg["sasl_mechanism"] = settings.sasl_mechanism
        cfg["sasl_plain_username"] = settings.sasl_username
        cfg["sasl_plain_password"] = settings.sasl_password
    if settings.uses_tls:
        cfg["ssl_check_hostname"] = settings.ssl_check_hostname
        if settings.ssl_cafile:
            cfg["ssl_cafile"] = settings.ssl_cafile
        if settings.ssl_certfile:
            cfg["ssl_certfile"] = settings.ssl_certfile
        if settings.ssl_keyfile:
            cfg["ssl_keyfile"] = settings.ssl_keyfile
    return cfg


def check_reachable(settings: Settings, timeout_s: float | None = None) -> None:
    """Raise :class:`BrokerUnavailable` unless some bootstrap server accepts a TCP connection."""
    deadline = time.monotonic() + (settings.connect_timeout_s if timeout_s is None else timeout_s)
    last = ""
    while True:
        for server in settings.bootstrap_servers:
            host, _, port = server.rpartition(":")
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                    return
            except OSError as exc:
                last = f"{server}: {exc.strerror or exc}"
        if time.monotonic() >= deadline:
            raise BrokerUnavailable(f"no broker reachable at {settings.broker} ({last}); start one with `aip broker` or set --broker/AIP_BROKER")
        time.sleep(0.2)


def _wrap_errors(settings: Settings, what: str, exc: Exception) -> BrokerUnavailable:
    name = type(exc).__name__
    text = str(exc)
    for secret in settings.secrets():
        text = text.replace(secret, "****")
    if "Authentication" in name or "SASL" in text.upper() or "Authentication" in text:
        return BrokerUnavailable(f"{what}: authentication failed at {settings.broker}: check AIP_SASL_USERNAME/AIP_SASL_PASSWORD ({name})")
    return BrokerUnavailable(f"{what}: broker {settings.broker} unavailable: {name}: {text}".rstrip(": "))


def admin(settings: Settings) -> Any:
    from kafka.admin import KafkaAdminClient

    check_reachable(settings)
    try:
        return KafkaAdminClient(**kafka_config(settings))
    except Exception as exc:  # kafka-python raises several unrelated types here
        raise _wrap_errors(settings, "admin", exc) from None


def ensure_topics(settings: Settings, names: Iterable[str], partitions: int | None = None) -> list[str]:
    """Create the topics that do not exist yet; return those created."""
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    client = admin(settings)
    try:
        existing = set(client.list_topics())
        wanted = [n for n in dict.fromkeys(names) if n not in existing]
        if wanted:
            topics = [NewTopic(n, partitions or settings.partitions, settings.replication_factor) for n in wanted]
            try:
                client.create_topics(topics)
            except TopicAlreadyExistsError:
                pass
        return wanted
    except BrokerUnavailable:
        raise
    except Exception as exc:
        raise _wrap_errors(settings, "create topics", exc) from None
    finally:
        client.close()


def ensure_project_topics(settings: Settings) -> list[str]:
    return ensure_topics(settings, Topics(settings.topic_prefix).all())


class RecordProducer:
    """Send ``events`` records to topics, keyed by the record's key.

    ``producer`` is injectable (tests, benchmarks); by default a kafka-python
    ``KafkaProducer`` built from the settings.
    """

    def __init__(self, settings: Settings, producer: Any = None, **kafka_overrides: Any) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        if producer is None:
            from kafka import KafkaProducer

            check_reachable(settings)
            # kafka-python 3.x defaults: idempotent, acks=all (safe retries, no reordering)
            cfg = kafka_config(settings) | {"linger_ms": 5} | kafka_overrides
            try:
                producer = KafkaProducer(**cfg)
            except Exception as exc:
                raise _wrap_errors(settings, "producer", exc) from None
        self._producer = producer

    def send(self, topic: str, record: Any, key: str | None = None) -> Any:
        """Encode and send; ``topic`` is a base name (prefixed here) or a full name."""
        data = encode(record)
        k = key if key is not None else getattr(record, "key", None)
        return self._producer.send(self.topics.name(topic), key=k.encode() if k is not None else None, value=data)

    def send_raw(self, topic: str, value: bytes | None, key: bytes | None = None) -> Any:
        """Send bytes as they are (fault injection, replay of recorded payloads)."""
        return self._producer.send(self.topics.name(topic), key=key, value=value)

    def flush(self, timeout_s: float | None = None) -> None:
        self._producer.flush(timeout=timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        self._producer.close(timeout=timeout_s)

    def __enter__(self) -> RecordProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Received:
    """One consumed message: the decoded ``record``, or ``error`` when it could not be decoded."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    record: Any = None
    error: str | None = None


def decode_message(topics: Topics, topic: str, partition: int, offset: int, timestamp_ms: int, key: bytes | None, value: bytes | None) -> Received:
    cls = topics.record_of(topic)
    if cls is None:
        return Received(topic, partition, offset, timestamp_ms, key, value, error=f"unknown topic {topic}")
    try:
        return Received(topic, partition, offset, timestamp_ms, key, value, record=decode(cls, value))
    except RecordError as exc:
        return Received(topic, partition, offset, timestamp_ms, key, value, error=str(exc))


class RecordConsumer:
    """Consume project topics and yield :class:`Received` items.

    Without ``group`` it reads every partition directly (no consumer group,
    nothing committed), from the beginning or from the end.
    """

    def __init__(
        self,
        settings: Settings,
        topics: Iterable[str],
        *,
        group: str | None = None,
        from_beginning: bool = False,
        consumer: Any = None,
        **kafka_overrides: Any,
    ) -> None:
        self.settings = settings
        self.names = Topics(settings.topic_prefix)
        self.topic_names = [self.names.name(t) for t in topics]
        if consumer is None:
            from kafka import KafkaConsumer

            check_reachable(settings)
            rebalance_ms = int(settings.rebalance_timeout_s * 1000)
            cfg = kafka_config(settings) | {
                "group_id": group,
                "auto_offset_reset": "earliest" if from_beginning else "latest",
                "enable_auto_commit": group is not None,
                "max_poll_interval_ms": max(rebalance_ms, 1000),
                "session_timeout_ms": max(6000, min(int(settings.request_timeout_s * 1000) - 1000, 10000)),
                "heartbeat_interval_ms": 1000,
            } | kafka_overrides
            try:
                consumer = KafkaConsumer(**cfg)
            except Exception as exc:
                raise _wrap_errors(settings, "consumer", exc) from None
            if group is None:
                self._assign_all(consumer, from_beginning)
            else:
                consumer.subscribe(self.topic_names)
        self._consumer = consumer

    def _assign_all(self, consumer: Any, from_beginning: bool) -> None:
        from kafka import TopicPartition

        parts: list[Any] = []
        deadline = time.monotonic() + self.settings.connect_timeout_s
        for name in self.topic_names:
            ids = consumer.partitions_for_topic(name)
            while not ids and time.monotonic() < deadline:
                time.sleep(0.2)
                ids = consumer.partitions_for_topic(name)
            if not ids:
                raise BrokerUnavailable(f"topic {name} does not exist on {self.settings.broker}")
            parts.extend(TopicPartition(name, p) for p in sorted(ids))
        consumer.assign(parts)
        if from_beginning:
            consumer.seek_to_beginning()
        else:
            consumer.seek_to_end()

    def poll(self, timeout_s: float = 1.0, max_records: int = 500) -> list[Received]:
        try:
            batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except Exception as exc:
            raise _wrap_errors(self.settings, "consumer", exc) from None
        out = []
        for _tp, messages in batches.items():
            for m in messages:
                out.append(decode_message(self.names, m.topic, m.partition, m.offset, m.timestamp, m.key, m.value))
        out.sort(key=lambda r: (r.timestamp_ms, r.topic, r.partition, r.offset))
        return out

    def __iter__(self) -> Iterator[Received]:
        while True:
            yield from self.poll()

    def read(self, until: Any = None, timeout_s: float = 30.0) -> list[Received]:
        """Poll until ``until(items)`` is true or ``timeout_s`` passes; return all items read."""
        items: list[Received] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            items.extend(self.poll(timeout_s=0.5))
            if until is not None and until(items):
                break
        return items

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> RecordConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

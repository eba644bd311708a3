"""A small typed layer over kafka-python for producers and tools.

Records go out through :class:`RecordProducer` (encoded by ``events``, keyed by
the record's key) and come back through :class:`RecordConsumer` as
:class:`Received` items that carry either a record or the reason it could not
be decoded, so a reader never stops on bad input.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from config import Settings
from events import RecordError, Topics, decode_on_topic, encode, read_records
from events.topics import COMPACTED, LIFECYCLE, METRICS, OBSERVATIONS
from transport.probe import BrokerUnavailable, check_reachable
from transport.tls import TlsSettingsError, client_context

log = logging.getLogger(__name__)


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
    if settings.uses_tls:  # the probe's context, so that both mean the same by every setting
        try:
            cfg["ssl_context"] = client_context(settings)
        except TlsSettingsError as exc:
            raise BrokerUnavailable(str(exc)) from None
        cfg["ssl_check_hostname"] = settings.ssl_check_hostname
    return cfg


def _wrap_errors(settings: Settings, what: str, exc: Exception) -> BrokerUnavailable:
    name = type(exc).__name__
    text = str(exc)
    for secret in settings.secrets():
        text = text.replace(secret, "****")
    if "Authentication" in name or "SASL" in text.upper() or "Authentication" in text:
        return BrokerUnavailable(
            f"{what}: authentication failed at {settings.broker}: check AIP_SASL_USERNAME/AIP_SASL_PASSWORD ({name})"
        )
    return BrokerUnavailable(f"{what}: broker {settings.broker} unavailable: {name}: {text}".rstrip(": "))


def admin(settings: Settings) -> Any:
    from kafka.admin import KafkaAdminClient

    check_reachable(settings)
    try:
        return KafkaAdminClient(**kafka_config(settings))
    except Exception as exc:  # kafka-python raises several unrelated types here
        raise _wrap_errors(settings, "admin", exc) from None


def topic_configs(settings: Settings, name: str) -> dict[str, str]:
    """Topic-level configs the project sets when it creates ``name`` (a full or base name).

    >>> topic_configs(Settings(), "interference.profiles")
    {'cleanup.policy': 'compact'}
    >>> topic_configs(Settings(topic_prefix="t.", observations_retention_ms=-1), "t.interference.observations")
    {'retention.ms': '-1'}
    """
    base = Topics(settings.topic_prefix).base(name)
    if base in COMPACTED:
        return {"cleanup.policy": "compact"}
    if base == OBSERVATIONS:  # models are rebuilt from this history (docs/ARCHITECTURE.md, "State")
        return {"retention.ms": str(settings.observations_retention_ms)}
    return {}


def ensure_topics(settings: Settings, names: Iterable[str], partitions: int | None = None) -> list[str]:
    """Create the topics that do not exist yet (with :func:`topic_configs`); return those created."""
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    client = admin(settings)
    try:
        existing = set(client.list_topics())
        wanted = [n for n in dict.fromkeys(names) if n not in existing]
        if wanted:
            topics = [
                NewTopic(
                    n, partitions or settings.partitions, settings.replication_factor, topic_configs=topic_configs(settings, n)
                )
                for n in wanted
            ]
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
    topics = Topics(settings.topic_prefix)
    return ensure_topics(settings, topics.all() + topics.internal())


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

    def send_to(self, full_name: str, partition: int, value: bytes | None, key: bytes | None = None) -> Any:
        """Send bytes to one partition of a topic named in full (internal topics, such as the stage-1 changelog)."""
        return self._producer.send(full_name, key=key, value=value, partition=partition)

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


def decode_message(
    topics: Topics, topic: str, partition: int, offset: int, timestamp_ms: int, key: bytes | None, value: bytes | None
) -> Received:
    cls = topics.record_of(topic)
    if cls is None:
        return Received(topic, partition, offset, timestamp_ms, key, value, error=f"unknown topic {topic}")
    try:
        return Received(topic, partition, offset, timestamp_ms, key, value, record=decode_on_topic(cls, value))
    except RecordError as exc:
        return Received(topic, partition, offset, timestamp_ms, key, value, error=str(exc))


def decode_messages(
    topics: Topics,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    key: bytes | None,
    value: bytes | None,
    keep_host_batches: bool = False,
) -> list[Received]:
    """:func:`decode_message`, except that a batch (:class:`events.HostMetrics`, :class:`events.HostJobEvents`,
    :class:`events.ObservationBatch`) is read as its records, one :class:`Received` each (all with the batch's
    offset; an invalid one as its own ``error``), so that every reader of a topic sees the producers' default
    record form and the single one alike. ``keep_host_batches``: a host's batch of samples or job events stays one
    :class:`Received`, as on the wire."""
    cls = topics.record_of(topic)
    if cls is None or (keep_host_batches and topics.base(topic) in (METRICS, LIFECYCLE)):
        return [decode_message(topics, topic, partition, offset, timestamp_ms, key, value)]
    try:
        records, rejected = read_records(cls, value)
    except RecordError as exc:
        return [Received(topic, partition, offset, timestamp_ms, key, value, error=str(exc))]
    out = [Received(topic, partition, offset, timestamp_ms, key, value, record=r) for r in records]
    out.extend(Received(topic, partition, offset, timestamp_ms, key, r.payload, error=r.error) for r in rejected)
    return out


class RawConsumer:
    """Raw ``(offset, key, value)`` records of one partition read from a given offset, outside any consumer group.

    For the worker's readers of its own topics (the stage-1 changelog, a rebuild's range of
    observations): topics are named in full, nothing is decoded or committed, and nobody
    asks the broker where the partition ends (see :mod:`streams.readers`).  ``consumer`` is
    injectable (tests); by default a kafka-python ``KafkaConsumer`` built from the settings.
    """

    def __init__(self, settings: Settings, consumer: Any = None) -> None:
        self.settings = settings
        if consumer is None:
            from kafka import KafkaConsumer

            cfg = kafka_config(settings) | {"group_id": None, "enable_auto_commit": False, "auto_offset_reset": "earliest"}
            try:
                consumer = KafkaConsumer(**cfg)
            except Exception as exc:
                raise _wrap_errors(settings, "consumer", exc) from None
        self._consumer = consumer
        self.tp: Any = None

    def partitions(self, full_name: str) -> set[int]:
        """The partitions of a topic (empty when it does not exist)."""
        return set(self._consumer.partitions_for_topic(full_name) or ())

    def assign(self, full_name: str, partition: int, offset: int | None = None) -> RawConsumer:
        """Read ``partition`` of ``full_name`` from ``offset`` (None: from the beginning)."""
        from kafka import TopicPartition

        self.tp = TopicPartition(full_name, partition)
        self._consumer.assign([self.tp])
        if offset is None:
            self._consumer.seek_to_beginning(self.tp)
        else:
            self._consumer.seek(self.tp, offset)
        return self

    def poll(self, timeout_s: float = 0.5, max_records: int = 500) -> list[tuple[int, bytes | None, bytes | None]]:
        """The next records (blocking up to ``timeout_s``), in offset order."""
        batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        return [(m.offset, m.key, m.value) for messages in batches.values() for m in messages]

    def position(self) -> int:
        """The offset of the next record to read."""
        return int(self._consumer.position(self.tp))

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> RawConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def group_offsets(settings: Settings, group_id: str, full_name: str) -> dict[int, tuple[int, int]]:
    """``{partition: (committed, end)}`` of a topic for a consumer group (committed 0 where it has none), asked by
    a consumer that names the group and never joins it: the group's members are not disturbed."""
    from kafka import KafkaConsumer, TopicPartition

    try:
        consumer = KafkaConsumer(**kafka_config(settings) | {"group_id": group_id, "enable_auto_commit": False})
    except Exception as exc:
        raise _wrap_errors(settings, "consumer", exc) from None
    try:
        tps = [TopicPartition(full_name, p) for p in sorted(consumer.partitions_for_topic(full_name) or ())]
        ends = consumer.end_offsets(tps)
        return {tp.partition: (consumer.committed(tp) or 0, ends[tp]) for tp in tps}
    finally:
        consumer.close(autocommit=False)


class RecordConsumer:
    """Consume project topics and yield :class:`Received` items, one per record: a host's or an environment's
    batch is read as its records (``keep_host_batches``: a host's batch as the message on the wire).

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
        keep_host_batches: bool = False,
        consumer: Any = None,
        **kafka_overrides: Any,
    ) -> None:
        self.settings = settings
        self.keep_host_batches = keep_host_batches
        self.names = Topics(settings.topic_prefix)
        self.topic_names = [self.names.name(t) for t in topics]
        if consumer is None:
            from kafka import KafkaConsumer

            check_reachable(settings)
            rebalance_ms = int(settings.rebalance_timeout_s * 1000)
            cfg = (
                kafka_config(settings)
                | {
                    "group_id": group,
                    "auto_offset_reset": "earliest" if from_beginning else "latest",
                    "enable_auto_commit": group is not None,
                    "max_poll_interval_ms": max(rebalance_ms, 1000),
                    "session_timeout_ms": max(6000, min(int(settings.request_timeout_s * 1000) - 1000, 10000)),
                    "heartbeat_interval_ms": 1000,
                }
                | kafka_overrides
            )
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
            # kafka-python looks the end up at the first poll, and a record sent before that poll would be skipped:
            # every record sent once the consumer is made is read
            try:
                for tp in parts:
                    consumer.position(tp, timeout_ms=int(self.settings.connect_timeout_s * 1000))
            except Exception as exc:
                raise _wrap_errors(self.settings, "consumer", exc) from None

    def _poll(self, timeout_s: float, max_records: int) -> dict[Any, list[Any]]:
        try:
            batches: dict[Any, list[Any]] = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except Exception as exc:
            raise _wrap_errors(self.settings, "consumer", exc) from None
        return batches

    def poll(self, timeout_s: float = 1.0, max_records: int = 500) -> list[Received]:
        batches = self._poll(timeout_s, max_records)
        out = []
        for _tp, messages in batches.items():
            for m in messages:
                out.extend(
                    decode_messages(self.names, m.topic, m.partition, m.offset, m.timestamp, m.key, m.value, self.keep_host_batches)
                )
        out.sort(key=lambda r: (r.timestamp_ms, r.topic, r.partition, r.offset))
        return out

    def poll_values(self, timeout_s: float = 1.0, max_records: int = 500) -> list[bytes | None]:
        """The next messages' values as they are, not decoded: for a reader that takes a few fields of each and
        validates nothing (``aip bench fleet``'s latency reader, where decoding whole predictions was 40 % of its
        CPU)."""
        return [m.value for messages in self._poll(timeout_s, max_records).values() for m in messages]

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

    def close(self, timeout_s: float | None = None) -> bool:
        """Close the consumer; with ``timeout_s``, wait at most that long and say whether it finished.

        kafka-python's close joins its IO thread without a limit, so one stuck in a request, or
        left inconsistent by an interrupt, would hang the caller.  With ``timeout_s`` the close
        runs in a daemon thread that is abandoned when the time is up (the process may then
        exit: the library's threads are daemons too); a Ctrl-C during it does not interrupt it.
        """
        if timeout_s is None:
            self._consumer.close()
            return True
        closer = threading.Thread(
            target=self._close_quietly, args=(int(timeout_s * 1000),), name="aip-consumer-close", daemon=True
        )
        closer.start()
        closer.join(timeout_s)
        if closer.is_alive():
            log.warning("the Kafka consumer did not close within %g s; leaving it", timeout_s)
            return False
        return True

    def _close_quietly(self, timeout_ms: int) -> None:
        try:
            self._consumer.close(timeout_ms=timeout_ms)
        except Exception:  # closing: nothing is lost, and the caller is on its way out
            log.debug("closing the Kafka consumer failed", exc_info=True)

    def __enter__(self) -> RecordConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""A small typed layer over kafka-python for producers and tools.

Records go out through :class:`RecordProducer` (encoded by ``events``, keyed by
the record's key) and come back through :class:`RecordConsumer` as
:class:`Received` items that carry either a record or the reason it could not
be decoded, so a reader never stops on bad input.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import logging
import secrets
import socket
import ssl
import struct
import threading
import time
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from config import Settings
from events import RecordError, Topics, decode_on_topic, encode, read_records
from events.topics import COMPACTED, OBSERVATIONS
from transport.tls import TlsSettingsError, client_context, handshake_error

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
    if settings.uses_tls:  # the probe's context, so that both mean the same by every setting
        try:
            cfg["ssl_context"] = client_context(settings)
        except TlsSettingsError as exc:
            raise BrokerUnavailable(str(exc)) from None
        cfg["ssl_check_hostname"] = settings.ssl_check_hostname
    return cfg


def check_reachable(settings: Settings, timeout_s: float | None = None) -> None:
    """Raise :class:`BrokerUnavailable` unless some bootstrap server accepts a connection.

    With TLS, the handshake is made here with the clients' own context (:func:`transport.tls.client_context`),
    so an untrusted or expired certificate, a host-name mismatch or a listener without TLS is one
    clear error at once.  With SASL, the probe then authenticates once (:func:`sasl_probe`), so
    wrong credentials are one clear error too: kafka-python itself retries the bootstrap until its
    request timeout and then reports only "Unable to bootstrap".  A client without TLS or SASL
    against a listener that needs them is told so (:func:`plaintext_probe`).
    """
    try:
        context = client_context(settings) if settings.uses_tls else None
    except TlsSettingsError as exc:
        raise BrokerUnavailable(str(exc)) from None
    budget_s = settings.connect_timeout_s if timeout_s is None else timeout_s
    deadline = time.monotonic() + budget_s
    last = ""
    rounds = 0
    while True:
        rounds += 1
        for server in settings.bootstrap_servers:
            host, _, port = server.rpartition(":")
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0) as raw:
                    with contextlib.closing(tls_handshake(settings, context, raw, server) if context else raw) as sock:
                        if settings.uses_sasl:
                            sasl_probe(settings, sock, server)
                        else:
                            plaintext_probe(settings, sock, server)
                    return
            except BrokerUnavailable:  # a definite answer (wrong credentials, TLS refused): no point in retrying
                raise
            except OSError as exc:
                last = f"{server}: {exc.strerror or exc}"
        if time.monotonic() >= deadline:
            raise BrokerUnavailable(
                f"no broker reachable at {settings.broker} ({last}; {rounds} {'try' if rounds == 1 else 'tries'} "
                f"in {budget_s:g} s, AIP_CONNECT_TIMEOUT_S); start one with `aip broker` or set --broker/AIP_BROKER"
            )
        time.sleep(0.2)


# -------------------------------------------------------------------------- TLS probe
TLS_HANDSHAKE_TIMEOUT_S = 5.0  # a TLS listener answers a ClientHello at once; a plaintext one may wait for more bytes


def tls_handshake(settings: Settings, context: ssl.SSLContext, sock: socket.socket, server: str) -> ssl.SSLSocket:
    """The TLS socket over ``sock``, or :class:`BrokerUnavailable` with one line saying why not.

    A verification failure (untrusted CA, expired certificate, host-name mismatch) or a refusal
    by the broker is definite.  When the handshake fails otherwise and the server answers a
    plaintext Kafka request on a new connection, it is a listener without TLS.  A connection
    lost for any other reason is an ``OSError`` (the caller retries until its deadline).
    """
    host, _, port = server.rpartition(":")
    host = host.strip("[]")
    sock.settimeout(min(TLS_HANDSHAKE_TIMEOUT_S, max(settings.connect_timeout_s, 1.0)))
    try:
        return context.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        raise BrokerUnavailable(handshake_error(exc, server, settings)) from None
    except (OSError, ValueError) as exc:
        definite = isinstance(exc, ssl.SSLError) and not isinstance(exc, ssl.SSLEOFError)
        if _answers_plaintext(host, int(port), settings.client_id):
            plain = "SASL_PLAINTEXT" if settings.uses_sasl else "PLAINTEXT"
            raise BrokerUnavailable(
                f"the broker at {server} does not speak TLS (it answers plaintext Kafka requests; the TLS handshake "
                f"failed: {_tls_reason(exc)}): set AIP_SECURITY_PROTOCOL={plain}, or use the broker's TLS listener"
            ) from None
        if definite:
            raise BrokerUnavailable(handshake_error(exc, server, settings)) from None
        raise


def _tls_reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer to the TLS ClientHello"
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    return type(exc).__name__


def _answers_plaintext(host: str, port: int, client_id: str, timeout_s: float = 2.0) -> bool:
    """True when ``host:port`` answers a plaintext ApiVersions request (a listener without TLS)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            _api_versions(sock, client_id)
            return True
    except (OSError, ValueError, struct.error, _Inconclusive):
        return False


def _speaks_tls(server: str, timeout_s: float = 2.0) -> bool:
    """True when ``server`` completes a TLS handshake (nothing verified: this only asks what it speaks)."""
    host, _, port = server.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            context.wrap_socket(sock, server_hostname=host.strip("[]")).close()
            return True
    except (OSError, ValueError):
        return False


def _expects_tls(settings: Settings, server: str) -> BrokerUnavailable | None:
    """The error for a first request the broker dropped: a client without TLS at a TLS listener, or
    a TLS client whose certificate the broker did not accept; None if it is neither."""
    if settings.uses_tls:
        # A TLS listener that drops the connection right after the handshake, before answering
        # ApiVersions, is one that wanted a client certificate it did not get or accept (TLS 1.3
        # sends that verdict after the handshake, and not every server sends the alert).
        have = f"AIP_SSL_CERTFILE={settings.ssl_certfile}" if settings.ssl_certfile else "AIP_SSL_CERTFILE is not set"
        return BrokerUnavailable(
            f"TLS: the broker at {server} closed the connection after the handshake, before any answer: it requires a "
            f"client certificate signed by a CA it trusts ({have}): check AIP_SSL_CERTFILE/AIP_SSL_KEYFILE"
        )
    if not _speaks_tls(server):
        return None
    protocol = "SASL_SSL" if settings.uses_sasl else "SSL (or SASL_SSL)"
    return BrokerUnavailable(
        f"the broker at {server} expects TLS (it dropped a plaintext request and completed a TLS handshake): "
        f"set AIP_SECURITY_PROTOCOL={protocol} and AIP_SSL_CAFILE"
    )


def _tls_refused(settings: Settings, exc: ssl.SSLError, server: str) -> BrokerUnavailable | None:
    """The error for a TLS connection the broker refused after the handshake (TLS 1.3 sends a
    missing or unknown client certificate's alert only then); None for other TLS errors."""
    if "ALERT" not in _tls_reason(exc).upper():
        return None
    return BrokerUnavailable(handshake_error(exc, server, settings))


# -------------------------------------------------------------------------- SASL probe
_SASL_AUTHENTICATION_FAILED = 58
MAX_PROBE_FRAME = 1 << 20  # no answer to the probe's requests is larger
_UNSUPPORTED_SASL_MECHANISM = 33


class _Inconclusive(Exception):
    """The probe could not tell (an old broker, TLS trouble, a dropped connection): let the client try."""


class _NotKafka(_Inconclusive):
    """The server's first answer was not a Kafka response (for example a TLS listener's alert)."""


def _frame(sock: socket.socket, api_key: int, version: int, correlation: int, client_id: str, body: bytes) -> bytes:
    cid = client_id.encode()
    payload = struct.pack(">hhih", api_key, version, correlation, len(cid)) + cid + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    size = struct.unpack(">i", _recv(sock, 4))[0]
    if not 4 <= size <= MAX_PROBE_FRAME:
        raise _Inconclusive(f"a frame of {size} bytes")
    response = _recv(sock, size)
    if struct.unpack(">i", response[:4])[0] != correlation:
        raise _Inconclusive("correlation id mismatch")
    return response[4:]


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise _Inconclusive("connection closed")
        data += chunk
    return data


def _str16(b: bytes, pos: int) -> tuple[str | None, int]:
    n = struct.unpack(">h", b[pos : pos + 2])[0]
    if n < 0:
        return None, pos + 2
    return b[pos + 2 : pos + 2 + n].decode(errors="replace"), pos + 2 + n


def _scram_steps(settings: Settings) -> Generator[bytes, bytes, None]:
    """Client messages of a SCRAM exchange (RFC 5802); ``send`` the server's answers back in."""
    name = "sha256" if settings.sasl_mechanism == "SCRAM-SHA-256" else "sha512"
    user = settings.sasl_username.replace("=", "=3D").replace(",", "=2C")
    nonce = base64.b64encode(secrets.token_bytes(18)).decode()
    first_bare = f"n={user},r={nonce}"
    server_first = (yield f"n,,{first_bare}".encode()).decode()
    attrs = dict(a.split("=", 1) for a in server_first.split(",") if "=" in a)
    if not attrs.get("r", "").startswith(nonce):
        raise _Inconclusive("SCRAM nonce mismatch")
    salted = hashlib.pbkdf2_hmac(name, settings.sasl_password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", name).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    auth_message = f"{first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(hashlib.new(name, client_key).digest(), auth_message, name).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    yield f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def _auth_failed(settings: Settings, server: str) -> BrokerUnavailable:
    return BrokerUnavailable(
        f"authentication failed at {server} ({settings.sasl_mechanism} as user {settings.sasl_username!r}): "
        "check AIP_SASL_USERNAME/AIP_SASL_PASSWORD"
    )


@contextlib.contextmanager
def _inconclusive_is_left_to_the_client(
    settings: Settings, server: str, probe: str, *inconclusive: type[Exception]
) -> Iterator[None]:
    """Around a probe: a TLS listener spoken to in plain text, or a refused TLS handshake, raises
    :class:`BrokerUnavailable` with the reason; any other failure to read the broker (or one of ``inconclusive``)
    is logged at debug and left to the Kafka client."""
    unreadable: tuple[type[Exception], ...] = (OSError, ValueError, IndexError, struct.error, _Inconclusive, *inconclusive)
    try:
        yield
    except BrokerUnavailable:
        raise
    except _NotKafka:
        if (error := _expects_tls(settings, server)) is not None:
            raise error from None
        log.debug("%s of %s inconclusive: not a Kafka answer", probe, server)
    except ssl.SSLError as exc:
        if (error := _tls_refused(settings, exc, server)) is not None:
            raise error from None
        log.debug("%s of %s inconclusive: %s", probe, server, type(exc).__name__)
    except unreadable as exc:
        log.debug("%s of %s inconclusive: %s", probe, server, type(exc).__name__)


def sasl_probe(settings: Settings, sock: socket.socket, server: str, timeout_s: float = 5.0) -> None:
    """Authenticate once on a connected socket (TLS already made where used); raise
    :class:`BrokerUnavailable` on wrong credentials.

    Speaks just enough Kafka for it: ApiVersions v0, SaslHandshake v1, SaslAuthenticate v0/v1
    with PLAIN or SCRAM-SHA-256/512.  Anything it cannot tell (an old broker, a closed
    connection) is left to the Kafka client.  The password is never part of an error.
    """
    with _inconclusive_is_left_to_the_client(settings, server, "SASL probe", KeyError):
        sock.settimeout(timeout_s)
        _probe(settings, sock, server)


def plaintext_probe(settings: Settings, sock: socket.socket, server: str, timeout_s: float = 2.0) -> None:
    """Raise :class:`BrokerUnavailable` when a client without SASL will not get through.

    A broker that answers ApiVersions but closes on a plain Metadata request is a SASL listener
    (Kafka, and ``aip broker --users``); one that drops ApiVersions and speaks TLS is a TLS
    listener.  kafka-python would retry either until its request timeout.  ``sock`` is plain or
    TLS (``AIP_SECURITY_PROTOCOL=SSL``).
    """
    with _inconclusive_is_left_to_the_client(settings, server, "plaintext probe"):
        sock.settimeout(timeout_s)
        versions = _api_versions(sock, settings.client_id)
        lo, hi = versions.get(3, (0, -1))
        version = max(lo, 1)
        if version > min(hi, 8):
            return
        body = struct.pack(">i", 0)  # no topics
        if version >= 4:
            body += b"\0"  # allow_auto_topic_creation
        if version >= 8:
            body += b"\0\0"  # include cluster/topic authorized operations
        try:
            _frame(sock, 3, version, 2, settings.client_id, body)
        except (_Inconclusive, ConnectionResetError) as exc:
            if isinstance(exc, ConnectionResetError) or str(exc) == "connection closed":
                sasl = "SASL_SSL" if settings.uses_tls else "SASL_PLAINTEXT or SASL_SSL"
                raise BrokerUnavailable(
                    f"the broker at {server} requires authentication (it closed the connection on a plain request): "
                    f"set AIP_SECURITY_PROTOCOL={sasl} and AIP_SASL_USERNAME/AIP_SASL_PASSWORD"
                ) from None
            raise


def _api_versions(sock: socket.socket, client_id: str) -> dict[int, tuple[int, int]]:
    """The broker's ApiVersions (v0); :class:`_NotKafka` when the answer is not Kafka at all
    (the connection dropped, or a frame no ApiVersions answer has: a TLS alert, for example)."""
    try:
        body = _frame(sock, 18, 0, 1, client_id, b"")
    except ssl.SSLError:
        raise
    except (_Inconclusive, ConnectionResetError, BrokenPipeError) as exc:
        raise _NotKafka(str(exc)) from None
    error, count = struct.unpack(">hi", body[:6])
    if error:
        raise _Inconclusive(f"ApiVersions error {error}")
    return {k: (lo, hi) for k, lo, hi in (struct.unpack(">hhh", body[6 + 6 * i : 12 + 6 * i]) for i in range(count))}


def _probe(settings: Settings, sock: socket.socket, server: str) -> None:
    cid = settings.client_id
    versions = _api_versions(sock, cid)
    if 17 not in versions or versions[17][1] < 1 or 36 not in versions:
        raise _Inconclusive("no SaslHandshake v1 / SaslAuthenticate")
    mechanism = settings.sasl_mechanism
    body = _frame(sock, 17, 1, 2, cid, struct.pack(">h", len(mechanism)) + mechanism.encode())
    error, n = struct.unpack(">hi", body[:6])
    offered, pos = [], 6
    for _ in range(n):
        m, pos = _str16(body, pos)
        offered.append(m or "")
    if mechanism not in offered and (error == _UNSUPPORTED_SASL_MECHANISM or not error):
        raise BrokerUnavailable(
            f"the broker at {server} does not offer SASL mechanism {mechanism} (it offers: {', '.join(offered) or 'none'}); "
            "check AIP_SASL_MECHANISM"
        )
    if error == _UNSUPPORTED_SASL_MECHANISM:  # and yet it lists it: Tansu on a listener without SASL does this
        raise BrokerUnavailable(
            f"the broker at {server} refused SASL mechanism {mechanism} (UNSUPPORTED_SASL_MECHANISM): check "
            "AIP_SASL_MECHANISM, and AIP_SECURITY_PROTOCOL (a listener without SASL takes SSL or PLAINTEXT)"
        )
    if error:
        raise _Inconclusive(f"SaslHandshake error {error}")
    version = min(1, versions[36][1])
    if mechanism == "PLAIN":
        steps: Any = iter([b"\0" + settings.sasl_username.encode() + b"\0" + settings.sasl_password.encode()])
    else:
        steps = _scram_steps(settings)
    token = next(steps)
    correlation = 3
    while True:
        body = _frame(sock, 36, version, correlation, cid, struct.pack(">i", len(token)) + token)
        correlation += 1
        error = struct.unpack(">h", body[:2])[0]
        if error == _SASL_AUTHENTICATION_FAILED:
            raise _auth_failed(settings, server)
        if error:
            raise _Inconclusive(f"SaslAuthenticate error {error}")
        _message, pos = _str16(body, 2)
        size = struct.unpack(">i", body[pos : pos + 4])[0]
        answer = body[pos + 4 : pos + 4 + max(size, 0)]
        try:
            token = steps.send(answer) if mechanism != "PLAIN" else next(steps)
        except StopIteration:
            return


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
    if base == OBSERVATIONS:  # models are rebuilt from this history (DESIGN.md: State)
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
    keep_batches: bool = False,
) -> list[Received]:
    """:func:`decode_message`, except that a batch (:class:`events.HostMetrics`, :class:`events.HostJobEvents`,
    :class:`events.ObservationBatch`) is read as its records, one :class:`Received` each (all with the batch's
    offset; an invalid one as its own ``error``), so that every reader of a topic sees the producers' default
    record form and the single one alike. ``keep_batches``: a batch stays one :class:`Received`, as on the wire."""
    cls = topics.record_of(topic)
    if keep_batches or cls is None:
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
    batch is read as its records (``keep_batches``: as the message on the wire).

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
        keep_batches: bool = False,
        consumer: Any = None,
        **kafka_overrides: Any,
    ) -> None:
        self.settings = settings
        self.keep_batches = keep_batches
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

    def poll(self, timeout_s: float = 1.0, max_records: int = 500) -> list[Received]:
        try:
            batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except Exception as exc:
            raise _wrap_errors(self.settings, "consumer", exc) from None
        out = []
        for _tp, messages in batches.items():
            for m in messages:
                out.extend(
                    decode_messages(self.names, m.topic, m.partition, m.offset, m.timestamp, m.key, m.value, self.keep_batches)
                )
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

"""Is the broker there, and will it take us?  One clear error before a Kafka client starts.

kafka-python retries a bootstrap it cannot make until its request timeout and then reports only
"Unable to bootstrap"; :func:`check_reachable` asks first and says why not: no broker at the
address, a TLS handshake that failed (and which setting to look at), wrong credentials, a
listener that needs TLS or SASL the client does not use.  The requests it makes are
kafka-python's declarations (:mod:`transport.wire`), and it authenticates with kafka-python's
own SASL mechanisms, so the probe and the client it stands for say the same thing.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from typing import Any

from kafka.net.sasl import get_sasl_mechanism

from config import Settings
from transport import wire
from transport.tls import TlsSettingsError, client_context, handshake_error, tls_reason

log = logging.getLogger(__name__)


class BrokerUnavailable(ConnectionError):
    """The broker could not be reached or refused us; the message says where and why."""


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
        if answers_kafka(host, int(port), settings.client_id):
            plain = "SASL_PLAINTEXT" if settings.uses_sasl else "PLAINTEXT"
            raise BrokerUnavailable(
                f"the broker at {server} does not speak TLS (it answers plaintext Kafka requests; the TLS handshake "
                f"failed: {tls_reason(exc)}): set AIP_SECURITY_PROTOCOL={plain}, or use the broker's TLS listener"
            ) from None
        if definite:
            raise BrokerUnavailable(handshake_error(exc, server, settings)) from None
        raise


def answers_kafka(host: str, port: int, client_id: str = "aip-probe", timeout_s: float = 2.0) -> bool:
    """True when ``host:port`` answers a plaintext ApiVersions request (a Kafka listener without TLS)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            _api_versions(sock, client_id)
            return True
    except (OSError, ValueError, IndexError, struct.error, _Inconclusive):  # what the probes leave to the client
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
    if "ALERT" not in tls_reason(exc).upper():
        return None
    return BrokerUnavailable(handshake_error(exc, server, settings))


# -------------------------------------------------------------------------- SASL probe
MAX_PROBE_FRAME = 1 << 20  # no answer to the probe's requests is larger


class _Inconclusive(Exception):
    """The probe could not tell (an old broker, TLS trouble, a dropped connection): let the client try."""


class _NotKafka(_Inconclusive):
    """The server's first answer was not a Kafka response (for example a TLS listener's alert)."""


def _exchange(sock: socket.socket, request: Any, correlation: int, client_id: str) -> Any:
    """Send ``request`` (a kafka-python message of a set version) and return the broker's decoded answer."""
    sock.sendall(wire.framed(request, correlation, client_id))
    try:
        size = wire.frame_size(_recv(sock, 4), MAX_PROBE_FRAME)
    except wire.FrameError as exc:
        raise _Inconclusive(str(exc)) from None
    answer = request.header.get_response_class().decode(_recv(sock, size), header=True)
    if answer.header.correlation_id != correlation:
        raise _Inconclusive("correlation id mismatch")
    return answer


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise _Inconclusive("connection closed")
        data += chunk
    return data


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
        _authenticate(settings, sock, server)


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
        lo, hi = versions.get(wire.MetadataRequest.API_KEY, (0, -1))
        version = max(lo, 1)
        if version > min(hi, 8):
            return
        try:  # no topics
            _exchange(sock, wire.MetadataRequest[version](topics=[], allow_auto_topic_creation=False), 2, settings.client_id)
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
        answer = _exchange(sock, wire.ApiVersionsRequest[0](), 1, client_id)
    except ssl.SSLError:
        raise
    except (_Inconclusive, ConnectionResetError, BrokenPipeError) as exc:
        raise _NotKafka(str(exc)) from None
    if answer.error_code:
        raise _Inconclusive(f"ApiVersions error {answer.error_code}")
    return {e.api_key: (e.min_version, e.max_version) for e in answer.api_keys}


def _authenticate(settings: Settings, sock: socket.socket, server: str) -> None:
    cid = settings.client_id
    versions = _api_versions(sock, cid)
    handshake_key, authenticate_key = wire.SaslHandshakeRequest.API_KEY, wire.SaslAuthenticateRequest.API_KEY
    if handshake_key not in versions or versions[handshake_key][1] < 1 or authenticate_key not in versions:
        raise _Inconclusive("no SaslHandshake v1 / SaslAuthenticate")
    mechanism = settings.sasl_mechanism
    handshake = _exchange(sock, wire.SaslHandshakeRequest[1](mechanism=mechanism), 2, cid)
    error, offered = handshake.error_code, [m or "" for m in handshake.mechanisms]
    if mechanism not in offered and (error == wire.UNSUPPORTED_SASL_MECHANISM or not error):
        raise BrokerUnavailable(
            f"the broker at {server} does not offer SASL mechanism {mechanism} (it offers: {', '.join(offered) or 'none'}); "
            "check AIP_SASL_MECHANISM"
        )
    if error == wire.UNSUPPORTED_SASL_MECHANISM:  # and yet it lists it: Tansu on a listener without SASL does this
        raise BrokerUnavailable(
            f"the broker at {server} refused SASL mechanism {mechanism} (UNSUPPORTED_SASL_MECHANISM): check "
            "AIP_SASL_MECHANISM, and AIP_SECURITY_PROTOCOL (a listener without SASL takes SSL or PLAINTEXT)"
        )
    if error:
        raise _Inconclusive(f"SaslHandshake error {error}")
    version = min(1, versions[authenticate_key][1])
    client = sasl_client(settings)
    correlation = 3
    while not client.is_done():
        request = wire.SaslAuthenticateRequest[version](auth_bytes=client.auth_bytes())
        answer = _exchange(sock, request, correlation, cid)
        correlation += 1
        if answer.error_code == wire.SASL_AUTHENTICATION_FAILED:
            raise _auth_failed(settings, server)
        if answer.error_code:
            raise _Inconclusive(f"SaslAuthenticate error {answer.error_code}")
        client.receive(bytes(answer.auth_bytes))


def sasl_client(settings: Settings) -> Any:
    """kafka-python's own SASL mechanism for ``settings`` (PLAIN, SCRAM-SHA-256/512): ``auth_bytes()`` to send,
    ``receive(answer)``, ``is_done()``; the same the Kafka client then authenticates with."""
    return get_sasl_mechanism(settings.sasl_mechanism)(
        sasl_mechanism=settings.sasl_mechanism,
        sasl_plain_username=settings.sasl_username,
        sasl_plain_password=settings.sasl_password,
    )

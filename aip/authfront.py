"""A front for the embedded broker: TLS and SASL PLAIN/SCRAM-SHA-256/512 before Kafka.

Tansu 0.6.0 cannot authenticate clients usefully (PLAIN is not offered and SCRAM
users cannot be created on a broker that requires authentication), and its own TLS
does not carry a Kafka client (measured with 0.6.0: ``--cert`` and ``--key`` cannot be
given together, and with a combined PEM a kafka-python SSL client got no record through),
so ``aip broker --users FILE`` and ``aip broker --tls-cert C --tls-key K`` run Tansu on a
private loopback port and this front on the public address.  Per client connection the front

* with a TLS context, makes the TLS handshake first (the standard library's ``ssl``, TLS 1.2
  or newer; optionally requiring a client certificate) and refuses the connection when it
  fails: everything below then runs inside TLS, as ``SASL_SSL`` (or plain ``SSL`` without users);
* forwards ApiVersions to the broker and rewrites the answer so that clients pick
  the SASL versions implemented here (SaslHandshake v1, SaslAuthenticate v0-v1:
  kafka-python 3.0.12 and aiokafka 0.14 both choose v1 of each);
* answers SaslHandshake and SaslAuthenticate itself and checks the credentials
  against the users file (PLAIN with ``hmac.compare_digest``; SCRAM per RFC 5802/7677 by ``scramp``);
* closes the connection on any other request before authentication, on a failed
  authentication (after answering SASL_AUTHENTICATION_FAILED, as Kafka does),
  and on a client that stays unauthenticated for ``auth_timeout_s``;
* after authentication copies bytes in both directions unchanged.

The requests and answers are kafka-python's protocol classes (:mod:`transport.wire`, shared with
the clients' broker probe): no frame is written here by hand.

Without TLS, PLAIN sends the password in the clear: use ``--tls-cert`` beyond this machine.
This front is for local and test use; production runs Apache Kafka with SASL_SSL
(docs/OPERATIONS.md) and the clients speak to both alike.  Passwords are never logged;
the log says who connected, who authenticated and why a connection was refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import secrets
import socket
import ssl
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import scramp

from transport import wire
from transport.tls import tls_reason

log = logging.getLogger("aip.authfront")
log.addHandler(logging.NullHandler())  # `aip broker` adds a stderr handler; libraries and tests stay quiet

# (api key, min version, max version) this front advertises in place of the broker's
SASL_VERSIONS = {wire.SaslHandshakeRequest.API_KEY: (1, 1), wire.SaslAuthenticateRequest.API_KEY: (0, 1)}
MECHANISMS = wire.MECHANISMS
SCRAM_ITERATIONS = 4096
MAX_UNAUTHENTICATED_FRAME = 64 * 1024
MAX_API_VERSIONS_FRAME = 1 << 20  # the broker's answer
FAILED = "Authentication failed: invalid user name or password"
FAILED_AUTH_DELAY_S = 0.1


class UsersFileError(ValueError):
    """The users file cannot be used; the message says where, never what a password is."""


class TlsFileError(ValueError):
    """A certificate or key file of the front cannot be used; the message names the file."""


TLS_HANDSHAKE_TIMEOUT_S = 10.0


def server_context(certfile: str | Path, keyfile: str | Path | None = None, client_cafile: str | Path | None = None) -> ssl.SSLContext:
    """The front's side of TLS: TLS 1.2 or newer, this certificate chain (and key: in ``keyfile``, or
    in ``certfile`` with it), and with ``client_cafile`` a client certificate signed by that CA required."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(certfile), str(keyfile) if keyfile else None)
    except (OSError, ValueError) as exc:
        where = f"{certfile}" + (f" / key {keyfile}" if keyfile else "")
        raise TlsFileError(f"TLS certificate {where}: {tls_reason(exc)}") from None
    if client_cafile:
        try:
            context.load_verify_locations(cafile=str(client_cafile))
        except (OSError, ValueError) as exc:
            raise TlsFileError(f"TLS client CA {client_cafile}: {tls_reason(exc)}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def load_users(path: str | Path) -> dict[str, str]:
    """Users from a file: a JSON object ``{"user": "password"}`` or lines ``user:password``.

    Blank lines and lines starting with ``#`` are skipped; a user name cannot contain ``:``
    (the first ``:`` separates it from the password, which may contain any character).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsersFileError(f"users file {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsersFileError(f"users file {p}: not UTF-8 text") from None
    users: dict[str, str] = {}
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsersFileError(f"users file {p}: invalid JSON at line {exc.lineno}") from None
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise UsersFileError(f"users file {p}: the JSON must be an object of user name to password strings")
        users = dict(data)
    else:
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            user, sep, password = line.strip("\r\n").partition(":")
            user = user.strip()
            if not sep or not user or not password:
                raise UsersFileError(f"users file {p}, line {number}: expected user:password")
            users[user] = password
    if not users:
        raise UsersFileError(f"users file {p}: no users")
    for user in users:
        if not user or "\0" in user or not user.isprintable():
            raise UsersFileError(f"users file {p}: invalid user name {user!r}")
    return users


# ---------------------------------------------------------------------------- ApiVersions
def rewrite_api_versions(version: int, body: bytes) -> bytes:
    """An ApiVersions response body (after the correlation id) with the SASL entries of this front.

    Bodies with an error are returned unchanged (the client retries with a version the broker names).
    """
    answer = wire.ApiVersionsResponse.decode(body, version=version)
    if answer.error_code != wire.NONE:
        return body
    kept = [entry for entry in answer.api_keys if entry.api_key not in SASL_VERSIONS]
    answer.api_keys = kept + [
        wire.ApiVersionsResponse.ApiVersion(api_key=key, min_version=lo, max_version=hi, version=version)
        for key, (lo, hi) in SASL_VERSIONS.items()
    ]
    return bytes(answer.encode())


# ---------------------------------------------------------------------------- SASL
class AuthFailed(Exception):
    """Credentials did not match; the message is safe to send and log."""


class _ScramServer:
    """The server side of one SCRAM exchange (RFC 5802/7677, no channel binding), by scramp."""

    def __init__(
        self, mechanism: str, users: Mapping[str, str], keys: dict[tuple[str, str], tuple[bytes, bytes, bytes, int]]
    ) -> None:
        self.mechanism, self.users, self.keys = mechanism, users, keys  # keys: (mechanism, user) -> scramp's auth info
        self.user = ""
        self._scram = scramp.ScramMechanism(mechanism)
        self._server = self._scram.make_server(self._auth_info)
        self._step = 0

    def _auth_info(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        self.user = user
        cached = self.keys.get((self.mechanism, user))
        if cached is not None:
            return cached
        password = self.users.get(user)
        try:
            if password is not None:
                info: tuple[bytes, bytes, bytes, int] = self._scram.make_auth_info(password, SCRAM_ITERATIONS)
                self.keys[(self.mechanism, user)] = info
                return info
        except scramp.ScramException:  # a password SASLprep refuses: no SCRAM for it
            pass
        # unknown user: a random key, so the exchange fails at the proof like a wrong password
        unknown: tuple[bytes, bytes, bytes, int] = self._scram.make_auth_info(secrets.token_hex(16), SCRAM_ITERATIONS)
        return unknown

    def respond(self, token: bytes) -> tuple[bytes, bool]:
        """The server's answer to ``token`` and whether the exchange is complete; raises :class:`AuthFailed`."""
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthFailed("Authentication failed: invalid SCRAM message") from None
        self._step += 1
        if self._step == 1:
            try:
                self._server.set_client_first(text)
                return self._server.get_server_first().encode(), False
            except scramp.ScramException:
                raise AuthFailed("Authentication failed: invalid SCRAM client-first message") from None
        if self._step == 2:
            try:
                self._server.set_client_final(text)
                return self._server.get_server_final().encode(), True
            except scramp.ScramException:
                raise AuthFailed(FAILED) from None
        raise AuthFailed("Authentication failed: unexpected SCRAM message")


def check_plain(users: Mapping[str, str], token: bytes) -> str:
    """The user name of a valid PLAIN token (``authzid NUL user NUL password``); raises :class:`AuthFailed`."""
    parts = token.split(b"\0")
    if len(parts) != 3:
        raise AuthFailed("Authentication failed: invalid PLAIN token")
    _authzid, user_b, password_b = parts
    user = user_b.decode("utf-8", errors="replace")
    expected = users.get(user)
    # compare against something of the same kind even for an unknown user, so timing says nothing
    ok = hmac.compare_digest(password_b, (expected if expected is not None else "\0" * 16).encode())
    if expected is None or not ok:
        raise AuthFailed(FAILED)
    return user


# ---------------------------------------------------------------------------- the front
@dataclass
class FrontStats:
    connections: int = 0
    authenticated: int = 0
    refused: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def refuse(self, reason: str) -> None:
        self.refused += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "connections": self.connections,
            "authenticated": self.authenticated,
            "refused": self.refused,
            "refused_by_reason": dict(self.reasons),
        }


class _Refused(Exception):
    """Close this connection; ``reason`` is counted and logged."""


class _Counted(Exception):
    """Close this connection; the refusal was already counted and logged."""


class AuthFront:
    """Listen on ``host:port``; per client, TLS (with ``ssl_context``) and SASL (with ``users``),
    then pipe it to ``backend_host:backend_port``.

    Runs its own event loop in a daemon thread: :meth:`start` returns once it listens.
    """

    def __init__(
        self,
        host: str,
        port: int,
        backend_host: str,
        backend_port: int,
        users: Mapping[str, str] | None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        auth_timeout_s: float = 30.0,
        tls_handshake_timeout_s: float = TLS_HANDSHAKE_TIMEOUT_S,
    ) -> None:
        if not users and ssl_context is None:
            raise ValueError("the front needs users (SASL), a TLS context, or both")
        self.host, self.port = host, port
        self.backend = (backend_host, backend_port)
        self._users = dict(users or {})
        self._ssl = ssl_context
        self.tls_handshake_timeout_s = tls_handshake_timeout_s
        self._scram_keys: dict[tuple[str, str], tuple[bytes, bytes, bytes, int]] = {}
        self.auth_timeout_s = auth_timeout_s
        self.stats = FrontStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def __repr__(self) -> str:  # never show the users
        tls = "TLS, " if self._ssl is not None else ""
        return f"AuthFront({self.host}:{self.port} -> {self.backend[0]}:{self.backend[1]}, {tls}{len(self._users)} users)"

    @property
    def security_protocol(self) -> str:
        """What clients set as AIP_SECURITY_PROTOCOL for this front."""
        return ("SASL_" if self._users else "") + ("SSL" if self._ssl is not None else "PLAINTEXT")

    # ------------------------------------------------------------ lifecycle
    def start(self) -> AuthFront:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                family = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
                self._listener = socket.create_server((self.host, self.port), family=family, backlog=128)
                self._listener.setblocking(False)
                self._accepting = loop.create_task(self._accept(self._listener))
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._shutdown())
                loop.close()

        self._thread = threading.Thread(target=run, name=f"aip-authfront-{self.port}", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise OSError(f"the authenticating front cannot listen on {self.host}:{self.port}: {failure[0]}")
        tls = "TLS 1.2+" + (", client certificates required" if self._ssl and self._ssl.verify_mode == ssl.CERT_REQUIRED else "")
        log.info(
            "front on %s:%s (%s; %s)",
            self.host,
            self.port,
            tls if self._ssl is not None else "no TLS",
            f"SASL {'/'.join(MECHANISMS)}, {len(self._users)} users" if self._users else "no SASL",
        )
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        loop, thread = self._loop, self._thread
        self._thread = None
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):  # loop already closed
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)

    async def _shutdown(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(BaseException):
                await self._accepting
        if self._listener is not None:
            self._listener.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def __enter__(self) -> AuthFront:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ connections
    async def _accept(self, listener: socket.socket) -> None:
        """Accept connections; each gets a task (TLS handshake, then :meth:`_client`).

        The handshake is made by ``loop.connect_accepted_socket`` so that a failed one reaches
        this code (asyncio's server only logs it at debug level) and is counted and logged."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _addr = await loop.sock_accept(listener)
            except OSError as exc:  # out of descriptors, for example: the listener stays
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._connection(sock))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connection(self, sock: socket.socket) -> None:
        try:
            peer = sock.getpeername()
        except OSError:  # gone already
            sock.close()
            return
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.stats.connections += 1
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**16)
        try:
            transport, protocol = await loop.connect_accepted_socket(
                lambda: asyncio.StreamReaderProtocol(reader),
                sock,
                ssl=self._ssl,
                ssl_handshake_timeout=self.tls_handshake_timeout_s if self._ssl is not None else None,
            )
        except asyncio.CancelledError:
            sock.close()
            raise
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError; a handshake timeout a ConnectionAbortedError
            sock.close()
            reason = f"TLS handshake failed ({tls_reason(exc)})"
            self.stats.refuse(reason)
            log.warning("%s refused: %s", where, reason)
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        await self._client(reader, writer, where)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: str) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            if self._users:
                try:
                    upstream, user = await asyncio.wait_for(self._authenticate(reader, writer, where), self.auth_timeout_s)
                except TimeoutError:
                    raise _Refused("not authenticated in time") from None
                self.stats.authenticated += 1
                log.info("%s authenticated as %s", where, user)
            else:  # TLS only: the client is through once the handshake is
                upstream = await self._connect_upstream()
                log.info("%s connected (TLS)", where)
            up_reader, up_writer = upstream
            await self._pipe(reader, writer, up_reader, up_writer)
        except _Refused as exc:
            self.stats.refuse(str(exc))
            log.warning("%s refused: %s", where, exc)
        except _Counted:
            pass
        except (OSError, asyncio.IncompleteReadError, ValueError, struct.error) as exc:  # a frame kafka-python cannot read
            log.debug("%s closed: %s", where, type(exc).__name__)
        except asyncio.CancelledError:  # the front is stopping; asyncio's server callback would report a cancelled task
            pass
        finally:
            if upstream is not None:
                upstream[1].close()
            writer.close()

    async def _connect_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_connection(*self.backend)
        except OSError:
            raise _Refused("the broker behind the front is not reachable") from None

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: str
    ) -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], str]:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        mechanism: str | None = None
        scram: _ScramServer | None = None
        try:
            while True:
                try:
                    size = wire.frame_size(await reader.readexactly(4), MAX_UNAUTHENTICATED_FRAME, least=8)
                except wire.FrameError as exc:
                    raise _Refused(f"{exc} before authentication") from None
                frame = await reader.readexactly(size)
                header = wire.request_header(frame)
                api_key, version, correlation = header.request_api_key, header.request_api_version, header.correlation_id
                if api_key == wire.ApiVersionsRequest.API_KEY:
                    if upstream is None:
                        upstream = await self._connect_upstream()
                    await _api_versions(writer, upstream, version, correlation, frame)
                    continue
                if api_key not in SASL_VERSIONS:
                    raise _Refused(f"request (api key {api_key}) before authentication; the client must use SASL")
                lo, hi = SASL_VERSIONS[api_key]
                if not lo <= version <= hi:
                    raise _Refused(f"unsupported version {version} of api key {api_key}")
                if api_key == wire.SaslHandshakeRequest.API_KEY:
                    requested = wire.SaslHandshakeRequest.decode(frame, version=version, header=True).mechanism or ""
                    if requested in MECHANISMS and mechanism is None:
                        mechanism = requested
                        error = wire.NONE
                    else:
                        error = wire.UNSUPPORTED_SASL_MECHANISM if mechanism is None else wire.ILLEGAL_SASL_STATE
                    handshake = wire.SaslHandshakeResponse(version=version, error_code=error, mechanisms=list(MECHANISMS))
                    await _send(writer, wire.framed(handshake, correlation))
                    if error != wire.NONE:
                        raise _Refused(f"SASL mechanism {requested!r} is not offered")
                    if requested.startswith("SCRAM-"):
                        scram = _ScramServer(requested, self._users, self._scram_keys)
                    continue
                token = bytes(wire.SaslAuthenticateRequest.decode(frame, version=version, header=True).auth_bytes)
                if mechanism is None:
                    await _auth_response(writer, version, correlation, wire.ILLEGAL_SASL_STATE, "SaslHandshake first")
                    raise _Refused("SaslAuthenticate before SaslHandshake")
                try:
                    if scram is not None:
                        answer, done = scram.respond(token)
                        user = scram.user
                    else:
                        user, answer, done = check_plain(self._users, token), b"", True
                except AuthFailed as exc:
                    self.stats.refuse(reason := f"authentication failed ({mechanism})")  # counted before the client hears
                    log.warning("%s refused: %s", where, reason)
                    await _auth_response(writer, version, correlation, wire.SASL_AUTHENTICATION_FAILED, str(exc))
                    # like Kafka's connection.failed.authentication.delay.ms: let the client read the
                    # answer before the close, and slow down guessing
                    await asyncio.sleep(FAILED_AUTH_DELAY_S)
                    raise _Counted from None
                await _auth_response(writer, version, correlation, wire.NONE, None, answer)
                if done:
                    if upstream is None:
                        upstream = await self._connect_upstream()
                    return upstream, user
        except BaseException:
            if upstream is not None:
                upstream[1].close()
            raise

    @staticmethod
    async def _pipe(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(256 * 1024):
                    dst.write(data)
                    await dst.drain()
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        tasks = [asyncio.ensure_future(copy(reader, up_writer)), asyncio.ensure_future(copy(up_reader, writer))]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


async def _api_versions(
    writer: asyncio.StreamWriter,
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    version: int,
    correlation: int,
    frame: bytes,
) -> None:
    """Answer ApiVersions with the broker's answer and this front's SASL versions.

    A version newer than kafka-python's protocol classes know is answered here with
    UNSUPPORTED_VERSION and the versions this front reads, as Kafka does: the client asks again."""
    newest = wire.ApiVersionsResponse.max_version
    if version > newest:
        ours = wire.ApiVersionsResponse.ApiVersion(
            api_key=wire.ApiVersionsRequest.API_KEY, min_version=0, max_version=newest, version=0
        )
        answer = wire.ApiVersionsResponse(version=0, error_code=wire.UNSUPPORTED_VERSION, api_keys=[ours])
        await _send(writer, wire.framed(answer, correlation))
        return
    await _send(upstream[1], len(frame).to_bytes(4, "big") + frame)
    response = await upstream[0].readexactly(wire.frame_size(await upstream[0].readexactly(4), MAX_API_VERSIONS_FRAME))
    body = rewrite_api_versions(version, response[4:])
    await _send(writer, (4 + len(body)).to_bytes(4, "big") + response[:4] + body)


async def _auth_response(
    writer: asyncio.StreamWriter, version: int, correlation: int, error: int, message: str | None, auth: bytes = b""
) -> None:
    """A SaslAuthenticate answer (v1 and later say a session lifetime of 0: no re-authentication)."""
    answer = wire.SaslAuthenticateResponse(
        version=version, error_code=error, error_message=message, auth_bytes=auth, session_lifetime_ms=0
    )
    await _send(writer, wire.framed(answer, correlation))

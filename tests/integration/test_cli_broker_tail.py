"""`aip broker` and `aip tail` as a user runs them: real processes, real signals."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import children, exited, wait_for
from records import job_event, sample

from aip.broker import free_port
from transport import RecordProducer, ensure_project_topics

pytestmark = pytest.mark.integration
AIP = [sys.executable, "-m", "aip.cli"]


def _start_broker(port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([*AIP, "broker", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert f"127.0.0.1:{port}" in line, line
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_broker_stops_cleanly_and_leaves_no_process(sig: signal.Signals) -> None:
    proc = _start_broker(free_port())
    tansu = wait_for(lambda: children(proc.pid), timeout_s=5, what="the tansu child")
    proc.send_signal(sig)
    assert proc.wait(timeout=10) == 0
    for child in tansu:
        wait_for(lambda child=child: exited(child), timeout_s=5, what="tansu to exit")


def test_broker_child_dies_with_a_killed_parent() -> None:
    proc = _start_broker(free_port())
    tansu = wait_for(lambda: children(proc.pid), timeout_s=5, what="the tansu child")
    proc.kill()
    proc.wait(timeout=5)
    for child in tansu:
        wait_for(lambda child=child: exited(child), timeout_s=5, what="orphaned tansu to exit")


def test_broker_on_a_port_in_use_is_one_line_exit_2(broker) -> None:
    result = subprocess.run([*AIP, "broker", "--port", str(broker.port)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "already in use" in result.stderr and "Traceback" not in result.stderr


def test_tail_against_nothing_is_one_line_and_keeps_to_its_connect_timeout() -> None:
    # With a connect timeout of 0 the command tries each bootstrap server once and gives up; one that
    # ignored the setting would retry for its 10 s default (about 50 tries) and say so.  The message
    # reports the tries it made, so this needs no clock.
    env = dict(os.environ, AIP_CONNECT_TIMEOUT_S="0")
    result = subprocess.run(
        [*AIP, "tail", "gpu.metrics", "--broker", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().count("\n") == 0 and "no broker reachable" in result.stderr
    assert "1 try in 0 s, AIP_CONNECT_TIMEOUT_S" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_tail_follow_ctrl_c_while_connecting_exits_0() -> None:
    # A server that accepts and never answers: the command is then past its imports and inside its
    # connection check (the moment a Ctrl-C used to surface as exit 130).
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        env = dict(os.environ, AIP_CONNECT_TIMEOUT_S="60")
        with _tail("gpu.metrics", "--follow", "--broker", f"127.0.0.1:{port}", env=env) as proc:
            server.settimeout(60)
            conn, _ = server.accept()
            with conn:
                out, err = _ctrl_c(proc)
    assert proc.returncode == 0, err
    assert out == "" and "Traceback" not in err, err


def test_tail_prints_records_and_undecodable_ones_and_keeps_going(settings) -> None:
    ensure_project_topics(settings)
    with RecordProducer(settings) as producer:
        producer.send("jobs.lifecycle", job_event("started", job_id="a"))
        producer.send_raw("jobs.lifecycle", b'{"kind": "started"}', key=b"GPU-0000")
        producer.send_raw("jobs.lifecycle", b"\xff\xfe garbage", key=b"GPU-0000")
        producer.send("jobs.lifecycle", job_event("finished", job_id="a", exit_code=0))
        producer.flush()
    base = [*AIP, "tail", "jobs.lifecycle", "--broker", settings.broker, "--topic-prefix", settings.topic_prefix]
    text = subprocess.run(base, capture_output=True, text=True, timeout=60)
    lines = text.stdout.strip().splitlines()
    assert len(lines) == 4, text.stdout + text.stderr
    assert "started" in lines[0] and "finished" in lines[3]
    assert lines[1].startswith("UNDECODABLE") and "missing required field `ts`" in lines[1]
    assert lines[2].startswith("UNDECODABLE") and "not valid JSON" in lines[2]
    as_json = subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=60)
    objs = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [o.get("kind") for o in objs] == ["started", None, None, "finished"]
    assert "_error" in objs[1] and objs[0]["_topic"] == "jobs.lifecycle"


def test_tail_follow_prints_new_records_until_ctrl_c(settings) -> None:
    ensure_project_topics(settings)
    with _tail("gpu.metrics", "--follow", "--broker", settings.broker, "--topic-prefix", settings.topic_prefix) as proc:
        with RecordProducer(settings) as producer:
            seq = 0

            def printed() -> bool:
                nonlocal seq
                producer.send("gpu.metrics", sample(seq=seq))
                producer.flush()
                seq += 1
                return proc.poll() is not None or _readable(proc)

            wait_for(printed, timeout_s=30, interval_s=0.3, what="tail to print a record")
        out, err = _ctrl_c(proc)
    assert proc.returncode == 0, err
    assert "seq=" in out and "Traceback" not in err


@contextlib.contextmanager
def _tail(*args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """``aip tail *args`` running, its output in pipes; killed on the way out if it is still running."""
    proc = subprocess.Popen([*AIP, "tail", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()


def _ctrl_c(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """A Ctrl-C to ``proc``: its stdout and stderr once it has exited."""
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=15)


def _readable(proc: subprocess.Popen[str]) -> bool:
    import select

    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 0)
    return bool(ready)

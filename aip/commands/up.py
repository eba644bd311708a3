"""``aip up``: broker (unless --broker), producer, stream worker and live view on one machine.

With ``--duration S`` everything stops cleanly after S seconds and the last
line printed is a JSON summary: counts per output topic, the selected model per
environment and category, and errors.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from aip.common import add_kafka_args, broker_errors, settings_from, sigterm_as_interrupt
from aip.errors import CliError
from aip.view import OUTPUT_TOPICS, LiveState
from events import Topics


def register(sub: Any) -> None:
    p = sub.add_parser("up", help="run everything on this machine: broker, producer, worker, live view")
    p.add_argument("--duration", type=float, help="stop after this many seconds and print a JSON summary")
    p.add_argument("--gpus", type=int, default=8, help="simulated GPUs (default 8)")
    p.add_argument("--source", default="sim", help="sim (default), nvml, or replay:PATH (JSON lines from `aip tail --json`)")
    p.add_argument("--speedup", type=float, default=10.0, help="simulated or replayed seconds per wall-clock second (default 10)")
    p.add_argument("--gpu-model", default="v100", help="simulated GPU model (default v100)")
    p.add_argument("--seed", type=int, default=0, help="simulator seed")
    p.add_argument("--no-view", action="store_true", help="no live view (also off when stdout is not a terminal)")
    add_kafka_args(p)
    p.set_defaults(func=run)


class Producer(threading.Thread):
    """Publishes the simulator's or a recording's events paced at ``speedup`` x event time."""

    def __init__(self, settings: Any, events: Any, speedup: float, stop: threading.Event) -> None:
        super().__init__(name="aip-up-producer", daemon=True)
        self.settings = settings
        self.events = events
        self.speedup = speedup
        self.stop_event = stop
        self.sent = 0
        self.error: str | None = None

    def run(self) -> None:
        from producers.pacing import paced
        from transport import RecordProducer

        try:
            with RecordProducer(self.settings) as producer:
                for topic, record in paced(self.events, self.speedup, sleep=self.stop_event.wait):
                    if self.stop_event.is_set():
                        break
                    producer.send(topic, record)
                    self.sent += 1
                producer.flush(10)
        except Exception as exc:
            self.error = f"producer: {type(exc).__name__}: {exc}"


def _source_events(args: argparse.Namespace, duration: float | None) -> tuple[Any, list[str]]:
    """(iterable of (topic_base, record), command of an external producer)."""
    if args.source == "sim":
        from producers.sim import Simulator

        sim_s = (duration or 24 * 3600.0) * args.speedup
        return Simulator(args.gpus, gpu_model=args.gpu_model, seed=args.seed, start_ts=time.time(), duration_s=sim_s).events(), []
    if args.source.startswith("replay:"):
        return _replay(Path(args.source.partition(":")[2])), []
    if args.source == "nvml":
        return None, ["produce", "nvml"]
    raise CliError(f"unknown --source {args.source!r}: use sim, nvml or replay:PATH")


def _replay(path: Path) -> Any:
    from events import RECORD_OF, RecordError, decode_obj
    from events.topics import LIFECYCLE, METRICS

    if not path.exists():
        raise CliError(f"replay file {path} does not exist")
    rows = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            obj = json.loads(line)
            topic = obj.pop("_topic", None)
            if topic not in (METRICS, LIFECYCLE):
                continue
            with contextlib.suppress(RecordError):
                rows.append((topic, decode_obj(RECORD_OF[topic], obj)))
    rows.sort(key=lambda r: r[1].ts)
    return iter(rows)


def broker_port(in_use: Any = None) -> int:
    """The embedded broker's port: 19092 (where every other command looks by default) when free, else a free one.

    >>> broker_port(in_use=lambda host, port: False)
    19092
    >>> broker_port(in_use=lambda host, port: True) != 19092
    True
    """
    from aip.broker import free_port, port_in_use
    from config import EMBEDDED_HOST, EMBEDDED_PORT

    return free_port() if (in_use or port_in_use)(EMBEDDED_HOST, EMBEDDED_PORT) else EMBEDDED_PORT


def _start_broker(workdir: Path) -> Any:
    from aip.broker import BrokerError, EmbeddedBroker, free_port

    try:
        return EmbeddedBroker(port=broker_port(), log_path=str(workdir / "broker.log")).start()
    except BrokerError:  # 19092 taken between the check and the start: any free port
        try:
            return EmbeddedBroker(port=free_port(), log_path=str(workdir / "broker.log")).start()
        except BrokerError as exc:
            raise CliError(str(exc), code=1) from None


def _say_broker(address: str) -> None:
    from config import EMBEDDED_HOST, EMBEDDED_PORT

    if address == f"{EMBEDDED_HOST}:{EMBEDDED_PORT}":
        where = "embedded; other commands find it by default, e.g. `aip tail interference.predictions` in another shell"
    else:
        where = f"embedded; {EMBEDDED_PORT} was taken, so in other shells pass --broker {address} or set AIP_BROKER={address}"
    print(f"aip up: broker at {address} ({where})", file=sys.stderr, flush=True)


def _aip(*argv: str) -> list[str]:
    return [sys.executable, "-m", "aip.cli", *argv]


def run(args: argparse.Namespace) -> int:
    from aip.broker import free_port, port_in_use
    from config.process import die_with_parent
    from transport import RecordConsumer, ensure_project_topics

    settings = settings_from(args)
    errors: list[str] = []
    broker = None
    workdir = Path(tempfile.mkdtemp(prefix="aip-up-"))
    if not args.broker and not os.environ.get("AIP_BROKER"):
        broker = _start_broker(workdir)
        settings = settings.replace(broker=broker.address)
        _say_broker(settings.broker)
    topics = Topics(settings.topic_prefix)
    worker = external = None
    stop = threading.Event()
    producer = None
    state = LiveState(topics)
    started = time.monotonic()
    try:
        with broker_errors(), sigterm_as_interrupt():
            ensure_project_topics(settings)
            kafka_args = ["--broker", settings.broker, "--topic-prefix", settings.topic_prefix]
            worker_log = open(workdir / "worker.log", "wb")
            env = dict(os.environ, AIP_STATE_DIR=settings.state_dir or str(workdir / "state"))
            web_port = settings.web_port if not port_in_use("127.0.0.1", settings.web_port) else free_port()
            print(
                f"aip up: worker at http://127.0.0.1:{web_port} (/metrics, /leaderboard, /predictions/GPU_UUID)",
                file=sys.stderr,
                flush=True,
            )
            worker = subprocess.Popen(
                _aip("worker", "--no-create-topics", "--web-port", str(web_port), *kafka_args),
                stdin=subprocess.DEVNULL,
                preexec_fn=functools.partial(die_with_parent, os.getpid()),
                stdout=worker_log,
                stderr=subprocess.STDOUT,
                env=env,
            )
            events, command = _source_events(args, args.duration)
            if command:
                external = subprocess.Popen(
                    _aip(*command, *kafka_args),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    preexec_fn=functools.partial(die_with_parent, os.getpid()),
                )
            else:
                producer = Producer(settings, events, args.speedup, stop)
                producer.start()
            consumer = RecordConsumer(settings, OUTPUT_TOPICS, from_beginning=True)
            try:
                _follow(consumer, state, args, started, worker, external, errors)
            finally:
                stop.set()
                _stop(external, "producer", errors)
                if producer is not None:
                    producer.join(15)
                _stop(worker, "worker", errors)
                for item in consumer.poll(timeout_s=1.0):  # what the worker published while stopping
                    state.add(item)
                consumer.close()
    except KeyboardInterrupt:
        if args.duration is None:
            return 0
        errors.append("interrupted")
    finally:
        stop.set()
        if broker is not None:
            broker.stop()
    if producer is not None and producer.error:
        errors.append(producer.error)
    if worker is not None and worker.returncode not in (0, None, -15, 130):
        errors.append(f"worker exited with {worker.returncode}: {_tail(workdir / 'worker.log')}")
    summary = {
        **state.summary(),
        "errors": errors,
        "produced": producer.sent if producer is not None else None,
        "source": args.source,
        "gpus": args.gpus if args.source == "sim" else None,
        "duration_s": round(time.monotonic() - started, 1),
    }
    if not errors:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        summary["logs"] = str(workdir)
    print(json.dumps(summary), flush=True)
    return 0 if not errors else 1


def _follow(
    consumer: Any, state: LiveState, args: argparse.Namespace, started: float, worker: Any, external: Any, errors: list[str]
) -> None:
    live = None
    if not args.no_view and sys.stdout.isatty():
        from rich.live import Live

        live = Live(state.render(), refresh_per_second=2, transient=False)
        live.start()
    last_line = 0.0
    try:
        while args.duration is None or time.monotonic() - started < args.duration:
            for item in consumer.poll(timeout_s=0.5):
                state.add(item)
            if worker.poll() is not None:
                errors.append(f"worker stopped early with code {worker.returncode}")
                return
            if external is not None and external.poll() not in (None, 0):
                err = (external.stderr.read() or b"").decode(errors="replace").strip().splitlines()
                errors.append(f"producer exited with {external.returncode}: {err[-1] if err else ''}")
                return
            if live is not None:
                live.update(state.render())
            elif not args.no_view and time.monotonic() - last_line > 10:
                last_line = time.monotonic()
                print(
                    f"[aip up {last_line - started:5.0f}s] " + "  ".join(f"{k}={v}" for k, v in state.counts.items()),
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if live is not None:
            live.update(state.render())
            live.stop()


STOP_TIMEOUT_S = 60.0
"""How long a child has to stop cleanly after SIGTERM (a worker commits, saves its models and leaves its group:
seconds on a quiet machine, over 20 s measured at load 11 on 2 cores)."""


def _stop(proc: Any, what: str, errors: list[str]) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        errors.append(f"{what} did not stop within {STOP_TIMEOUT_S:g} s; killed")
        proc.kill()
        proc.wait(5)


def _tail(path: Path, n: int = 400) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-n:].strip().replace("\n", " | ")
    return ""

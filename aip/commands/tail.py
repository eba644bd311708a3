"""``aip tail TOPIC``: decode a topic and print its records."""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from aip.common import add_kafka_args, broker_errors, settings_from
from aip.errors import CliError
from aip.render import fmt_ts, render, served_text
from events import RECORD_OF, Topics, to_dict

POLL_S = 0.5  # one poll's wait; a Ctrl-C is seen after at most this long
CLOSE_TIMEOUT_S = 3.0  # a consumer still closing after this long is left behind (its threads are daemons)
EXIT_WITHIN_S = 10.0  # after a Ctrl-C or SIGTERM the command is gone within this long, whatever kafka-python does


def _exit_within(seconds: float) -> None:
    """Arm a watchdog (once): if the process is still here ``seconds`` from now, flush stdout and exit 0.  A Ctrl-C
    may land while kafka-python connects, in a call that then waits on its network thread for a broker that never
    answers; nothing has been printed yet, and nothing needs closing more than the command needs ending."""
    if getattr(_exit_within, "armed", False):
        return
    _exit_within.armed = True  # type: ignore[attr-defined]

    def leave() -> None:
        sys.stdout.flush()
        os._exit(0)

    timer = threading.Timer(seconds, leave)
    timer.daemon = True
    timer.start()


@contextlib.contextmanager
def _interrupt_while_connecting() -> Iterator[None]:
    """Until the consumer runs, Ctrl-C and SIGTERM raise KeyboardInterrupt and arm :func:`_exit_within`."""

    def handler(signum: int, frame: Any) -> None:
        _exit_within(EXIT_WITHIN_S)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, was in previous.items():
            signal.signal(sig, was)


def register(sub: Any) -> None:
    p = sub.add_parser("tail", help="decode and print a topic")
    p.add_argument("topic", help=f"one of: {', '.join(RECORD_OF)}")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new records until Ctrl-C or SIGTERM (then exit 0)")
    p.add_argument(
        "--from-beginning", action="store_true", help="with --follow, start at the oldest record (default: new records only)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line (the format `aip produce replay` reads)")
    p.add_argument("--table", action="store_true", help="aligned columns with a header (readable; not with --json)")
    p.add_argument("--gpu", help="only records of this GPU UUID (prefix match)")
    p.add_argument("--job", help="only records of this job id")
    p.add_argument(
        "--kind", help="only records of this kind or state (started, progress, finished, raised, cleared, observed, placement)"
    )
    p.add_argument("--limit", type=int, help="stop after this many records")
    p.add_argument("--timeout", type=float, default=2.0, help="without --follow, stop when nothing new arrives for this long (s)")
    add_kafka_args(p)
    p.set_defaults(func=run)


def matches(record: Any, args: argparse.Namespace) -> bool:
    if args.gpu and not str(getattr(record, "gpu_uuid", "")).startswith(args.gpu):
        return False
    if args.job and getattr(record, "job_id", None) != args.job:
        return False
    if args.kind:
        kinds = {getattr(record, "kind", None), getattr(record, "state", None), getattr(record, "mode", None)}
        if args.kind not in kinds:
            return False
    return True


def line_for(item: Any, topics: Topics, as_json: bool) -> str:
    base = topics.base(item.topic)
    if item.error is not None:
        if as_json:
            return json.dumps(
                {
                    "_topic": base,
                    "_partition": item.partition,
                    "_offset": item.offset,
                    "_error": item.error,
                    "_payload_b64": base64.b64encode(item.value or b"").decode(),
                }
            )
        preview = (item.value or b"")[:80].decode("utf-8", "replace")
        return f"UNDECODABLE {base} p{item.partition}@{item.offset}: {item.error} | {preview!r}"
    if as_json:
        return json.dumps({"_topic": base, **to_dict(item.record)}, allow_nan=False)
    return render(item.record)


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# (header, width, cell) per record type; the last column is not padded.
_COLUMNS: dict[str, list[tuple[str, int, Any]]] = {
    "MetricSample": [
        ("time", 12, lambda r: fmt_ts(r.ts)), ("gpu", 16, lambda r: r.gpu_uuid), ("model", 8, lambda r: r.gpu_model),
        ("power_w", 8, lambda r: _f(r.power_w)), ("temp_c", 7, lambda r: _f(r.temp_c, 0)),
        ("sm_%", 6, lambda r: _f(r.sm_util_pct, 0)), ("mem_%", 6, lambda r: _f(r.mem_util_pct, 0)),
        ("mem_mb", 8, lambda r: _f(r.mem_used_mb, 0)), ("rx_kbps", 9, lambda r: _f(r.pcie_rx_kbps, 0)),
        ("tx_kbps", 9, lambda r: _f(r.pcie_tx_kbps, 0)),
    ],
    "JobEvent": [
        ("time", 12, lambda r: fmt_ts(r.ts)), ("kind", 9, lambda r: r.kind), ("job", 18, lambda r: r.job_id),
        ("gpu", 16, lambda r: r.gpu_uuid), ("steps", 8, lambda r: "-" if r.steps is None else str(r.steps)),
        ("step_time_s", 11, lambda r: _f(r.step_time_s, 4)), ("type", 30, lambda r: r.job_type),
    ],
    "Observation": [
        ("window_end", 12, lambda r: fmt_ts(r.window_end)), ("gpu", 16, lambda r: r.gpu_uuid), ("job", 18, lambda r: r.job_id),
        ("interf_%", 9, lambda r: _f(r.interference_pct)),
        *[(f"{p}_%", 7, lambda r, p=p: _f(r.pct(p))) for p in "ETSVRW"],
        ("job set", 40, lambda r: " + ".join([r.job_type, *r.co_job_types])),
    ],
    "Prediction": [
        ("time", 12, lambda r: fmt_ts(r.ts)), ("gpu", 16, lambda r: r.gpu_uuid), ("job", 18, lambda r: r.job_id),
        ("mode", 9, lambda r: r.mode), ("pred_%", 7, lambda r: _f(r.interference_pct)), ("meas_%", 7, lambda r: _f(r.measured_pct)),
        ("err_%", 6, lambda r: _f(r.expected_error_pct)), ("model", 14, lambda r: f"{r.model}/{r.category}"),
        ("regime", 6, lambda r: r.regime or "-"),
        ("what-if", 6, lambda r: str(len(r.what_if))), ("type", 30, lambda r: r.job_type),
    ],
    "Alert": [
        ("time", 12, lambda r: fmt_ts(r.ts)), ("state", 7, lambda r: r.state), ("gpu", 16, lambda r: r.gpu_uuid),
        ("job", 18, lambda r: r.job_id), ("interf_%", 9, lambda r: _f(r.interference_pct)),
        ("thresh_%", 9, lambda r: _f(r.threshold)), ("source", 9, lambda r: r.source), ("type", 30, lambda r: r.job_type or "-"),
    ],
    "Leaderboard": [
        ("time", 12, lambda r: fmt_ts(r.ts)), ("environment", 14, lambda r: r.environment), ("obs", 7, lambda r: str(r.observations)),
        ("models", 7, lambda r: str(len(r.entries))),
        ("served (error %)", 90, lambda r: ", ".join(served_text(s) for s in r.served)),
    ],
    "DeadLetter": [
        ("time", 12, lambda r: fmt_ts(r.ts)), ("source", 26, lambda r: r.source_topic), ("at", 12, lambda r: f"p{r.partition}@{r.offset}"),
        ("error", 70, lambda r: r.error),
    ],
}  # fmt: skip


def table_header(record: Any) -> str:
    cols = _COLUMNS.get(type(record).__name__, [])
    return " ".join(f"{h:<{w}}" for h, w, _ in cols).rstrip()


def table_row(record: Any) -> str:
    """One aligned row of ``aip tail --table`` (cells cut to their column width).

    >>> from events import Alert
    >>> a = Alert(ts=1e9, state="raised", gpu_uuid="GPU-0", job_id="j1", interference_pct=61.25, threshold=50.0, source="measured")
    >>> table_header(a).split()
    ['time', 'state', 'gpu', 'job', 'interf_%', 'thresh_%', 'source', 'type']
    >>> table_row(a).split()
    ['01:46:40.000', 'raised', 'GPU-0', 'j1', '61.2', '50.0', 'measured', '-']
    """
    cols = _COLUMNS.get(type(record).__name__)
    if cols is None:
        return render(record)
    return " ".join(f"{_cut(str(cell(record)), w):<{w}}" for _, w, cell in cols).rstrip()


def run(args: argparse.Namespace) -> int:
    if getattr(args, "table", False) and args.json:
        raise CliError("choose one of --table and --json")
    settings = settings_from(args)
    topics = Topics(settings.topic_prefix)
    if topics.base(args.topic) not in RECORD_OF:
        raise CliError(f"unknown topic {args.topic!r}; choose one of {', '.join(RECORD_OF)}")
    name = topics.name(args.topic)
    try:  # Ctrl-C while connecting (broker_errors imports kafka-python: slow) ends the command like one while following
        with broker_errors(), _interrupt_while_connecting():
            from transport import RecordConsumer, ensure_topics

            ensure_topics(settings, [name])
            # the records as on the wire: a host batch is one --json line (render() prints one line per GPU)
            consumer = RecordConsumer(settings, [name], from_beginning=args.from_beginning or not args.follow, keep_host_batches=True)
            stop = threading.Event()
            with _interrupts_set(stop):
                try:
                    _print_records(consumer, args, topics, stop)
                finally:
                    sys.stdout.flush()
                    consumer.close(timeout_s=CLOSE_TIMEOUT_S)
    except KeyboardInterrupt:
        pass
    return 0


def _print_records(consumer: Any, args: argparse.Namespace, topics: Topics, stop: threading.Event) -> None:
    """Poll and print until ``stop`` is set, ``--limit`` records are printed or (without --follow) the topic is idle."""
    printed = 0
    idle_s = 0.0
    while not stop.is_set():
        items = consumer.poll(timeout_s=POLL_S)
        idle_s = 0.0 if items else idle_s + POLL_S
        for item in items:
            if item.error is None and not matches(item.record, args):
                continue
            if getattr(args, "table", False) and item.error is None:
                if printed % 40 == 0:  # the header again every 40 rows
                    print(table_header(item.record), flush=args.follow)
                print(table_row(item.record), flush=args.follow)
            else:
                print(line_for(item, topics, args.json), flush=args.follow)
            printed += 1
            if args.limit and printed >= args.limit:
                return
        if not args.follow and idle_s >= args.timeout:
            return


@contextlib.contextmanager
def _interrupts_set(stop: threading.Event) -> Iterator[None]:
    """While the consumer runs, Ctrl-C and SIGTERM only set ``stop``: no KeyboardInterrupt is raised
    inside kafka-python (its event loop, locks and close are not safe against one), and the loop
    sees the flag after at most one poll."""

    def handler(signum: int, frame: Any) -> None:
        _exit_within(EXIT_WITHIN_S)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield  # the caller closes the consumer inside: a second Ctrl-C does not interrupt the close
    finally:
        for sig, was in previous.items():
            signal.signal(sig, was)

"""``aip report``: a markdown report with plots from a run's topics (or an ``aip tail --json`` file)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from aip.common import add_kafka_args, broker_errors, settings_from
from aip.errors import CliError
from events import RECORD_OF, RecordError, Topics, decode_obj
from events.topics import LEADERBOARD, OBSERVATIONS, PREDICTIONS

REPORT_TOPICS = (OBSERVATIONS, PREDICTIONS, LEADERBOARD)


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="write a markdown report with plots from a run's records")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--from-topic",
        metavar="TOPIC",
        help=f"read this topic from the beginning (with {PREDICTIONS} and {LEADERBOARD} for the other plots)",
    )
    src.add_argument(
        "--from-file", "--input", dest="from_file", metavar="PATH", help="a JSON-lines file written by `aip tail --json`"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="directory for report.md and the PNGs")
    p.add_argument("--timeout", type=float, default=3.0, help="stop reading when nothing new arrives for this long (s)")
    add_kafka_args(p)
    p.set_defaults(func=run)


def read_jsonl(path: Path, default_topic: str = OBSERVATIONS) -> tuple[list[Any], int]:
    """Records from an ``aip tail --json`` file (``_topic`` says each line's record); (records, lines skipped)."""
    records, skipped = [], 0
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    with fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                topic = obj.pop("_topic", default_topic) if isinstance(obj, dict) else default_topic
                cls = RECORD_OF.get(topic)
                if cls is None or "_error" in obj:
                    skipped += 1
                    continue
                records.append(decode_obj(cls, obj))
            except (ValueError, RecordError):
                skipped += 1
    return records, skipped


def read_topics(args: argparse.Namespace) -> list[Any]:
    from transport import RecordConsumer, ensure_topics

    settings = settings_from(args)
    topics = Topics(settings.topic_prefix)
    base = topics.base(args.from_topic)
    if base not in RECORD_OF:
        raise CliError(f"unknown topic {args.from_topic!r}; choose one of {', '.join(RECORD_OF)}")
    names = list(dict.fromkeys([topics.name(base), *(topics.name(t) for t in REPORT_TOPICS)]))
    records: list[Any] = []
    with broker_errors():
        ensure_topics(settings, names)
        consumer = RecordConsumer(settings, names, from_beginning=True)
        try:
            idle_s, t0 = 0.0, time.monotonic()
            while idle_s < args.timeout:
                items = consumer.poll(timeout_s=0.5)
                idle_s = 0.0 if items else idle_s + 0.5
                records.extend(i.record for i in items if i.error is None)
                if items and time.monotonic() - t0 > 5.0:
                    print(f"aip report: read {len(records)} records so far", file=sys.stderr, flush=True)
                    t0 = time.monotonic()
        finally:
            consumer.close()
    return records


def run(args: argparse.Namespace) -> int:
    try:
        from models.reports import RunRecords, write_report
    except ImportError as exc:
        raise CliError(f"reports need the stream extra (pandas, matplotlib): {exc}") from None
    if args.from_file:
        records, skipped = read_jsonl(Path(args.from_file))
        source = f"file {args.from_file}" + (f" ({skipped} lines skipped)" if skipped else "")
    else:
        records = read_topics(args)
        source = f"topics {', '.join(dict.fromkeys([args.from_topic, *REPORT_TOPICS]))} on {settings_from(args).broker}"
    run_records = RunRecords()
    kept = sum(run_records.add(r) for r in records)
    if not kept:
        raise CliError(f"no observations, predictions or leaderboard records in {source}")
    try:
        md = write_report(run_records, Path(args.out), source)
    except OSError as exc:
        raise CliError(f"cannot write the report to {args.out}: {exc.strerror or exc}") from None
    print(f"wrote {md} ({len(run_records.observations)} observations, {len(run_records.predictions)} predictions, "
          f"{len(run_records.leaderboards)} leaderboard records)")  # fmt: skip
    return 0

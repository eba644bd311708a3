"""``aip tail TOPIC``: decode a topic and print its records."""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any

from aip.common import add_kafka_args, broker_errors, settings_from, sigterm_as_interrupt
from aip.errors import CliError
from aip.render import render
from events import RECORD_OF, Topics, to_dict


def register(sub: Any) -> None:
    p = sub.add_parser("tail", help="decode and print a topic")
    p.add_argument("topic", help=f"one of: {', '.join(RECORD_OF)}")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new records until Ctrl-C")
    p.add_argument("--from-beginning", action="store_true", help="with --follow, start at the oldest record (default: new records only)")
    p.add_argument("--json", action="store_true", help="one JSON object per line (the format `aip produce replay` reads)")
    p.add_argument("--gpu", help="only records of this GPU UUID (prefix match)")
    p.add_argument("--job", help="only records of this job id")
    p.add_argument("--kind", help="only records of this kind or state (started, progress, finished, raised, cleared, observed, placement)")
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


def run(args: argparse.Namespace) -> int:
    from transport import RecordConsumer, ensure_topics

    settings = settings_from(args)
    topics = Topics(settings.topic_prefix)
    if topics.base(args.topic) not in RECORD_OF:
        raise CliError(f"unknown topic {args.topic!r}; choose one of {', '.join(RECORD_OF)}")
    name = topics.name(args.topic)
    printed = 0
    with broker_errors(), sigterm_as_interrupt():
        ensure_topics(settings, [name])
        consumer = RecordConsumer(settings, [name], from_beginning=args.from_beginning or not args.follow)
        idle_s = 0.0
        try:
            while True:
                items = consumer.poll(timeout_s=0.5)
                idle_s = 0.0 if items else idle_s + 0.5
                for item in items:
                    if item.error is None and not matches(item.record, args):
                        continue
                    print(line_for(item, topics, args.json), flush=args.follow)
                    printed += 1
                    if args.limit and printed >= args.limit:
                        return 0
                if not args.follow and idle_s >= args.timeout:
                    return 0
        except KeyboardInterrupt:
            return 0
        finally:
            sys.stdout.flush()
            consumer.close()

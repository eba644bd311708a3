"""The "security" fault test: SASL through the authenticating front of the embedded broker.

Starts ``EmbeddedBroker(users=...)`` (Tansu behind aip/authfront.py), sends records with
PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 and reads them back, then tries wrong passwords,
an unknown user and a client without SASL, and times how long each takes to a clear
error.  The unpickling and secret-printing guarantees are tests/unit/test_security_*.py.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable
from typing import Any

from config import Settings

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _settings(address: str, mechanism: str, user: str, password: str) -> Settings:
    return Settings(
        broker=address,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=mechanism,
        sasl_username=user,
        sasl_password=password,
        topic_prefix=f"fsec{uuid.uuid4().hex[:8]}.",
        partitions=2,
        connect_timeout_s=5.0,
    )


def run(records_per_mechanism: int = 200, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The ``faults.security`` entry: what was done, records through the front, connections, time to a clear failure."""
    from aip.broker import EmbeddedBroker, free_port
    from transport import BrokerUnavailable, RecordConsumer, RecordProducer, check_reachable, ensure_topics

    say = progress or (lambda _: None)
    password = secrets.token_urlsafe(18)
    failures: dict[str, dict[str, Any]] = {}
    sent = received = 0
    with EmbeddedBroker(port=free_port(), users={"aip": password}) as broker:
        for mechanism in MECHANISMS:
            settings = _settings(broker.address, mechanism, "aip", password)
            ensure_topics(settings, [settings.topic_prefix + "gpu.metrics"])
            values = [f"{mechanism} {i}".encode() for i in range(records_per_mechanism)]
            with RecordProducer(settings) as producer:
                for v in values:
                    producer.send_raw("gpu.metrics", v)
                producer.flush(30)
            sent += len(values)
            with RecordConsumer(settings, ["gpu.metrics"], from_beginning=True) as consumer:
                got = consumer.read(until=lambda items, n=len(values): len(items) >= n, timeout_s=30)
            received += len({r.value for r in got} & set(values))
            say(f"security: {mechanism}: {len(got)}/{len(values)} records through the front")
        wrong = {
            "wrong_password_plain": _settings(broker.address, "PLAIN", "aip", password + "x"),
            "wrong_password_scram_sha_512": _settings(broker.address, "SCRAM-SHA-512", "aip", "not-" + password),
            "unknown_user": _settings(broker.address, "PLAIN", "mallory", password),
            "no_sasl": Settings(broker=broker.address, connect_timeout_s=5.0),
        }
        for name, settings in wrong.items():
            t0 = time.monotonic()
            try:
                check_reachable(settings)
                error = None
            except BrokerUnavailable as exc:
                error = str(exc)
            seconds = round(time.monotonic() - t0, 3)
            failures[name] = {
                "clear_error": error is not None and ("authentication failed" in error or "requires authentication" in error),
                "seconds_to_error": seconds,
                "password_in_error": error is not None and password in error,
            }
            say(f"security: {name}: {failures[name]}")
        stats = broker.front.stats.as_dict() if broker.front is not None else {}
    result: dict[str, Any] = {
        "what": "embedded broker behind the SASL front (aip broker --users): records with PLAIN, SCRAM-SHA-256 and "
        "SCRAM-SHA-512; wrong password, unknown user and a client without SASL must fail with one clear error",
        "sent": sent,
        "received": received,
        "lost": sent - received,
        "recovery_s": None,
        "connections": stats,
        "wrong_credentials": failures,
        "max_seconds_to_clear_failure": max(f["seconds_to_error"] for f in failures.values()),
        "other_checks": "no unpickling of untrusted data and no secret in output: tests/unit/test_security_code.py, "
        "tests/unit/test_security_secrets.py, tests/integration/test_security_auth.py",
    }
    broken = [n for n, f in failures.items() if not f["clear_error"] or f["password_in_error"]]
    if broken or received != sent:
        from aip.faults.scenarios import FaultCheckFailed

        raise FaultCheckFailed(
            f"security: records lost {sent - received}; no clear failure for {', '.join(broken) or 'none'}", result
        )
    return result

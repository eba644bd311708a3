"""Deliver records to Kafka through the on-disk spool: never block the sampler, never lose silently.

:meth:`Publisher.publish` encodes a record and appends it to the spool; a
sender thread takes batches from the spool's head, sends them, waits for the
broker's acknowledgements and only then removes them.  When the broker is
unreachable or fails a batch, the sender drops its connection, waits
(``retry_s``, doubling up to 5 s), reconnects, recreates the topics (a broker
that lost its storage, like the embedded one after a restart, has none) and
sends the same batch again: in order, at least once (a batch that half
arrived comes again; consumers see the duplicate by ``seq``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from config import Settings
from events import Topics, encode
from producers.metrics import ProducerMetrics
from producers.spool import Spool

log = logging.getLogger(__name__)


class PublisherError(RuntimeError):
    """The publisher cannot start; the message says why and what to do."""


def spool_path(settings: Settings, name: str) -> Path:
    base = Path(settings.spool_dir).expanduser() if settings.spool_dir else Path.home() / ".cache" / "aip" / "spool"
    return base / name


def kafka_producer(settings: Settings) -> Any:
    """The production sender: a RecordProducer that fails fast instead of blocking for a minute."""
    from transport import RecordProducer, check_reachable, ensure_topics

    check_reachable(settings, timeout_s=1.0)
    topics = Topics(settings.topic_prefix)
    ensure_topics(settings, [topics.metrics, topics.lifecycle])
    return RecordProducer(
        settings, max_block_ms=3000, retries=2, retry_backoff_ms=200, request_timeout_ms=5000, delivery_timeout_ms=10000
    )


class Publisher:
    """Spool-backed, ordered, at-least-once publishing of ``events`` records."""

    def __init__(
        self,
        settings: Settings,
        name: str,
        *,
        producer_factory: Callable[[], Any] | None = None,
        spool: Spool | None = None,
        metrics: ProducerMetrics | None = None,
        batch_records: int = 500,
        flush_timeout_s: float = 8.0,
        retry_s: float = 0.5,
        start: bool = True,
    ) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.metrics = metrics or ProducerMetrics()
        self._lock_fh: Any = None
        if spool is None:
            directory = spool_path(settings, name)
            directory.mkdir(parents=True, exist_ok=True)
            self._lock_fh = open(directory / ".lock", "w")
            try:
                fcntl.flock(self._lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise PublisherError(f"another producer is using the spool {directory}; stop it or set AIP_SPOOL_DIR") from None
            spool = Spool(directory, settings.spool_max_records)
        self.spool = spool
        self.producer_factory = producer_factory or (lambda: kafka_producer(settings))
        self.batch_records = batch_records
        self.flush_timeout_s = flush_timeout_s
        self.retry_s = retry_s
        self.connected = False
        self.last_error = ""
        self._producer: Any = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._dropped_seen = self.spool.dropped
        self._thread = threading.Thread(target=self._run, name=f"aip-publisher-{name}", daemon=True)
        if start:
            self._thread.start()

    # ------------------------------------------------------------------ producer side
    def publish(self, topic: str, record: Any) -> None:
        """Queue ``record`` for ``topic`` (a base name such as ``gpu.metrics``); never blocks on the broker."""
        key = getattr(record, "key", None)
        self.spool.append(topic, key.encode() if key is not None else None, encode(record))
        if not self.connected:
            self.metrics.records_spooled.inc()
        self._count_dropped()
        self._wake.set()

    def _count_dropped(self) -> None:
        dropped = self.spool.dropped
        if dropped > self._dropped_seen:
            self.metrics.records_dropped.inc(dropped - self._dropped_seen)
            self._dropped_seen = dropped
        self.metrics.spool_records.set(len(self.spool))

    def pause(self) -> None:
        """Stop sending after the batch in flight (records keep going to the spool)."""
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self.spool)

    def wait_drained(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while len(self.spool) and time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.05)
        return not len(self.spool)

    def close(self, timeout_s: float = 10.0) -> int:
        """Deliver what waits (up to ``timeout_s``), stop, and return how many records are left in the spool."""
        self.wait_drained(timeout_s)
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.flush_timeout_s + 2)
        self._disconnect()
        left = len(self.spool)
        self.spool.remove_if_empty() if left == 0 else self.spool.close()
        if self._lock_fh is not None:
            self._lock_fh.close()
        return left

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ sender thread
    def _disconnect(self) -> None:
        if self._producer is not None:
            try:
                self._producer.close(timeout_s=0)
            except Exception:
                # kafka-python's close() gives up before stopping its sender thread when
                # records are still pending (flush raises); stop it, or every outage leaks one
                kafka = getattr(self._producer, "_producer", self._producer)
                with contextlib.suppress(Exception):
                    kafka._sender.force_close()
                with contextlib.suppress(Exception):
                    kafka._closed = True
        self._producer = None
        self.connected = False

    def _run(self) -> None:
        backoff = self.retry_s
        while not self._stop.is_set():
            if self._paused.is_set():
                self._stop.wait(0.05)
                continue
            batch = self.spool.peek(self.batch_records)
            if not batch:
                self._wake.wait(0.2)
                self._wake.clear()
                continue
            try:
                if self._producer is None:
                    self._producer = self.producer_factory()
                    self.connected = True
                    log.info("publisher connected; %d records waiting", len(self.spool))
                futures = [self._producer.send_raw(self.topics.name(topic), value, key=key) for _, topic, key, value in batch]
                self._producer.flush(timeout_s=self.flush_timeout_s)
                failed = [f for f in futures if not (f.is_done and f.succeeded())]
                if failed:
                    exc = getattr(failed[0], "exception", None)
                    raise ConnectionError(f"{len(failed)} of {len(futures)} records not acknowledged: {exc!r}")
            except Exception as exc:  # any transport failure: back off, reconnect, resend in order
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("broker unavailable, spooling (%s)", self.last_error)
                self.metrics.send_failures.inc()
                self._disconnect()
                self._stop.wait(backoff)
                backoff = min(5.0, backoff * 2)
                continue
            backoff = self.retry_s
            self.spool.commit(batch[-1][0])
            self.metrics.records_sent.inc(len(batch))
            self._count_dropped()

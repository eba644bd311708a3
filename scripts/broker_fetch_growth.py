"""The embedded broker's CPU under a constant load, as the records it holds grow.

Sends ``--rate`` records of 2 KB a second to a topic of 8 partitions on a fresh embedded broker for ``--seconds``,
with a consumer group reading them (``--no-consumer``: none), and prints the broker's CPU every 10 s.
``--linger-ms`` and ``--batch-bytes`` are the producer's (kafka-python's defaults in the project: 5 ms, 16 KB).
Tansu's memory storage lists every batch a partition holds on each fetch below its end, so with a reader its CPU
grows with the batches stored (docs/BENCHMARKS.md, "The embedded broker's fetches").

    python scripts/broker_fetch_growth.py --rate 1250 --seconds 90
    python scripts/broker_fetch_growth.py --rate 1250 --seconds 90 --linger-ms 20 --batch-bytes 1000000
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=1250, help="records a second")
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--linger-ms", type=int, default=5)
    ap.add_argument("--batch-bytes", type=int, default=16384)
    ap.add_argument("--no-consumer", action="store_true")
    args = ap.parse_args()

    import psutil
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    from aip.broker import EmbeddedBroker, free_port

    with EmbeddedBroker(port=free_port()) as broker:
        addr = broker.address
        admin = KafkaAdminClient(bootstrap_servers=addr)
        admin.create_topics([NewTopic("load", 8, 1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=addr, linger_ms=args.linger_ms, batch_size=args.batch_bytes)
        stop, read = threading.Event(), [0]

        def consume() -> None:
            consumer = KafkaConsumer("load", bootstrap_servers=addr, group_id="load", auto_offset_reset="earliest")
            while not stop.is_set():
                read[0] += sum(len(records) for records in consumer.poll(500).values())
            consumer.close()

        reader = threading.Thread(target=consume, daemon=True)
        if not args.no_consumer:
            reader.start()
        proc = psutil.Process(broker.process.pid)  # type: ignore[union-attr]
        value = os.urandom(1000).hex().encode()
        t0 = time.monotonic()
        sent, last_t, last_cpu = 0, t0, sum(proc.cpu_times()[:2])
        while (now := time.monotonic()) - t0 < args.seconds:
            while sent < int((now - t0) * args.rate):
                producer.send("load", key=str(sent % 1250).encode(), value=value)
                sent += 1
            time.sleep(0.01)
            if now - last_t >= 10.0:
                cpu = sum(proc.cpu_times()[:2])
                print(
                    f"{now - t0:5.0f} s: sent {sent}, read {read[0]}, broker {100.0 * (cpu - last_cpu) / (now - last_t):5.1f} % of a core",
                    flush=True,
                )
                last_t, last_cpu = now, cpu
        stop.set()
        producer.close()
        if reader.is_alive():
            reader.join(5)


if __name__ == "__main__":
    main()

"""The sampler keeps sampling through a broker outage and every seq arrives.

The outage lasts until the publisher has failed a send and spooled ``SPOOLED_PER_GPU`` samples of each GPU
(5 s at the 0.1 s sampling interval), not for a fixed time."""

from __future__ import annotations

import threading
import uuid

import pytest
from conftest import wait_for

from config import Settings
from producers.fakenvml import fleet
from producers.metrics import ProducerMetrics
from producers.nvml import NvmlSampler, run_sampler
from producers.publisher import Publisher
from transport import RecordConsumer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
GPUS = 3
SAMPLE_INTERVAL_S = 0.1
SPOOLED_PER_GPU = 50


def seqs_of(items) -> set[tuple[str, int]]:
    assert not [i.error for i in items if i.error]
    return {(s.gpu_uuid, s.seq) for i in items for s in i.record.samples}  # one batch per round


def test_broker_outage_loses_no_sample(tmp_path) -> None:
    from aip.broker import EmbeddedBroker, free_port

    port = free_port()
    broker = EmbeddedBroker(port=port).start()
    settings = Settings(
        broker=broker.address,
        topic_prefix=f"t{uuid.uuid4().hex[:12]}.",
        partitions=2,
        connect_timeout_s=3.0,
        spool_dir=str(tmp_path),
    )
    metrics = ProducerMetrics()
    pub = Publisher(settings, "outage", metrics=metrics, retry_s=0.2)
    sampler = NvmlSampler(fleet(GPUS), host="h", metrics=metrics).open()
    stop = threading.Event()
    thread = threading.Thread(target=run_sampler, args=(sampler, pub.publish, SAMPLE_INTERVAL_S, stop), daemon=True)
    thread.start()
    try:
        wait_for(lambda: pub.connected and metrics.value("aip_producer_records_sent_total") >= 10, 20, what="first deliveries")
        before_consumer = RecordConsumer(settings, ["gpu.metrics"], from_beginning=True, keep_host_batches=True)
        before: list = []
        # hold the sender (not the sampler) so that everything the broker acknowledged is read before it dies
        pub.pause()
        wait_for(
            lambda: before.extend(before_consumer.poll(0.2)) or len(before) >= metrics.value("aip_producer_records_sent_total"),
            20,
            what="consumer to catch up before the outage",
        )
        before_consumer.close()
        broker.stop()
        pub.resume()
        taken_at_stop = metrics.value("aip_producer_samples_taken_total")
        wait_for(
            lambda: metrics.value("aip_producer_send_failures_total") >= 1  # it noticed the outage ...
            and metrics.value("aip_producer_samples_taken_total") - taken_at_stop >= GPUS * SPOOLED_PER_GPU  # kept sampling
            and pub.pending >= SPOOLED_PER_GPU,  # ... into the spool (a record per round: one host batch)
            60,
            interval_s=0.2,
            what=f"a send failure and {SPOOLED_PER_GPU} spooled samples per GPU while the broker is down",
        )
        broker = EmbeddedBroker(port=port).start()
        wait_for(lambda: pub.pending < 5, 30, what="the spool to drain after the restart")
        stop.set()
        thread.join(5)
        assert pub.close(timeout_s=20) == 0
        after_consumer = RecordConsumer(settings, ["gpu.metrics"], from_beginning=True, keep_host_batches=True)
        produced = {
            (f"GPU-fake-{g:04d}", s)
            for g in range(GPUS)
            for s in range(int(metrics.value("aip_producer_samples_taken_total")) // GPUS)
        }
        after: list = []
        wait_for(
            lambda: after.extend(after_consumer.poll(0.5)) or produced <= seqs_of(before) | seqs_of(after),
            30,
            what="every seq after the restart",
        )
        after_consumer.close()
        got = seqs_of(before) | seqs_of(after)
        assert produced <= got
        assert metrics.value("aip_producer_records_dropped_total") == 0
    finally:
        stop.set()
        broker.stop()

"""``aip bench producers``: sampler CPU per GPU sample (fake NVML), simulator rate, delivery rates."""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any


def _sampler_cpu_ms(rounds: int, gpus: int) -> tuple[float, float]:
    from events import encode
    from producers.fakenvml import fleet
    from producers.nvml import NvmlSampler

    sampler = NvmlSampler(fleet(gpus, processes=[(100, 2 * 1024**3), (101, 1024**3)]), host="bench").open()
    t0 = time.process_time()
    for _ in range(rounds):
        sampler.sample()
    sample_s = time.process_time() - t0
    t0 = time.process_time()
    for _ in range(rounds):
        for s in sampler.sample():
            encode(s)
    with_encode_s = time.process_time() - t0
    n = rounds * gpus
    return sample_s / n * 1000.0, with_encode_s / n * 1000.0


def _sim_rate(gpus: int, duration_s: float) -> tuple[float, float, int]:
    from events import encode
    from producers.sim import Simulator

    sim = Simulator(gpus, seed=0, start_ts=1_700_000_000.0, duration_s=duration_s)
    t0 = time.perf_counter()
    n = sum(1 for _ in sim.events())
    gen_s = time.perf_counter() - t0
    sim = Simulator(gpus, seed=0, start_ts=1_700_000_000.0, duration_s=duration_s)
    t0 = time.perf_counter()
    for _, r in sim.events():
        encode(r)
    enc_s = time.perf_counter() - t0
    return n / gen_s, n / enc_s, n


def _delivery(n: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """kafka-python's raw produce rate and the spool-backed publisher's, same broker, same run."""
    from kafka import KafkaProducer

    from aip.broker import EmbeddedBroker, free_port
    from config import Settings
    from producers.publisher import Publisher
    from producers.sim import Simulator
    from transport import ensure_topics

    out: dict[str, Any] = {}
    with EmbeddedBroker(port=free_port()) as broker, tempfile.TemporaryDirectory() as spool:
        settings = Settings(broker=broker.address, topic_prefix=f"bench{uuid.uuid4().hex[:8]}.", spool_dir=spool)
        records = []
        for topic, r in Simulator(16, seed=0, start_ts=1_700_000_000.0, duration_s=3600).events():
            records.append((topic, r))
            if len(records) >= n:
                break
        from events import Topics, encode

        topics = Topics(settings.topic_prefix)
        ensure_topics(settings, [topics.metrics, topics.lifecycle])
        payloads = [(topics.name(t), r.key.encode(), encode(r)) for t, r in records]
        raw = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, linger_ms=5, acks=1, enable_idempotence=False)
        t0 = time.perf_counter()
        for topic, key, value in payloads:
            raw.send(topic, key=key, value=value)
        raw.flush()
        out["kafka_raw_events_per_s"] = round(len(payloads) / (time.perf_counter() - t0))
        raw.close()
        progress(f"kafka-python raw: {out['kafka_raw_events_per_s']} events/s")
        pub = Publisher(settings, "bench")
        t0 = time.perf_counter()
        for topic, r in records:
            pub.publish(topic, r)
        left = pub.close(timeout_s=120)
        out["publisher_events_per_s"] = round(len(records) / (time.perf_counter() - t0))
        out["publisher_left_in_spool"] = left
        out["publisher_vs_raw"] = round(out["publisher_events_per_s"] / out["kafka_raw_events_per_s"], 2)
        progress(f"publisher (spool + ack per batch): {out['publisher_events_per_s']} events/s")
    return out


def run(quick: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    gpus = 8
    rounds = 300 if quick else 3000
    progress(f"sampler: {rounds} rounds x {gpus} fake GPUs")
    cpu_ms, cpu_enc_ms = _sampler_cpu_ms(rounds, gpus)
    sim_gpus, sim_s = (32, 600.0) if quick else (128, 1800.0)
    progress(f"simulator: {sim_gpus} GPUs x {sim_s:.0f} simulated s")
    rate, enc_rate, n = _sim_rate(sim_gpus, sim_s)
    result: dict[str, Any] = {
        "sampler_cpu_ms_per_gpu_sample": round(cpu_ms, 4),
        "sampler_with_encode_cpu_ms_per_gpu_sample": round(cpu_enc_ms, 4),
        "sim_events_per_s": round(rate),
        "sim_encoded_events_per_s": round(enc_rate),
        "sim_events": n,
    }
    try:
        result |= _delivery(20_000 if quick else 100_000, progress)
    except Exception as exc:  # the embedded broker is optional for this part
        progress(f"delivery rates skipped: {type(exc).__name__}: {exc}")
    return result

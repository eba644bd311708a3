"""``aip bench producers``: sampler CPU per GPU sample (fake NVML), simulator rate, delivery rates, and the
step hook's overhead on a tiny CPU training loop (``hook_overhead_pct``, floor 2 % of the step time)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
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


HOOK_OVERHEAD_FLOOR_PCT = 2.0


def _hook_overhead(rounds: int, steps: int) -> dict[str, Any]:
    """The step hook's cost on a tiny CPU training loop: the same loop with and without it, in this process.

    Each round times a block of ``steps`` steps without the hook, one with it (registered through torch's
    global optimizer step post-hook, as ``sitecustomize`` does, reporting to a real collector socket) and one
    with a no-op post-hook in its place, in alternating order, in CPU time of the training thread.
    ``hook_overhead_pct`` is the median of the rounds' differences in percent (a round's blocks are adjacent,
    so they share the machine's state), so that rounds the shared machine's other work disturbed do not count;
    ``hook_noop_overhead_pct`` is the same for the no-op: what torch's calling any post-hook costs.
    ``hook_call_us``: the hook's own cost per step, timed alone (hot in the caches, as a training step's
    is not).
    """
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from producers.stepcollector import StepCollector, one_job
    from producers.stephook.aip_stephook import Sender, StepHook

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randn(64, 1)

    def loop(n: int) -> float:  # CPU time of this thread: the time others' processes take the core is not the hook's
        t0 = time.thread_time()
        for _ in range(n):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        return (time.thread_time() - t0) / n

    try:
        loop(steps)  # warm-up
        with tempfile.TemporaryDirectory() as tmp:
            events: list[Any] = []
            with StepCollector(
                os.path.join(tmp, "steps.sock"), one_job("bench", "bench", "GPU-bench"), lambda t, r: events.append(r)
            ) as c:
                hook = StepHook(Sender(str(c.path)))
                variants: dict[str, Any] = {"off": None, "noop": lambda *_: None, "hook": hook}
                block_s: dict[str, list[float]] = {k: [] for k in variants}
                pcts: dict[str, list[float]] = {"noop": [], "hook": []}
                for r in range(rounds):
                    order = list(variants) if r % 2 == 0 else list(reversed(variants))
                    for name in order:
                        handle = register_optimizer_step_post_hook(variants[name]) if variants[name] else None
                        block_s[name].append(loop(steps))
                        if handle is not None:
                            handle.remove()
                    for name in pcts:
                        pcts[name].append((block_s[name][-1] - block_s["off"][-1]) / block_s["off"][-1] * 100.0)
                c.poll()
                calls = 20_000
                t0 = time.thread_time()
                for _ in range(calls):
                    hook(opt, (), {})
                call_s = (time.thread_time() - t0) / calls
    finally:
        torch.set_num_threads(threads)
    off = statistics.median(block_s["off"])
    overhead_pct = statistics.median(pcts["hook"])
    return {
        "hook_overhead_pct": round(overhead_pct, 3),
        "hook_overhead_floor_pct": HOOK_OVERHEAD_FLOOR_PCT,
        "hook_overhead_floor_met": overhead_pct <= HOOK_OVERHEAD_FLOOR_PCT,
        "hook_noop_overhead_pct": round(statistics.median(pcts["noop"]), 3),
        "hook_step_time_us": round(off * 1e6, 1),
        "hook_call_us": round(call_s * 1e6, 3),
        "hook_call_pct": round(call_s / off * 100.0, 3),
        "hook_rounds": rounds,
        "hook_steps_per_block": steps,
        "hook_reports_received": len(events),
    }


def _hook_startup_ms(rounds: int) -> float:
    """What the hook adds to the start of a Python process that never imports torch (median of paired runs)."""
    from producers.stephook import HOOK_DIR

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    hooked = env | {"PYTHONPATH": str(HOOK_DIR), "AIP_STEP_SOCKET": os.path.join(tempfile.gettempdir(), "aip-bench-none.sock")}

    def start(e: dict[str, str]) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=e, check=True)
        return time.perf_counter() - t0

    diffs = [start(hooked) - start(env) for _ in range(rounds)]
    return round(statistics.median(diffs) * 1000.0, 2)


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
    rounds, steps = (400, 20) if quick else (1500, 20)
    progress(f"step hook: {rounds} rounds x 2 blocks of {steps} steps of a tiny CPU training loop, with and without the hook")
    result |= _hook_overhead(rounds, steps)
    result["hook_startup_ms"] = _hook_startup_ms(9 if quick else 31)
    progress(
        f"step hook: {result['hook_overhead_pct']} % of a {result['hook_step_time_us']} us step "
        f"(the hook alone: {result['hook_call_us']} us per step); {result['hook_startup_ms']} ms more at start-up"
    )
    try:
        result |= _delivery(20_000 if quick else 100_000, progress)
    except Exception as exc:  # the embedded broker is optional for this part
        progress(f"delivery rates skipped: {type(exc).__name__}: {exc}")
    return result

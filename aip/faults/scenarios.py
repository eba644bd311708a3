"""The five fault tests as functions of a real broker and real ``aip worker`` processes.

Each returns the ``faults`` entry of DESIGN.md's benchmark contract (``what``,
``sent``, ``received``, ``lost``, ``recovery_s``) plus details, and raises
:class:`FaultCheckFailed` when a guarantee does not hold.  The integration
tests call them with small sizes; ``aip bench faults`` with the full ones.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from config import Settings
from events import JobEvent, MetricSample, Observation, Topics
from events.topics import LIFECYCLE, METRICS

Progress = Callable[[str], None]


class FaultCheckFailed(AssertionError):
    """A fault test found a broken guarantee; the message says which, ``result`` holds the figures."""

    result: dict[str, Any] = {}


def _quiet(_: str) -> None:
    return None


_LAST: dict[str, Any] = {}


def _attach(result: dict[str, Any]) -> None:
    _LAST.clear()
    _LAST.update(result)


def check(condition: bool, message: str) -> None:
    if not condition:
        exc = FaultCheckFailed(message)
        exc.result = dict(_LAST)
        raise exc


# ----------------------------------------------------------------------------- helpers
def reference_observations(settings: Settings, events: Iterable[tuple[str, Any]]) -> dict[str, Observation]:
    """Stage 1 fed one event at a time in order, without Kafka: what a worker must publish."""
    from streams.stage1 import Stage1

    ref = Stage1(settings.window_s, settings.lateness_s, settings.lifecycle_hold_s)
    out: dict[str, Observation] = {}
    for topic, record in events:
        for o in ref.on_metric(record) if topic == METRICS else ref.on_job(record):
            out[o.observation_id] = o
    return out


class TopicReader:
    """Reads a topic from the beginning, incrementally, without a consumer group."""

    def __init__(self, settings: Settings, topic: str) -> None:
        from transport import RecordConsumer

        self.consumer = RecordConsumer(settings, [topic], from_beginning=True)
        self.items: list[Any] = []

    def poll(self, timeout_s: float = 0.3) -> list[Any]:
        new = self.consumer.poll(timeout_s=timeout_s, max_records=5000)
        self.items.extend(new)
        return new

    def records(self) -> list[Any]:
        return [i.record for i in self.items if i.record is not None]

    def close(self) -> None:
        self.consumer.close()


def produce_raw(
    settings: Settings, cases: Iterable[tuple[str, bytes | None, bytes | None]], rate_per_s: float = 0.0
) -> list[tuple[str, int, int]]:
    """Send raw (topic base, key, value) at about ``rate_per_s`` (0: at once); return (topic base, partition, offset) of each.

    A paced send keeps the worker from reading a backlog, in which one input topic can run
    further ahead of the other than ``lifecycle_hold_s`` (see docs/RELIABILITY.md).
    """
    from transport import RecordProducer

    futures = []
    t0 = time.monotonic()
    with RecordProducer(settings, max_request_size=8_000_000) as p:
        for i, (topic, key, value) in enumerate(cases):
            if rate_per_s > 0 and i % 200 == 0:
                delay = t0 + i / rate_per_s - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            futures.append((topic, p.send_raw(topic, value, key=key)))
        p.flush(120)
        out = []
        for topic, f in futures:
            md = f.get(timeout=60)
            out.append((topic, md.partition, md.offset))
    return out


def produce_records(settings: Settings, events: Iterable[tuple[str, Any]]) -> int:
    from transport import RecordProducer

    n = 0
    with RecordProducer(settings) as p:
        for topic, record in events:
            p.send(topic, record)
            n += 1
        p.flush(120)
    return n


def start_worker(settings: Settings, workdir: Path, name: str = "worker") -> Any:
    from aip.broker import free_port
    from aip.faults.worker import WorkerProcess

    return WorkerProcess(settings, free_port(), workdir / f"{name}.log")


# ----------------------------------------------------------------------------- 3. bad input
def bad_input(
    settings: Settings,
    workdir: Path,
    per_topic: int = 1000,
    seed: int = 0,
    progress: Progress = _quiet,
    rate_per_s: float = 2000.0,
) -> dict[str, Any]:
    """Fuzzed records through a real worker: no crash, every rejection dead-lettered exactly, valid records processed."""
    from aip.faults.fuzz import expected_counts, fuzz_cases
    from aip.faults.worker import wait_until
    from transport import ensure_project_topics

    cases, valid = fuzz_cases(per_topic, seed=seed)
    expected = reference_observations(settings, valid)
    counts = expected_counts(cases)
    ensure_project_topics(settings)
    worker = start_worker(settings, workdir, "worker-fuzz").start()
    try:
        worker.wait_ready()
        progress(f"worker ready; sending {len(cases)} records ({counts})")
        positions = produce_raw(settings, [(c.topic, c.key, c.value) for c in cases], rate_per_s)
        t_sent = time.monotonic()
        rejected = {pos for pos, c in zip(positions, cases, strict=True) if c.expect == "reject"}
        topics = Topics(settings.topic_prefix)
        dead = TopicReader(settings, "aip.deadletter")
        obs = TopicReader(settings, "interference.observations")

        def done() -> bool:
            dead.poll()
            obs.poll()
            got_ids = {o.observation_id for o in obs.records()}
            return len(dead.items) >= len(rejected) and set(expected) <= got_ids

        try:
            wait_until(done, 120 + per_topic / 50, "dead letters and observations")
        except TimeoutError:
            pass
        # keep reading a little: nothing more may arrive (exactly, not at least)
        wait_until(lambda: not dead.poll(1.0), 30, "the dead-letter topic to go quiet")
        letters = dead.records()
        recovery_s = time.monotonic() - t_sent
        check(all(i.error is None for i in dead.items), "undecodable dead letter")
        got = {
            (
                topics.base(d.source_topic)
                if "." in d.source_topic and d.source_topic not in (METRICS, LIFECYCLE)
                else d.source_topic,
                d.partition,
                d.offset,
            )
            for d in letters
        }
        missing = rejected - got
        unexpected = got - rejected
        reasons = Counter(d.error.split(":")[0] for d in letters)
        check(all(d.error.strip() for d in letters), "a dead letter without a reason")
        obs_records = [o for o in obs.records() if o.environment == next(iter(expected.values())).environment] if expected else []
        got_obs = {o.observation_id: o for o in obs_records}
        missing_obs = set(expected) - set(got_obs)
        differing = [i for i in expected if i in got_obs and not _same(expected[i], got_obs[i])]
        alive = worker.alive()
        duplicates = worker.counter("aip_stream_stage_events_total", stage="stage1", kind="duplicate_metrics")
        worker.stop()
        result = {
            "what": f"{per_topic} fuzzed records (sent at {rate_per_s:g}/s) per input topic (wrong types, NaN/inf, out of range, missing/unknown fields, "
            "huge strings, invalid UTF-8, far timestamps, duplicates, impossible lifecycle orders) interleaved with a valid simulated stream",
            "sent": len(cases),
            "received": len(letters) + len(valid),
            "lost": len(missing) + len(missing_obs),
            "recovery_s": round(recovery_s, 1),
            "rejected_expected": len(rejected),
            "dead_letters": len(letters),
            "dead_letters_unexpected": len(unexpected),
            "valid_records": len(valid),
            "observations_expected": len(expected),
            "observations_missing": len(missing_obs),
            "observations_differing": len(differing),
            "duplicates_detected": int(duplicates),
            "duplicates_sent": sum(1 for c in cases if c.expect == "duplicate"),
            "worker_alive": alive,
            "top_reasons": dict(reasons.most_common(8)),
        }
        dead.close()
        obs.close()
        _attach(result)
        check(alive, f"the worker died: {worker.log_tail()}")
        check(not missing, f"{len(missing)} rejected records without a dead letter, e.g. {sorted(missing)[:3]}")
        check(
            not unexpected,
            f"{len(unexpected)} dead letters for records that were valid, e.g. {[d.error for d in letters if (d.source_topic, d.partition, d.offset) in unexpected][:3]}",
        )
        check(len(letters) == len(rejected), f"{len(letters)} dead letters for {len(rejected)} rejected records")
        check(not missing_obs, f"{len(missing_obs)} of {len(expected)} observations of the valid stream missing")
        check(not differing, f"{len(differing)} observations differ from the reference (duplicates counted twice?)")
        return result
    finally:
        worker.stop()


def _same(a: Observation, b: Observation, tol: float = 1e-6) -> bool:
    for p in ("E_pct", "T_pct", "S_pct", "V_pct", "R_pct", "W_pct", "interference_pct"):
        x, y = getattr(a, p), getattr(b, p)
        if (x is None) != (y is None) or (x is not None and abs(x - y) > tol * max(1.0, abs(x))):
            return False
    return a.samples == b.samples and sorted(a.co_job_ids) == sorted(b.co_job_ids)


__all__ = ["FaultCheckFailed", "JobEvent", "MetricSample", "bad_input"]


# ----------------------------------------------------------------------------- 1. worker crash
CRASH_GPU_MODEL = "v100"
START_TS = 1_700_000_000.0


class PacedSender:
    """Sends ``events`` over about ``run_s`` real seconds from a thread (the simulator 'running')."""

    def __init__(self, settings: Settings, events: list[tuple[str, Any]], run_s: float) -> None:
        import threading

        self.settings = settings
        self.events = events
        self.run_s = run_s
        self.sent = 0
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PacedSender:
        self.thread.start()
        return self

    def _run(self) -> None:
        from transport import RecordProducer

        try:
            with RecordProducer(self.settings) as p:
                t0 = time.monotonic()
                n = len(self.events)
                for i, (topic, record) in enumerate(self.events):
                    due = t0 + self.run_s * i / n
                    delay = due - time.monotonic()
                    if delay > 0.02:
                        p.flush(30)
                        time.sleep(delay)
                    p.send(topic, record)
                    self.sent = i + 1
                p.flush(60)
        except BaseException as exc:  # reported by the caller
            self.error = exc
        finally:
            self.done.set()


def worker_crash(
    settings: Settings,
    workdir: Path,
    kills: int = 1,
    gpus: int = 8,
    sim_s: float = 900.0,
    run_s: float = 40.0,
    seed: int = 0,
    progress: Progress = _quiet,
    resume_timeout_s: float = 120.0,
) -> dict[str, Any]:
    """SIGKILL the worker ``kills`` times at random moments while a simulated fleet streams in; restart it each time."""
    import random

    from aip.broker import free_port
    from aip.faults.worker import wait_until
    from producers.sim import Simulator
    from transport import ensure_project_topics

    rng = random.Random(seed)
    events = list(Simulator(gpus=gpus, gpu_model=CRASH_GPU_MODEL, seed=seed, start_ts=START_TS, duration_s=sim_s).events())
    expected = reference_observations(settings, events)
    ensure_project_topics(settings)
    worker = start_worker(settings, workdir, "worker-crash").start()
    worker.wait_ready()
    obs = TopicReader(settings, "interference.observations")
    boards = TopicReader(settings, "models.leaderboard")
    sender = PacedSender(settings, events, run_s).start()
    t0 = time.monotonic()
    moments = sorted(rng.uniform(0.15, 0.85) * run_s for _ in range(kills))
    recoveries: list[float] = []
    learned_before: list[int] = []
    try:
        for moment in moments:
            wait_until(lambda m=moment: time.monotonic() - t0 >= m, run_s + 60, "the kill moment", interval_s=0.05)  # type: ignore[misc]
            board = worker.get("/leaderboard") if worker.alive() else {}
            learned_before.append(int(board.get(CRASH_GPU_MODEL, {}).get("observations", 0)))
            worker.kill()
            killed_at = time.monotonic()
            progress(f"SIGKILL at {killed_at - t0:.1f} s ({sender.sent} of {len(events)} events sent); restarting")
            worker.web_port = free_port()
            worker.start()
            worker.wait_ready()
            wait_until(
                lambda: worker.counter("aip_stream_published_records_total", topic="predictions") > 0,
                resume_timeout_s,
                "predictions from the restarted worker",
            )
            recoveries.append(time.monotonic() - killed_at)
            progress(f"predictions resumed {recoveries[-1]:.1f} s after the kill")
        wait_until(sender.done.is_set, run_s + 120, "the simulator to finish")
        if sender.error is not None:
            raise sender.error

        def all_observations() -> bool:
            obs.poll()
            return set(expected) <= {o.observation_id for o in obs.records()}

        try:
            wait_until(all_observations, 120, "every expected observation")
        except TimeoutError:
            pass
        wait_until(lambda: not obs.poll(1.0), 60, "the observations topic to go quiet")
        got = obs.records()
        ids = Counter(o.observation_id for o in got)
        by_id = {o.observation_id: o for o in got}
        missing = set(expected) - set(ids)
        differing = [i for i in expected if i in by_id and not _same(expected[i], by_id[i], tol=1e-3)]
        extra = set(ids) - set(expected)
        stage2_dupes = worker.counter("aip_stream_stage_events_total", stage="stage2", kind="duplicates")
        wait_until(lambda: worker.get("/leaderboard").get(CRASH_GPU_MODEL), 60, "the leaderboard")
        learned = int(worker.get("/leaderboard")[CRASH_GPU_MODEL].get("observations", 0))
        result = {
            "what": f"SIGKILL the worker {kills}x at random moments while {gpus} simulated GPUs stream {sim_s:g} s of data "
            f"in {run_s:g} s; restart each time",
            "sent": len(events),
            "received": len(expected) - len(missing),
            "lost": len(missing),
            "recovery_s": round(max(recoveries), 1) if recoveries else None,
            "recovery_each_s": [round(r, 1) for r in recoveries],
            "observations_expected": len(expected),
            "observations_published": sum(ids.values()),
            "observations_duplicated": sum(v - 1 for v in ids.values() if v > 1),
            "observations_differing": len(differing),
            "observations_unexpected": len(extra),
            "duplicates_skipped_stage2": int(stage2_dupes),
            "learned_before_kills": learned_before,
            "learned_final": learned,
            "unique_observations": len(ids),
        }
        progress(str(result))
        _attach(result)
        check(not missing, f"{len(missing)} of {len(expected)} observations lost, e.g. {sorted(missing)[:3]}")
        check(learned <= len(ids), f"learned {learned} observations but only {len(ids)} distinct ones exist (learned twice)")
        return result
    finally:
        sender.done.wait(5)
        obs.close()
        boards.close()
        worker.stop()

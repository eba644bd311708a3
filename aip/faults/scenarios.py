"""The five fault tests as functions of a real broker and real ``aip worker`` processes.

Each returns the ``faults`` entry of the benchmarks (docs/BENCHMARKS.md, "Faults") (``what``,
``sent``, ``received``, ``lost``, ``recovery_s``) plus details, and raises
:class:`FaultCheckFailed` when a guarantee does not hold.  The integration
tests call them with small sizes; ``aip bench faults`` with the full ones.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from config import Settings
from events import JobEvent, MetricSample, Observation, Topics
from events.topics import LIFECYCLE, METRICS
from producers.pacing import at_rate

Progress = Callable[[str], None]


class FaultCheckFailed(AssertionError):
    """A fault test found a broken guarantee; the message says which, ``result`` holds the figures."""

    def __init__(self, message: str, result: dict[str, Any]) -> None:
        super().__init__(message)
        self.result = result


def _quiet(_: str) -> None:
    return None


def check(condition: bool, message: str, result: dict[str, Any]) -> None:
    """Raise :class:`FaultCheckFailed` with ``message`` and the scenario's ``result`` unless ``condition``."""
    if not condition:
        raise FaultCheckFailed(message, result)


# ----------------------------------------------------------------------------- helpers
def reference_observations(settings: Settings, events: Iterable[tuple[str, Any]]) -> dict[str, Observation]:
    """Stage 1 fed one event at a time in order, without Kafka: what a worker must publish."""
    from streams.stage1 import Stage1

    ref = Stage1.from_settings(settings)
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
    with RecordProducer(settings, max_request_size=8_000_000) as p:
        for topic, key, value in at_rate(cases, rate_per_s, min_sleep_s=0.05):
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
        check(all(i.error is None for i in dead.items), "undecodable dead letter", result)
        check(all(d.error.strip() for d in letters), "a dead letter without a reason", result)
        check(alive, f"the worker died: {worker.log_tail()}", result)
        check(not missing, f"{len(missing)} rejected records without a dead letter, e.g. {sorted(missing)[:3]}", result)
        check(
            not unexpected,
            f"{len(unexpected)} dead letters for records that were valid, e.g. {[d.error for d in letters if (d.source_topic, d.partition, d.offset) in unexpected][:3]}",
            result,
        )
        check(len(letters) == len(rejected), f"{len(letters)} dead letters for {len(rejected)} rejected records", result)
        check(not missing_obs, f"{len(missing_obs)} of {len(expected)} observations of the valid stream missing", result)
        check(not differing, f"{len(differing)} observations differ from the reference (duplicates counted twice?)", result)
        return result
    finally:
        worker.stop()


def _diff(want: Observation, got: list[Observation]) -> dict[str, Any]:
    """What differs between the reference and each published copy of one observation."""
    from events import to_dict

    w = to_dict(want)
    return {
        "id": want.observation_id,
        "copies": [{k: (w[k], v) for k, v in to_dict(g).items() if w.get(k) != v and k not in ("solo", "co_solo")} for g in got],
    }


def _same_window(a: Observation, b: Observation) -> bool:
    """The same window of the same jobs: samples, job, co-runners, labelled or not."""
    return (a.samples, a.job_id, a.job_type, sorted(a.co_job_ids), a.interference_pct is None) == (
        b.samples,
        b.job_id,
        b.job_type,
        sorted(b.co_job_ids),
        b.interference_pct is None,
    )


def _same(a: Observation, b: Observation, tol: float = 1e-6) -> bool:
    for p in ("E_pct", "T_pct", "S_pct", "V_pct", "R_pct", "W_pct", "interference_pct"):
        x, y = getattr(a, p), getattr(b, p)
        if (x is None) != (y is None) or (x is not None and abs(x - y) > tol * max(1.0, abs(x))):
            return False
    return a.samples == b.samples and sorted(a.co_job_ids) == sorted(b.co_job_ids)


# ----------------------------------------------------------------------------- 1. worker crash
def _checkpointed_profiles(settings: Settings) -> int:
    """Solo profiles in the worker's local stage-1 checkpoint (0 when none was written yet)."""
    import json

    path = Path(settings.state_dir) / "stage1.json"
    try:
        return len(json.loads(path.read_bytes()).get("stage1", {}).get("profiles", {}))
    except (OSError, ValueError):
        return 0


@dataclass(frozen=True)
class Fleet:
    """The simulated fleet a worker scenario streams: ``gpus`` GPUs, ``sim_s`` seconds of data sent over ``run_s``
    real seconds from ``seed``; ``resume_timeout_s``: how long the scenario waits for the workers to resume."""

    gpus: int
    sim_s: float
    run_s: float
    seed: int = 0
    resume_timeout_s: float = 120.0


CRASH_GPU_MODEL = "v100"
GPUS_PER_HOST = 1
"""Simulated GPUs per host in the worker-fault scenarios.  Both input topics are keyed by host, and these
scenarios move partitions' GPUs between workers: with 8 GPUs to a host, an 8-GPU fleet would sit in one
partition and a rebalance could move none of it."""
START_TS = 1_700_000_000.0


class PacedSender:
    """Sends ``events`` over about ``run_s`` real seconds from a thread (the simulator 'running').

    ``holds``: (event index, gate) pairs; the sender stops before that event until the gate is set, so that a
    fault the caller injects at its own pace still finds events left to send (the pacing restarts after each)."""

    def __init__(
        self, settings: Settings, events: list[tuple[str, Any]], run_s: float, holds: Iterable[tuple[int, Any]] = ()
    ) -> None:
        import threading

        self.settings = settings
        self.events = events
        self.run_s = run_s
        self.holds = sorted(holds, key=lambda h: h[0])
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

                def flush_and_sleep(seconds: float) -> None:  # what is due goes out before the pause
                    p.flush(30)
                    time.sleep(seconds)

                rate_per_s = len(self.events) / self.run_s
                bounds = [0, *(i for i, _ in self.holds), len(self.events)]
                gates = [None, *(g for _, g in self.holds)]
                for start, end, gate in zip(bounds, bounds[1:], gates, strict=False):
                    if gate is not None:
                        p.flush(30)
                        gate.wait()
                    for topic, record in at_rate(self.events[start:end], rate_per_s, min_sleep_s=0.02, sleep=flush_and_sleep):
                        p.send(topic, record)
                        self.sent += 1
                p.flush(60)
        except BaseException as exc:  # reported by the caller
            self.error = exc
        finally:
            self.done.set()


@dataclass(frozen=True)
class Kill:
    """One SIGKILL of :func:`worker_crash` and what the restarted worker came back with."""

    learned_before: int  # observations the models had learned at the kill
    no_solo_before: int  # job-windows held for a solo profile until the kill (the counter restarts)
    saved_profiles: int  # solo profiles in the local checkpoint the kill left
    ready_s: float  # kill to the restarted worker's web server answering
    recovery_s: float  # kill to its first prediction
    restored_profiles: int
    restored_gpus: int
    saved_observations: int  # observations in the models the kill left on disk
    models_restored: int  # observations the restored models held (learned before the kill)


def _saved_observations(settings: Settings) -> int:
    """Observations the models saved in the worker's state directory had learned (0 when none were saved)."""
    from models.environment import STATE_FILE
    from models.persist import read_state
    from models.state import EnvironmentState

    return sum(read_state(p, EnvironmentState).observations for p in (Path(settings.state_dir) / "models").glob(f"*/{STATE_FILE}"))


def _kill_and_restart(worker: Any, settings: Settings, resume_timeout_s: float, killed: Any = None) -> Kill:
    """SIGKILL ``worker`` (then set ``killed``), restart it on a fresh web port, wait for its first prediction;
    what it restored."""
    from aip.broker import free_port
    from aip.faults.worker import wait_until

    board = worker.get("/leaderboard") if worker.alive() else {}
    learned_before = int(board.get(CRASH_GPU_MODEL, {}).get("observations", 0))
    no_solo_before = int(worker.counter("aip_stream_stage_events_total", stage="stage1", kind="no_solo_profile"))
    worker.kill()
    if killed is not None:
        killed.set()
    saved_profiles = _checkpointed_profiles(settings)
    saved_observations = _saved_observations(settings)
    killed_at = time.monotonic()
    worker.web_port = free_port()
    worker.start()
    worker.wait_ready()
    ready_s = time.monotonic() - killed_at
    wait_until(
        lambda: worker.counter("aip_stream_published_records_total", topic="predictions") > 0,
        resume_timeout_s,
        "predictions from the restarted worker",
    )
    recovery_s = time.monotonic() - killed_at

    def stage1(kind: str) -> int:
        return int(worker.counter("aip_stream_stage_events_total", stage="stage1", kind=kind))

    return Kill(
        learned_before=learned_before,
        no_solo_before=no_solo_before,
        saved_profiles=saved_profiles,
        saved_observations=saved_observations,
        ready_s=ready_s,
        recovery_s=recovery_s,
        restored_profiles=stage1("restored_profiles"),
        restored_gpus=stage1("restored_gpus"),
        models_restored=int(worker.counter("aip_stream_stage_events_total", stage="stage2", kind="models_restored_observations")),
    )


def _saved_after_learning(worker: Any) -> Callable[[], bool]:
    """A condition: the worker saved its models at least once after its leaderboard showed a learned observation."""
    base: float | None = None

    def ready() -> bool:
        nonlocal base
        saves = worker.counter("aip_stream_stage_events_total", stage="stage2", kind="models_saved_committed")
        if base is None:
            try:
                board = worker.get("/leaderboard").get(CRASH_GPU_MODEL) or {}
            except OSError:  # not answering yet
                return False
            if board.get("observations", 0) > 0:
                base = saves
            return False
        return saves > base

    return ready


def worker_crash(
    settings: Settings, workdir: Path, fleet: Fleet = Fleet(8, 900.0, 40.0), kills: int = 1, progress: Progress = _quiet
) -> dict[str, Any]:
    """SIGKILL the worker ``kills`` times at random moments while a simulated fleet streams in; restart it each time.

    Checks: every window yields its observation once, as the reference stage 1 computes it; each restarted worker
    restored the models and solo profiles its last save left on disk; and the final models learned every labelled
    observation exactly once (what was learned after the last save is learned again from the committed offset)."""
    import random
    import threading

    from aip.faults.worker import wait_until
    from producers.sim import Simulator
    from transport import ensure_project_topics

    gpus, sim_s, run_s, seed, resume_timeout_s = astuple(fleet)
    rng = random.Random(seed)
    events = list(
        Simulator(
            gpus=gpus, gpu_model=CRASH_GPU_MODEL, seed=seed, start_ts=START_TS, duration_s=sim_s, gpus_per_host=GPUS_PER_HOST
        ).events()
    )
    expected = reference_observations(settings, events)
    ensure_project_topics(settings)
    worker = start_worker(settings, workdir, "worker-crash").start()
    worker.wait_ready()
    obs = TopicReader(settings, "interference.observations")
    boards = TopicReader(settings, "models.leaderboard")
    moments = sorted(rng.uniform(0.15, 0.85) * run_s for _ in range(kills))
    # the sender waits at each kill's share of the events until that kill happened: a loaded machine that
    # reaches a kill late still has events left to send, and the restarted worker something to predict on
    killed = [threading.Event() for _ in moments]
    sender = PacedSender(
        settings, events, run_s, holds=[(int(m / run_s * len(events)), k) for m, k in zip(moments, killed, strict=True)]
    )
    sender.start()
    t0 = time.monotonic()
    done: list[Kill] = []
    try:
        for moment, gate in zip(moments, killed, strict=True):
            wait_until(lambda m=moment: time.monotonic() - t0 >= m, run_s + 60, "the kill moment", interval_s=0.05)  # type: ignore[misc]
            # what the kill is to show coming back (models from local persistence) must exist first: on a loaded
            # machine the worker may not have saved any by the random moment
            wait_until(_saved_after_learning(worker), resume_timeout_s, "a models save after the first learned observation")
            done.append(_kill_and_restart(worker, settings, resume_timeout_s, killed=gate))
            progress(
                f"SIGKILL at {moment:.1f} s ({sender.sent} of {len(events)} events sent); predictions resumed "
                f"{done[-1].recovery_s:.1f} s after it; restored {done[-1].restored_gpus} GPUs, "
                f"{done[-1].restored_profiles} solo profiles, models with {done[-1].models_restored} observations"
            )
        wait_until(sender.done.is_set, run_s + 120, "the simulator to finish")
        if sender.error is not None:
            raise sender.error
        got = _await_observations(obs, expected, 120, "every expected observation")
        ids = Counter(o.observation_id for o in got)
        by_id = {o.observation_id: o for o in got}
        missing = set(expected) - set(ids)
        differing = [i for i in expected if i in by_id and not _same(expected[i], by_id[i], tol=1e-3)]
        # after a restart the backlog is read with skew across partitions, so a solo profile can have taken a window
        # more or less than the time-ordered reference's when a co-located window is measured: its percentages can
        # differ; its samples and co-runners cannot
        misshapen = [i for i in expected if i in by_id and not _same_window(expected[i], by_id[i])]
        extra = {o.observation_id for o in got if o.colocated} - set(expected)  # solo windows: the reference has none
        stage2_dupes = worker.counter("aip_stream_stage_events_total", stage="stage2", kind="duplicates")
        # stage-1 windows whose job had no solo profile yet (the reference has such windows too)
        no_solo = sum(k.no_solo_before for k in done) + int(
            worker.counter("aip_stream_stage_events_total", stage="stage1", kind="no_solo_profile")
        )
        labelled = _labelled(got)
        try:
            wait_until(lambda: _learned(worker, CRASH_GPU_MODEL) >= labelled, 60, "the models to learn every observation", 0.2)
        except TimeoutError:
            pass  # reported below
        learned = _learned(worker, CRASH_GPU_MODEL)
        lost = len(missing)
        result = {
            "what": f"SIGKILL the worker {kills}x at random moments while {gpus} simulated GPUs stream {sim_s:g} s of data "
            f"in {run_s:g} s; restart each time",
            "sent": len(events),
            "received": len(expected) - len(missing),
            "lost": lost,
            "recovery_s": round(max(k.recovery_s for k in done), 1) if done else None,
            "observations_missing": len(missing),
            "no_solo_profile_windows": no_solo,
            "recovery_each_s": [round(k.recovery_s, 1) for k in done],
            "web_ready_each_s": [round(k.ready_s, 1) for k in done],
            "observations_expected": len(expected),
            "observations_published": sum(ids.values()),
            "observations_duplicated": sum(v - 1 for v in ids.values() if v > 1),
            "observations_differing": len(differing),
            "differing_examples": [_diff(expected[i], [o for o in got if o.observation_id == i]) for i in differing[:3]],
            "observations_unexpected": len(extra),
            "observations_misshapen": len(misshapen),
            "duplicates_skipped_stage2": int(stage2_dupes),
            "learned_before_kills": [k.learned_before for k in done],
            "saved_observations": [k.saved_observations for k in done],
            "restored_gpus": [k.restored_gpus for k in done],
            "restored_solo_profiles": [k.restored_profiles for k in done],
            "checkpointed_solo_profiles": [k.saved_profiles for k in done],
            "models_restored_observations": [k.models_restored for k in done],
            "learned_final": learned,
            "unique_observations": len(ids),
            "labelled_observations": labelled,
        }
        progress(str(result))
        check(
            not lost,
            f"{len(missing)} of {len(expected)} observations missing ({no_solo} job-windows had no solo profile yet), "
            f"e.g. {sorted(missing)[:3]}",
            result,
        )
        check(not extra, f"{len(extra)} observations the reference does not have, e.g. {sorted(extra)[:3]}", result)
        check(
            not misshapen,
            f"{len(misshapen)} observations with other samples or co-runners than the reference's, e.g. "
            f"{[_diff(expected[i], [by_id[i]]) for i in misshapen[:3]]}",
            result,
        )
        check(
            all(0 < k.models_restored == k.saved_observations for k in done),
            f"restored models with {result['models_restored_observations']} observations, but the saves the kills left "
            f"held {result['saved_observations']} (learned before the kills: {result['learned_before_kills']})",
            result,
        )
        check(
            learned == labelled,
            f"learned {learned} observations but {labelled} labelled ones exist (learned twice or not at all)",
            result,
        )
        check(
            result["restored_solo_profiles"] == result["checkpointed_solo_profiles"],
            f"solo profiles in the checkpoint {result['checkpointed_solo_profiles']} but restored "
            f"{result['restored_solo_profiles']} after the restarts",
            result,
        )
        return result
    finally:
        sender.done.wait(5)
        obs.close()
        boards.close()
        worker.stop()


# ----------------------------------------------------------------------------- 2. broker outage
def _seq_keys(items: Iterable[Any]) -> set[tuple[str, int, float]]:
    return {(i.record.gpu_uuid, i.record.seq, i.record.ts) for i in items if i.record is not None}


def broker_outage(
    settings: Settings,
    workdir: Path,
    fleet: Fleet = Fleet(4, 1800.0, 90.0, 7),
    outage_s: float = 30.0,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Stop the (memory-only) broker ``outage_s`` while a spool-backed simulator producer and a worker run; restart it.

    Checks: every sample reaches the broker (seq), the worker reconnects by itself and publishes
    observations and predictions again, and a worker restarted after the broker lost everything
    gets its solo profiles back from its local checkpoint.
    """
    import dataclasses
    import threading

    from aip.broker import EmbeddedBroker, free_port
    from aip.faults.worker import wait_until
    from producers.publisher import Publisher
    from producers.sim import Simulator
    from transport import ensure_project_topics

    gpus, sim_s, run_s, seed, resume_timeout_s = astuple(fleet)
    port = free_port()
    broker = EmbeddedBroker(port=port).start()
    settings = dataclasses.replace(settings, broker=broker.address)
    events = list(Simulator(gpus=gpus, gpu_model="k80", seed=seed, start_ts=START_TS, duration_s=sim_s).events())
    samples = {(r.gpu_uuid, r.seq, r.ts) for t, r in events if t == METRICS}
    ensure_project_topics(settings)
    worker = start_worker(settings, workdir, "worker-outage").start()
    pub = Publisher(settings, "outage-sim", retry_s=0.2)
    stop = threading.Event()

    def feed() -> None:  # the simulator 'running' in real time (sped up), through the spool
        for topic, record in at_rate(events, len(events) / run_s, min_sleep_s=0.01, sleep=stop.wait):
            if stop.is_set():
                return
            pub.publish(topic, record)

    thread = threading.Thread(target=feed, daemon=True)
    before: list[Any] = []
    try:
        worker.wait_ready()
        thread.start()

        def published(topic: str) -> float:
            return worker.counter("aip_stream_published_records_total", topic=topic)

        wait_until(lambda: published("predictions") > 0, resume_timeout_s, "first predictions")
        # hold the sender so that everything the broker acknowledged is read before it dies
        pub.pause()
        reader = TopicReader(settings, METRICS)
        last = [-1.0]

        def settled() -> bool:  # the batch in flight when paused has been acknowledged
            now = pub.metrics.value("aip_producer_records_sent_total")
            done, last[0] = now == last[0], now
            return done

        wait_until(settled, 30, "the publisher's batch in flight", interval_s=0.5)
        delivered = _sent_samples(pub, events)
        wait_until(
            lambda: reader.poll(0.5) is not None and len(_seq_keys(reader.items)) >= delivered,
            60,
            "the broker's samples read before the outage",
        )
        before = list(reader.items)
        reader.close()
        obs_at_stop, preds_at_stop = published("observations"), published("predictions")
        broker.stop()
        pub.resume()
        down_at = time.monotonic()
        progress(f"broker stopped; {len(before)} samples read before; spool pending {pub.pending}")
        wait_until(lambda: time.monotonic() - down_at >= outage_s, outage_s + 10, "the outage", interval_s=0.5)
        spooled_during = pub.pending
        worker_alive_during = worker.alive()
        broker = EmbeddedBroker(port=port).start()
        up_at = time.monotonic()
        ensure_project_topics(settings)  # memory-only: the topics are gone (the publisher recreates its own too)
        wait_until(lambda: published("observations") > obs_at_stop, resume_timeout_s, "observations after the restart")
        wait_until(lambda: published("predictions") > preds_at_stop, resume_timeout_s, "predictions after the restart")
        recovery_s = time.monotonic() - up_at
        progress(f"worker resumed {recovery_s:.1f} s after the broker came back")
        thread.join(run_s + 60)
        pub.wait_drained(60)
        after_reader = TopicReader(settings, METRICS)
        wanted = samples - _seq_keys(before)
        try:
            wait_until(
                lambda: after_reader.poll() is not None and wanted <= _seq_keys(after_reader.items),
                60,
                "every sample after the restart",
            )
        except TimeoutError:
            pass  # counted as lost below
        got = _seq_keys(before) | _seq_keys(after_reader.items)
        after_reader.close()
        lost = samples - got
        # the broker kept nothing: a worker restarted now gets solo profiles only from its local checkpoint
        worker.stop()  # a clean stop writes the last checkpoint
        profiles_saved = _checkpointed_profiles(settings)
        worker.web_port = free_port()
        worker.start()
        worker.wait_ready()
        restored = int(worker.counter("aip_stream_stage_events_total", stage="stage1", kind="restored_profiles"))
        result = {
            "what": f"stop the memory-only broker {outage_s:g} s while a spool-backed simulator producer ({gpus} GPUs, "
            f"{sim_s:g} s of data in {run_s:g} s) and a worker run; restart it; then restart the worker",
            "sent": len(samples),
            "received": len(got & samples),
            "lost": len(lost),
            "recovery_s": round(recovery_s, 1),
            "spooled_during_outage": spooled_during,
            "dropped_by_spool": int(pub.metrics.value("aip_producer_records_dropped_total")),
            "worker_alive_during_outage": worker_alive_during,
            "checkpointed_solo_profiles": profiles_saved,
            "restored_solo_profiles_after_worker_restart": restored,
        }
        progress(str(result))
        check(not lost, f"{len(lost)} of {len(samples)} samples lost, e.g. {sorted(lost)[:3]}", result)
        check(worker_alive_during, "the worker died during the outage", result)
        check(restored == profiles_saved > 0, f"solo profiles: {profiles_saved} checkpointed, {restored} restored", result)
        return result
    finally:
        stop.set()
        pub.close(timeout_s=5)
        worker.stop()
        broker.stop()


def _sent_samples(pub: Any, events: list[tuple[str, Any]]) -> int:
    """Samples among the records the publisher had delivered (records alternate topics in event order)."""
    sent = int(pub.metrics.value("aip_producer_records_sent_total"))
    return sum(1 for t, _ in events[:sent] if t == METRICS)


# ----------------------------------------------------------------------------- 4. load soak
def _soak_sample(gpu: int, seq: int, ts: float, model: str) -> bytes:
    from events import encode

    return encode(
        MetricSample(
            ts=ts,
            host=f"soak-{gpu // 8:04d}",
            gpu_uuid=f"GPU-soak-{gpu:05d}",
            gpu_index=gpu % 8,
            gpu_model=model,
            seq=seq,
            power_w=150.0 + (gpu % 50),
            temp_c=60.0,
            sm_util_pct=70.0,
            mem_util_pct=40.0,
            mem_used_mb=8000.0,
            mem_total_mb=16000.0,
            pcie_rx_kbps=1000.0,
            pcie_tx_kbps=800.0,
            producer_id=f"soak-{gpu // 8:04d}",
        )
    )


def load_soak(
    settings: Settings,
    workdir: Path,
    duration_s: float = 600.0,
    gpus: int = 2000,
    hz: float = 2.0,
    sample_every_s: float = 5.0,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """``gpus`` GPUs at ``hz`` samples/s each (2,000 x 2 Hz = twice the nominal 2,000 GPUs at 1 Hz) into one worker.

    Lag is produced minus consumed records (the worker's ``aip_stream_consumed_records_total``; Tansu's
    end offsets undercount, so they are not used); RSS of the worker process is sampled; both are
    reported with their slopes after a warm-up (the first fifth of the run).
    """
    import threading

    from aip.faults.worker import wait_until
    from events import encode
    from transport import RecordProducer, ensure_project_topics

    ensure_project_topics(settings)
    worker = start_worker(settings, workdir, "worker-soak").start()
    produced = [0]
    stop = threading.Event()
    model = "soak-gpu"
    t_start = time.time()

    def produce() -> None:
        with RecordProducer(settings) as p:
            for g in range(gpus):  # one black-box job per GPU: windows are solo and update profiles
                ev = JobEvent(
                    ts=t_start - 1,
                    kind="started",
                    job_id=f"soak-{g}",
                    job_type="resnet",
                    gpu_uuid=f"GPU-soak-{g:05d}",
                    host=f"soak-{g // 8:04d}",
                    pid=1,
                )
                p.send_raw(LIFECYCLE, encode(ev), key=ev.gpu_uuid.encode())
            for tick in at_rate(itertools.count(), hz, sleep=stop.wait):
                if stop.is_set():
                    break
                ts = t_start + tick / hz
                for g in range(gpus):
                    p.send_raw(METRICS, _soak_sample(g, tick, ts, model), key=f"GPU-soak-{g:05d}".encode())
                produced[0] += gpus
            p.flush(60)

    thread = threading.Thread(target=produce, daemon=True)
    series: list[tuple[float, int, float, float]] = []  # (t, lag, rss_mb, consumed)
    try:
        worker.wait_ready()
        thread.start()
        t0 = time.monotonic()
        while time.monotonic() - t0 < duration_s:
            wait_until(
                lambda n=len(series): time.monotonic() - t0 >= (n + 1) * sample_every_s,
                sample_every_s + 5,
                "next sample",
                interval_s=0.2,
            )  # type: ignore[misc]
            consumed = worker.counter("aip_stream_consumed_records_total", topic=METRICS)
            series.append((time.monotonic() - t0, int(produced[0] - consumed), worker.rss_mb(), consumed))
            if len(series) % 12 == 0:
                progress(f"soak t={series[-1][0]:.0f}s lag={series[-1][1]} rss={series[-1][2]:.0f} MB")
        stop.set()
        thread.join(60)
        alive = worker.alive()
        warm = [p for p in series if p[0] >= duration_s / 5]
        rss_slope = _slope([(p[0] / 60, p[2]) for p in warm])
        lag_slope = _slope([(p[0], p[1]) for p in warm])
        rate = (warm[-1][3] - warm[0][3]) / (warm[-1][0] - warm[0][0]) if len(warm) > 1 else 0.0
        result = {
            "what": f"{gpus} GPUs at {hz:g} Hz ({gpus * hz:,.0f} samples/s, twice nominal) into one worker for {duration_s:g} s",
            "sent": produced[0],
            "received": int(series[-1][3]) if series else 0,
            "lost": None,
            "recovery_s": None,
            "offered_per_s": gpus * hz,
            "consumed_per_s_after_warmup": round(rate, 1),
            "lag_max_records": max(p[1] for p in series) if series else None,
            "lag_end_records": series[-1][1] if series else None,
            "lag_slope_records_per_s": round(lag_slope, 1),
            "rss_start_mb": round(warm[0][2], 1) if warm else None,
            "rss_end_mb": round(series[-1][2], 1) if series else None,
            "rss_slope_mb_per_min": round(rss_slope, 2),
            "worker_alive": alive,
            "lag_bounded": lag_slope <= 0.02 * gpus * hz,
        }
        progress(str(result))
        check(alive, f"the worker died: {worker.log_tail()}", result)
        return result
    finally:
        stop.set()
        worker.stop()


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x (0 for fewer than two points)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


# ----------------------------------------------------------------------------- 5. several workers
FLEET_GPU_MODEL = "v100"


def _worker_settings(settings: Settings, workdir: Path, name: str) -> Settings:
    """A worker's settings as on a host of its own: its own state directory (and so its own group instance id)."""
    import dataclasses

    return dataclasses.replace(settings, state_dir=str(workdir / name / "state"))


def _board(worker: Any, env: str) -> dict[str, Any]:
    try:
        return dict(worker.get("/leaderboard").get(env) or {}) if worker.alive() else {}
    except OSError:
        return {}


def _learned(worker: Any, env: str) -> int:
    return int(_board(worker, env).get("observations", 0))


def _stage2(worker: Any, kind: str) -> int:
    """A stage-2 event counter of ``worker`` (``observations``: co-located ones read, ``rebuilt``: replayed)."""
    return int(worker.counter("aip_stream_stage_events_total", stage="stage2", kind=kind))


def selected_mae(board: dict[str, Any]) -> dict[str, float | None]:
    """``"<mode>:<category>"`` -> the rolling MAE (points) of the model selected for it, from a leaderboard."""
    out: dict[str, float | None] = {}
    for slot, model in sorted((board.get("selected") or {}).items()):
        mode, _, cat = slot.partition(":")
        maes = [
            e.get("mae")
            for e in board.get("entries", [])
            if (e.get("model"), e.get("mode"), e.get("category")) == (model, mode, cat)
        ]
        out[slot] = round(maes[0], 3) if maes and maes[0] is not None else None
    return out


def _profiles(worker: Any) -> dict[str, Any] | None:
    try:
        return dict(worker.get("/profiles")) if worker.alive() else None
    except OSError:
        return None


def profiles_agree(workers: list[Any], timeout_s: float = 30.0) -> bool:
    """Wait until every worker reports the same non-empty solo profiles (each publishes at its checkpoints)."""
    from aip.faults.worker import wait_until

    def same() -> bool:
        views = [_profiles(w) for w in workers]
        return bool(views[0]) and all(v == views[0] for v in views)

    try:
        return bool(wait_until(same, timeout_s, "identical solo profiles", interval_s=0.5))
    except TimeoutError:
        return False


def _fleet(gpus: int, seed: int, start_ts: float, sim_s: float) -> list[tuple[str, Any]]:
    from producers.sim import Simulator

    return list(
        Simulator(
            gpus=gpus, gpu_model=FLEET_GPU_MODEL, seed=seed, start_ts=start_ts, duration_s=sim_s, gpus_per_host=GPUS_PER_HOST
        ).events()
    )


def _labelled(observations: Iterable[Observation]) -> int:
    return len({o.observation_id for o in observations if o.interference_pct is not None})


def _learned_within(worker: Any, labelled: int, timeout_s: float) -> bool:
    """Whether ``worker``'s models reach ``labelled`` learned observations within ``timeout_s`` (False: they did not)."""
    from aip.faults.worker import wait_until

    try:
        return bool(wait_until(lambda: _learned(worker, FLEET_GPU_MODEL) >= labelled, timeout_s, "learning", interval_s=0.2))
    except TimeoutError:
        return False


def _wait_learned_and_saved(workers: list[Any], obs: TopicReader, expected: Iterable[str], timeout_s: float) -> Any:
    """Wait until the observations topic holds every ``expected`` observation and is quiet, one worker learned every
    labelled observation and has saved its models and committed twice since; return that worker (the one serving
    stage 2)."""
    from aip.faults.worker import wait_until

    want = _labelled(_await_observations(obs, expected, timeout_s, "every observation of the fleet"))
    server = wait_until(
        lambda: next((w for w in workers if _learned(w, FLEET_GPU_MODEL) >= want), None),
        timeout_s,
        f"a worker that learned all {want} labelled observations",
        interval_s=0.5,
    )

    def saves() -> float:
        return server.counter("aip_stream_stage_events_total", stage="stage2", kind="models_saved_committed")

    before = saves()
    wait_until(lambda: saves() >= before + 2, timeout_s, "two model saves and commits", interval_s=0.5)
    # a save comes right before faust sends the commit, and on a loaded machine that commit can lag behind: the
    # next owner resumes at the committed offset (and rebuilds below it), so wait until it covers the whole topic
    wait_until(
        lambda: committed_through_end(server.settings, "interference.observations"),
        timeout_s,
        "the group's committed offsets to reach the end of the observations topic",
        interval_s=0.5,
    )
    return server


def committed_through_end(settings: Settings, topic: str) -> bool:
    """Whether the workers' consumer group has committed, on every partition of ``topic`` (a base name) that holds
    records, the partition's end offset."""
    from streams.app import app_id
    from transport import group_offsets

    offsets = group_offsets(settings, app_id(settings), Topics(settings.topic_prefix).name(topic))
    return bool(offsets) and all(committed >= end for committed, end in offsets.values() if end > 0)


def worker_failover(
    settings: Settings, workdir: Path, fleet: Fleet = Fleet(16, 600.0, 30.0, 11), progress: Progress = _quiet
) -> dict[str, Any]:
    """Two workers (own state directories, as on two hosts); once the one serving stage 2 has learned a fleet's
    observations, saved its models and committed, SIGKILL it for good and run a second fleet.

    Checks: the survivor's models hold at least what the dead worker's had learned (rebuilt from the
    observations topic), every window of the second fleet yields its observation (against a reference
    stage 1 fed the fleet's events), nothing is learned twice, and both workers held the same solo profiles.
    """
    from aip.faults.worker import stop_all, wait_until
    from transport import ensure_project_topics

    gpus, sim_s, run_s, seed, resume_timeout_s = astuple(fleet)
    ensure_project_topics(settings)
    workers = [start_worker(_worker_settings(settings, workdir, name), workdir, f"worker-{name}").start() for name in ("a", "b")]
    obs = TopicReader(settings, "interference.observations")
    try:
        for w in workers:
            w.wait_ready()
        first = _fleet(gpus, seed, START_TS, sim_s)
        sender = PacedSender(settings, first, run_s).start()
        wait_until(sender.done.is_set, run_s + 120, "the first fleet")
        if sender.error is not None:
            raise sender.error
        dead = _wait_learned_and_saved(workers, obs, reference_observations(settings, first), resume_timeout_s)
        survivor = next(w for w in workers if w is not dead)
        agree = profiles_agree(workers)
        profiles_dead, profiles_survivor = _profiles(dead), _profiles(survivor)
        # its leaderboard as it answers (a loaded machine can time a request out: _board is then empty)
        board_before = wait_until(lambda: _board(dead, FLEET_GPU_MODEL), 30, "the stage-2 worker's leaderboard", interval_s=0.5)
        learned_before = int(board_before.get("observations", 0))
        # what the survivor had learned itself (it may have served the observations partition before the group settled)
        survivor_before = _learned(survivor, FLEET_GPU_MODEL)
        # counted alike (co-located windows, labelled or not): what the rebuild is to read is what the survivor lacks
        colocated_first = len({o.observation_id for o in obs.records() if o.colocated})
        rebuilt_at_kill = _stage2(survivor, "rebuilt")
        survivor_colocated = _stage2(survivor, "observations") + rebuilt_at_kill
        predictions_at_kill = survivor.counter("aip_stream_published_records_total", topic="predictions")
        dead.kill()
        killed_at = time.monotonic()
        progress(f"SIGKILL the stage-2 worker for good after it learned {learned_before}; second fleet starts")
        second = _fleet(gpus, seed + 1, START_TS + sim_s + 600.0, sim_s)
        expected = reference_observations(settings, second)
        sender = PacedSender(settings, second, run_s).start()
        wait_until(
            lambda: survivor.counter("aip_stream_published_records_total", topic="predictions") > predictions_at_kill,
            resume_timeout_s + run_s,
            "the survivor's first prediction",
            interval_s=0.2,
        )
        recovery_s = time.monotonic() - killed_at
        progress(f"survivor predicts {recovery_s:.1f} s after the kill")
        wait_until(sender.done.is_set, run_s + 120, "the second fleet")
        if sender.error is not None:
            raise sender.error

        records = _await_observations(obs, expected, resume_timeout_s, "every observation of the second fleet")
        labelled = _labelled(records)
        learned_all = _learned_within(survivor, labelled, 60)
        board_after = _board(survivor, FLEET_GPU_MODEL)
        learned_after = int(board_after.get("observations", 0))
        missing = set(expected) - {o.observation_id for o in records}
        result = {
            "what": f"two workers; SIGKILL for good the one serving stage 2 after it learned a {gpus}-GPU fleet "
            f"({sim_s:g} s of data in {run_s:g} s) and saved; a second fleet on the survivor",
            "sent": len(first) + len(second),
            "received": len(expected) - len(missing),
            "lost": len(missing),
            "recovery_s": round(recovery_s, 1),
            "learned_before": learned_before,
            "survivor_learned_before": survivor_before,
            "learned_after": learned_after,
            "labelled_observations": labelled,
            "mae_before": selected_mae(board_before),
            "mae_after": selected_mae(board_after),
            "rebuilds": int(survivor.counter("aip_stream_stage_events_total", stage="stage2", kind="rebuilds")),
            "rebuilt_observations": _stage2(survivor, "rebuilt"),
            "rebuilt_after_kill": _stage2(survivor, "rebuilt") - rebuilt_at_kill,
            "survivor_colocated_before": survivor_colocated,
            "colocated_first_fleet": colocated_first,
            "observations_expected_after_kill": len(expected),
            "profiles_agree": agree and profiles_dead == profiles_survivor,
            "solo_profiles": len(profiles_survivor or {}),
        }
        progress(str(result))
        check(
            learned_all,
            f"the survivor learned {learned_after} of {labelled} labelled observations in 60 s after the second fleet "
            f"({learned_before} learned by the dead worker, {result['rebuilt_observations']} rebuilt from the topic)",
            result,
        )
        check(
            learned_after == labelled,
            f"learned {learned_after} but {labelled} labelled observations exist (learned twice)",
            result,
        )
        check(
            result["rebuilt_after_kill"] + survivor_colocated == colocated_first,
            f"the survivor rebuilt {result['rebuilt_after_kill']} co-located observations after the kill and had read "
            f"{survivor_colocated} itself, but the first fleet has {colocated_first}",
            result,
        )
        check(not missing, f"{len(missing)} of {len(expected)} windows after the kill without an observation", result)
        check(result["profiles_agree"], "the workers' solo profiles differ", result)
        return result
    finally:
        obs.close()
        stop_all(workers)


def in_stable_group(worker: Any) -> bool:
    """Whether ``worker`` answers and holds an assignment of a stable consumer-group generation."""
    from aip.faults.worker import metric_values

    try:
        if not worker.ready():
            return False
        out = metric_values(worker.get("/metrics", timeout_s=10.0), "aip_stream_group_out_seconds")
    except OSError:
        return False
    return out == [0.0]


def rebalance(
    settings: Settings, workdir: Path, fleet: Fleet = Fleet(16, 900.0, 45.0, 13), progress: Progress = _quiet
) -> dict[str, Any]:
    """Two workers; a third joins a third into a fleet's run, one of the first two leaves cleanly (SIGTERM) at
    two thirds.  Every window yields its observation (against a reference stage 1), the worker that ends up
    serving stage 2 learned every labelled observation once, and all remaining workers hold the same solo profiles.

    The leaving worker leaves once the group is stable with the third in it: the fleet waits at two thirds until
    then.  A join that races a leaving leader wedges the embedded broker's group for good (docs/RELIABILITY.md,
    Known limitations), and under load the third worker can take as long to start as the fleet runs."""
    import threading

    from aip.faults.worker import stop_all, wait_until
    from transport import ensure_project_topics

    gpus, sim_s, run_s, seed, resume_timeout_s = astuple(fleet)
    ensure_project_topics(settings)
    workers = {
        name: start_worker(_worker_settings(settings, workdir, name), workdir, f"worker-{name}") for name in ("a", "b", "c")
    }
    obs = TopicReader(settings, "interference.observations")
    try:
        for name in ("a", "b"):
            workers[name].start()
        for name in ("a", "b"):
            workers[name].wait_ready()
        events = _fleet(gpus, seed, START_TS, sim_s)
        expected = reference_observations(settings, events)
        leave_at, left = 2 * len(events) // 3, threading.Event()
        sender = PacedSender(settings, events, run_s, holds=[(leave_at, left)]).start()
        t0 = time.monotonic()
        moves: list[dict[str, Any]] = []
        wait_until(lambda: time.monotonic() - t0 >= run_s / 3, run_s + 60, "a third of the run", interval_s=0.1)
        moves.append({"what": "c joins", "at_s": round(time.monotonic() - t0, 1), "events_sent": sender.sent})
        workers["c"].start()
        progress(f"c joins at {moves[-1]['at_s']} s")
        wait_until(lambda: sender.sent >= leave_at or sender.done.is_set(), run_s + 60, "two thirds of the fleet")
        wait_until(lambda: all(in_stable_group(w) for w in workers.values()), 180, "a stable group with c in it", 0.5)
        moves.append({"what": "a leaves", "at_s": round(time.monotonic() - t0, 1), "events_sent": sender.sent})
        workers["a"].terminate()  # it leaves cleanly while the fleet goes on; stopped for good at the end
        left.set()
        progress(f"a leaves at {moves[-1]['at_s']} s")
        wait_until(sender.done.is_set, run_s + 120, "the fleet")
        if sender.error is not None:
            raise sender.error
        remaining = [workers["b"], workers["c"]]

        records = _await_observations(obs, expected, resume_timeout_s, "every expected observation")
        labelled = _labelled(records)
        try:
            server = wait_until(
                lambda: next((w for w in remaining if _learned(w, FLEET_GPU_MODEL) >= labelled), None),
                60,
                "a remaining worker that learned every labelled observation",
            )
        except TimeoutError:
            server = max(remaining, key=lambda w: _learned(w, FLEET_GPU_MODEL))
        agree = profiles_agree(remaining)
        missing = set(expected) - {o.observation_id for o in records}
        learned = _learned(server, FLEET_GPU_MODEL)
        result = {
            "what": f"two workers, a third joins at a third of a {gpus}-GPU fleet's run ({sim_s:g} s of data in {run_s:g} s), "
            "one of the first two leaves cleanly at two thirds",
            "sent": len(events),
            "received": len(expected) - len(missing),
            "lost": len(missing),
            "recovery_s": None,
            "moves": moves,
            "observations_expected": len(expected),
            "labelled_observations": labelled,
            "learned_final": learned,
            "rebuilds": sum(int(w.counter("aip_stream_stage_events_total", stage="stage2", kind="rebuilds")) for w in remaining),
            "changelog_restored_gpus": sum(
                int(w.counter("aip_stream_stage_events_total", stage="stage1", kind="changelog_restored_gpus")) for w in remaining
            ),
            "input_offsets_skipped": sum(
                int(w.counter("aip_stream_stage_events_total", stage="stage1", kind="input_offsets_skipped")) for w in remaining
            ),
            "profiles_agree": agree,
            "solo_profiles": len(_profiles(remaining[0]) or {}),
            "missing_examples": sorted(missing)[:5],
        }
        progress(str(result))
        check(agree, "the remaining workers' solo profiles differ", result)
        check(learned == labelled, f"the stage-2 worker learned {learned} of {labelled} labelled observations", result)
        check(
            not missing,
            f"{len(missing)} of {len(expected)} windows without an observation: {missing_by_gpu(missing)}\n"
            + handover_story(workers)
            + f"\ninput topics: {input_audit(settings)}",
            result,
        )
        return result
    finally:
        obs.close()
        stop_all(workers.values())


def missing_by_gpu(missing: Iterable[str]) -> dict[str, str]:
    """Observation ids (``gpu|window start|job``) by GPU: how many and the first and last window start.

    >>> missing_by_gpu(["GPU-1|20.000|j", "GPU-1|10.000|k", "GPU-2|5.000|j"])
    {'GPU-1': '2 from 10 to 20', 'GPU-2': '1 from 5 to 5'}
    """
    starts: dict[str, list[float]] = {}
    for oid in missing:
        gpu, start, _job = oid.split("|")
        starts.setdefault(gpu, []).append(float(start))
    return {g: f"{len(v)} from {min(v):.0f} to {max(v):.0f}" for g, v in sorted(starts.items())}


def input_audit(settings: Settings) -> dict[str, str]:
    """What the input topics hold, per topic and partition: records, last offset and gaps between offsets (a lost
    window's trail: were its events ever in the topic?)."""
    offsets: dict[str, list[int]] = {}
    for topic in (METRICS, LIFECYCLE):
        reader = TopicReader(settings, topic)
        try:
            while reader.poll(1.0):
                pass
            for r in reader.items:
                offsets.setdefault(f"{topic}[{r.partition}]", []).append(r.offset)
        finally:
            reader.close()
    out = {}
    for key, offs in sorted(offsets.items()):
        offs = sorted(set(offs))
        gaps = [(a + 1, b - 1) for a, b in itertools.pairwise(offs) if b > a + 1]
        out[key] = f"{len(offs)} records, last offset {offs[-1]}, gaps {gaps[:5]}"
    return out


def handover_story(workers: dict[str, Any]) -> str:
    """What the workers tell of stage 1's partitions moving, and their stage counts, dead letters, lag and held
    job-windows: a lost window's trail."""
    lines = [f"{name}: {line}" for name, w in workers.items() for line in w.handover_lines()]
    told = ("aip_stream_stage_events_total", "aip_stream_deadletters_total", "aip_stream_consumer_lag_records", "aip_stream_held_windows")
    lines += [f"{name}: {w.samples(*told)}" for name, w in workers.items() if w.alive()]
    return "\n".join(lines)


def _await_observations(obs: Any, expected: Iterable[str], timeout_s: float, what: str) -> list[Any]:
    """The observations read once every ``expected`` id has arrived (or ``timeout_s`` passed: the caller counts
    what is missing) and the topic has gone quiet."""
    from aip.faults.worker import wait_until

    want = set(expected)

    def all_observations() -> bool:
        obs.poll()
        return want <= {o.observation_id for o in obs.records()}

    try:
        wait_until(all_observations, timeout_s, what)
    except TimeoutError:
        pass
    wait_until(lambda: not obs.poll(1.0), 60, "the observations topic to go quiet")
    return list(obs.records())

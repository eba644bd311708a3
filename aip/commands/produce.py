"""``aip produce nvml|sim|replay``: one producer, publishing through the spool to Kafka."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from typing import Any

from aip.common import add_kafka_args, broker_errors, settings_from, sigterm_as_interrupt
from aip.errors import CliError

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "produce", help="run one producer: nvml (this host's GPUs), sim (a simulated fleet) or replay (a recording)"
    )
    kinds = p.add_subparsers(dest="source", metavar="SOURCE", required=True)

    nv = kinds.add_parser("nvml", help="sample this host's GPUs with NVML")
    nv.add_argument(
        "--interval", type=_seconds, help="sampling interval, e.g. 1s or 500ms (default: $AIP_SAMPLE_INTERVAL_S, 1 s)"
    )
    nv.add_argument("--duration", type=float, help="stop after this many seconds (default: run until Ctrl-C)")
    nv.add_argument("--no-discovery", action="store_true", help="do not turn unreported compute processes into job events")
    nv.add_argument(
        "--kubernetes",
        action="store_true",
        default=None,
        help="attribute GPUs and processes to the pods of $AIP_NODE_NAME (kubelet PodResources at "
        "$AIP_PODRESOURCES_SOCKET, the Kubernetes API, /proc/<pid>/cgroup); job events come from pods gaining and "
        "losing GPUs (default: $AIP_KUBERNETES, off)",
    )
    _per_gpu_arg(nv)
    add_kafka_args(nv)

    sim = kinds.add_parser("sim", help="a simulated fleet calibrated on Gavel's and MISO's measurements")
    sim.add_argument("--gpus", type=int, default=8, help="simulated GPUs (default 8)")
    sim.add_argument("--gpus-per-host", type=int, default=8, help="GPUs per simulated host (node), so that a fleet has several nodes (default 8)")
    sim.add_argument("--gpu-model", default="v100", choices=("v100", "p100", "k80"), help="environment (default v100)")
    sim.add_argument("--seed", type=int, default=0, help="random seed: the same seed gives the same fleet (default 0)")
    sim.add_argument(
        "--speedup", type=float, default=1.0, help="simulated seconds per real second (default 1; 0 = as fast as possible)"
    )
    sim.add_argument("--fast", action="store_true", help="as fast as possible (same as --speedup 0)")
    sim.add_argument(
        "--duration",
        type=float,
        default=600.0,
        help="run this many real seconds, i.e. duration x speedup simulated seconds (with --fast: simulated seconds); default 600",
    )
    sim.add_argument("--sim-duration", type=float, help="simulated seconds to run (overrides --duration)")
    sim.add_argument("--ground-truth", metavar="PATH", help="write the true interference of every co-location here (JSON lines)")
    _per_gpu_arg(sim)
    add_kafka_args(sim)

    rp = kinds.add_parser("replay", help="re-publish a recording made with `aip tail --json`")
    rp.add_argument("path", help="JSON lines file with gpu.metrics and jobs.lifecycle records")
    rp.add_argument(
        "--speedup", type=float, default=0.0, help="recorded seconds per real second (default 0: as fast as possible)"
    )
    rp.add_argument("--retime", action="store_true", help="shift timestamps so that the recording starts now")
    _per_gpu_arg(rp)
    add_kafka_args(rp)
    p.set_defaults(func=run)


def _per_gpu_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--per-gpu",
        action="store_true",
        help="one gpu.metrics record per GPU sample and one jobs.lifecycle record per job event, for stream workers "
        "older than host batches (default: one record per host and tick with all its GPUs' samples, and one with "
        "its job events)",
    )


def _records(events: Any, per_gpu: bool) -> Any:
    from producers.batching import host_batches

    return events if per_gpu else host_batches(events)


def _samples(record: Any) -> int:
    """GPU samples or job events in one record (a host batch holds several)."""
    return len(getattr(record, "samples", None) or getattr(record, "events", None) or ()) or 1


def _seconds(text: str) -> float:
    t = text.strip().lower()
    try:
        if t.endswith("ms"):
            return float(t[:-2]) / 1000.0
        return float(t[:-1]) if t.endswith("s") else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 1s or 500ms") from None


def run(args: argparse.Namespace) -> int:
    return {"nvml": run_nvml, "sim": run_sim, "replay": run_replay}[args.source](args)


class _Progress:
    """One progress line on stderr every few seconds."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.last = time.monotonic()

    def __call__(self, message: Any) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            print(f"aip produce: {message() if callable(message) else message}", file=sys.stderr, flush=True)


def _publisher(settings: Any, name: str) -> Any:
    from producers.metrics import ProducerMetrics
    from producers.publisher import Publisher, PublisherError
    from transport import check_reachable

    check_reachable(settings)
    metrics = ProducerMetrics()
    metrics.serve(settings.metrics_port)
    try:
        return Publisher(settings, name, metrics=metrics)
    except PublisherError as exc:
        raise CliError(str(exc)) from None


def _finish(pub: Any, summary: dict[str, Any]) -> int:
    left = pub.close(timeout_s=30.0)
    m = pub.metrics
    summary |= {
        "sent": int(m.value("aip_producer_records_sent_total")),
        "spooled": int(m.value("aip_producer_records_spooled_total")),
        "dropped": int(m.value("aip_producer_records_dropped_total")),
        "left_in_spool": left,
    }
    print(json.dumps(summary))
    if left:
        print(
            f"aip produce: {left} records could not be delivered yet; they stay in {pub.spool.dir} for the next run",
            file=sys.stderr,
        )
        return 1
    return 0


def run_sim(args: argparse.Namespace) -> int:
    from producers.pacing import paced
    from producers.sim import Simulator

    speedup = 0.0 if args.fast else args.speedup
    if speedup < 0 or args.gpus < 1 or args.gpus_per_host < 1:
        raise CliError("--speedup must be >= 0, --gpus >= 1 and --gpus-per-host >= 1")
    span = args.sim_duration if args.sim_duration is not None else (args.duration * speedup if speedup > 0 else args.duration)
    settings = settings_from(args)
    with broker_errors(), sigterm_as_interrupt():
        sim = Simulator(
            args.gpus, args.gpu_model, seed=args.seed, start_ts=time.time(), duration_s=span, gpus_per_host=args.gpus_per_host
        )
        pub = _publisher(settings, f"sim-{os.getpid()}")
        counts = {"gpu.metrics": 0, "jobs.lifecycle": 0}
        samples = job_events = 0
        progress = _Progress()
        last_ts = sim.start_ts
        try:
            for topic, record in paced(_records(sim.events(), args.per_gpu), speedup, sim.start_ts):
                pub.publish(topic, record)
                counts[topic] += 1
                if topic == "gpu.metrics":
                    samples += _samples(record)
                else:
                    job_events += _samples(record)
                last_ts = record.ts
                progress(
                    lambda last_ts=last_ts: (
                        f"sim {last_ts - sim.start_ts:.0f}/{span:.0f} s, {sum(counts.values())} events, {pub.pending} waiting for the broker"
                    )
                )
        except KeyboardInterrupt:
            pass
        summary: dict[str, Any] = {
            "source": "sim",
            "gpus": args.gpus,
            "hosts": len({g.host for g in sim.gpus}),
            "gpu_model": args.gpu_model,
            "sim_seconds": round(last_ts - sim.start_ts, 1),
            **counts,
            "gpu_samples": samples,
            "job_events": job_events,
        }
        if args.ground_truth:
            summary["ground_truth_rows"] = sim.write_ground_truth(args.ground_truth)
        return _finish(pub, summary)


def _kubernetes(settings: Any, producer_id: str, host: str) -> Any:
    """The attribution of ``aip produce nvml --kubernetes``, its pod watcher started."""
    from producers.kubernetes.attribution import KubernetesAttribution
    from producers.kubernetes.podresources import PodResourcesClient
    from producers.kubernetes.pods import PodWatcher, api_client
    from producers.publisher import spool_path

    if not settings.node_name:
        raise CliError("--kubernetes needs the node name: set AIP_NODE_NAME (the DaemonSet sets it from spec.nodeName)")
    try:
        client = api_client(settings.kubernetes_api)
    except ModuleNotFoundError:
        raise CliError("the kubernetes client is not installed: pip install 'aip[producer]'", code=2) from None
    except Exception as exc:  # not in a pod and no AIP_KUBERNETES_API
        raise CliError(f"no Kubernetes API configuration ({exc}): run in a pod with a service account, or set AIP_KUBERNETES_API") from None
    watcher = PodWatcher(settings.node_name, lambda: client).start()
    return KubernetesAttribution(
        PodResourcesClient(settings.podresources_socket),
        watcher,
        state_path=spool_path(settings, f"nvml-{host}-kubernetes") / "announced.json",
        producer_id=producer_id,
    )


def _step_collector(path: str, resolve: Any, publish: Any, host: str) -> Any:
    """The node's collector of the training pods' step hooks (``producers.stepcollector``), or None, with one log
    line, where its socket cannot be made: the producer keeps sampling without progress events."""
    from producers.stepcollector import StepCollector

    try:
        return StepCollector(path, resolve, publish, host=host).start()
    except OSError as exc:
        log.warning("no step collector at %s (%s): pods' step hooks are not heard; mount a writable /var/run/aip", path, exc)
        return None


def run_nvml(args: argparse.Namespace, nvml: Any = None) -> int:
    """``aip produce nvml``; ``nvml`` is the NVML module (default: pynvml; tests pass producers.fakenvml)."""
    from producers.discovery import ProcessTracker
    from producers.nvml import NvmlSampler, NvmlUnavailable, run_sampler

    settings = settings_from(args, kubernetes=args.kubernetes)
    interval_s = args.interval or settings.sample_interval_s
    if interval_s <= 0:
        raise CliError("--interval must be positive, e.g. 1s")
    try:
        sampler = NvmlSampler(nvml, host=settings.host).open()
    except ModuleNotFoundError:
        raise CliError("nvidia-ml-py (module pynvml) is not installed: pip install 'aip[producer]'", code=2) from None
    except NvmlUnavailable as exc:
        raise CliError(str(exc), code=2) from None
    if not sampler.devices:
        raise CliError("NVML found no GPU on this host", code=2)
    if settings.kubernetes:
        sampler.attribution = _kubernetes(settings, sampler.producer_id, sampler.host)
    stop = threading.Event()
    with broker_errors(), sigterm_as_interrupt():
        pub = _publisher(settings, f"nvml-{sampler.host}")
        pub.metrics = sampler.metrics = pub.metrics
        if args.duration:
            threading.Timer(args.duration, stop.set).start()
        tracker: Any = None if args.no_discovery else ProcessTracker(sampler.producer_id)
        collector = None
        if sampler.attribution is not None:  # pods are the jobs; their step hooks report progress here
            tracker = sampler.attribution
            collector = _step_collector(settings.step_socket, sampler.attribution.resolve_step, pub.publish, sampler.host)
            if collector is not None:
                sampler.attribution.on_finished = collector.forget
        print(f"aip produce: sampling {len(sampler.devices)} devices every {interval_s:g} s", file=sys.stderr)
        try:
            rounds = run_sampler(sampler, pub.publish, interval_s, stop, tracker=tracker, per_gpu=args.per_gpu)
        finally:
            sampler.close()
            if collector is not None:
                collector.close()
            if sampler.attribution is not None:
                sampler.attribution.pods.stop()
        return _finish(pub, {"source": "nvml", "devices": len(sampler.devices), "rounds": rounds})


def run_replay(args: argparse.Namespace) -> int:
    from producers import replay
    from producers.pacing import paced

    settings = settings_from(args)
    try:
        records, skipped = replay.load(args.path)
    except OSError as exc:
        raise CliError(f"cannot read {args.path}: {exc.strerror or exc}") from None
    if not records:
        raise CliError(f"{args.path} has no gpu.metrics or jobs.lifecycle records (record some with `aip tail TOPIC --json`)")
    if args.retime:
        records = replay.shifted(records, time.time() - records[0][1].ts)
    with broker_errors(), sigterm_as_interrupt():
        pub = _publisher(settings, f"replay-{os.getpid()}")
        progress = _Progress()
        n = samples = 0
        try:
            for topic, record in paced(_records(records, args.per_gpu), args.speedup):
                pub.publish(topic, record)
                n += 1
                samples += _samples(record) if topic == "gpu.metrics" else 0
                progress(lambda n=n: f"replayed {n} records ({len(records)} samples and job events)")
        except KeyboardInterrupt:
            pass
        return _finish(pub, {"source": "replay", "records": n, "gpu_samples": samples, "skipped_lines": skipped})

"""The co-location experiment: every job solo, then every pair (and a few triples) on one GPU.

While the jobs run, an NVML producer samples the GPU (by default the real
``aip produce nvml`` as a child process; tests inject a fake NVML module and
sample in-process through the same producers library) and every job reports
its lifecycle through :mod:`workloads.reporting`.  A recorder copies
``gpu.metrics`` and ``jobs.lifecycle`` to JSON lines files in ``aip tail
--json`` format; at the end :mod:`workloads.dataset` turns them into the
observations CSV and :mod:`workloads.table` into the paper's table.

The jobs of one run are started together: each warms up, prints ``ready``,
and starts its timed training when told, on a window boundary, so every
window of a run holds the same job set from start to end.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from config import Settings
from events import Topics, to_dict
from workloads import catalog, dataset, table

RECORDINGS = ("gpu.metrics", "jobs.lifecycle")


class ExperimentError(RuntimeError):
    """The experiment cannot run; the message says why in one line."""


# ---------------------------------------------------------------------- planning (pure)
@dataclass(frozen=True)
class JobSpec:
    model: str
    batch_size: int

    @property
    def job_type(self) -> str:
        return catalog.get(self.model).job_type(self.batch_size)


def parse_job(text: str) -> JobSpec:
    """``resnet50:32`` or ``resnet50-bs32``; a bare model name takes its middle batch size.

    >>> parse_job("vgg16:16"), parse_job("lstm-bs40").job_type, parse_job("cnn").batch_size
    (JobSpec(model='vgg16', batch_size=16), 'lstm-bs40', 256)
    """
    t = text.strip()
    model, sep, batch = t.partition(":")
    if not sep and "-bs" in t:
        model, sep, batch = t.rpartition("-bs")
    if model not in catalog.WORKLOADS:
        raise ExperimentError(f"unknown model {model!r} in {text!r}; choose from {', '.join(catalog.WORKLOADS)}")
    if not sep:
        sizes = catalog.WORKLOADS[model].batch_sizes
        return JobSpec(model, sizes[len(sizes) // 2])
    if not batch.isdigit() or int(batch) < 1:
        raise ExperimentError(f"bad batch size {batch!r} in {text!r}; write MODEL:BATCH, e.g. resnet50:32")
    return JobSpec(model, int(batch))


def plan_runs(jobs: Sequence[JobSpec], triples: int = 0) -> list[tuple[JobSpec, ...]]:
    """Each job solo, then every pair, then the first ``triples`` triples.

    >>> [tuple(j.model for j in r) for r in plan_runs([parse_job(m) for m in ("cnn", "lstm", "vgg16")], triples=1)]
    [('cnn',), ('lstm',), ('vgg16',), ('cnn', 'lstm'), ('cnn', 'vgg16'), ('lstm', 'vgg16'), ('cnn', 'lstm', 'vgg16')]
    """
    if len(set(jobs)) != len(jobs):
        raise ExperimentError("each job may be listed once")
    return [
        *((j,) for j in jobs),
        *itertools.combinations(jobs, 2),
        *itertools.islice(itertools.combinations(jobs, 3), max(0, triples)),
    ]


def go_instants(
    now_s: float, window_s: float, duration_s: float, lead_in_s: float = 0.5, early_s: float = 0.25
) -> tuple[float, float]:
    """When the jobs of a run start and stop: whole windows, starting just before a boundary.

    The start is ``early_s`` before a window boundary at least ``lead_in_s``
    away, so the ``started`` events precede the first full window; the end is
    whole windows later (``duration_s`` rounded, at least one).

    >>> go_instants(101.0, 5.0, 12.0)
    (104.75, 115.0)
    """
    boundary = math.ceil((now_s + lead_in_s + early_s) / window_s) * window_s
    windows = max(1, round(duration_s / window_s))
    return round(boundary - early_s, 6), boundary + windows * window_s


# ---------------------------------------------------------------------- configuration
@dataclass
class ExperimentConfig:
    jobs: list[JobSpec]
    out_dir: Path
    duration_per_run_s: float = 25.0
    triples: int = 0
    size: str = "full"
    device: str = "auto"
    window_s: float = 5.0
    sample_interval_s: float = 0.5
    gpu_index: int = 0
    report_every_s: float = 0.5
    ready_timeout_s: float = 180.0
    max_wall_s: float | None = None  # skip the remaining runs when the next would end after this (pairs come last)
    job_args: list[str] = field(default_factory=list)  # extra arguments of every `python -m workloads.run`

    def check(self) -> None:
        if not self.jobs:
            raise ExperimentError("no jobs given")
        if self.duration_per_run_s <= 0 or self.window_s <= 0 or self.sample_interval_s <= 0:
            raise ExperimentError("--duration-per-run, --window and --interval must be positive")
        if self.sample_interval_s > 1.0:
            raise ExperimentError("--interval must be 1 s or less (sample at 1 Hz or faster)")
        if self.sample_interval_s * 2 > self.window_s:
            raise ExperimentError("--window must hold at least two samples (window >= 2 x interval)")
        if self.size not in catalog.SIZES:
            raise ExperimentError(f"--size must be one of {', '.join(catalog.SIZES)}")


def progress(message: str) -> None:
    print(f"aip experiment: {message}", file=sys.stderr, flush=True)


def settings_env(settings: Settings) -> dict[str, str]:
    """The settings as ``AIP_*`` variables, so child processes talk to the same broker and topics."""
    return {f"AIP_{k.upper()}": str(getattr(settings, k)) for k in settings.public_dict()}


# ---------------------------------------------------------------------- recorder
class Recorder:
    """Copy ``gpu.metrics`` and ``jobs.lifecycle`` to JSON lines files (``aip tail --json`` format) in a thread."""

    def __init__(self, settings: Settings, out_dir: Path, since_ts: float) -> None:
        from transport import RecordConsumer, ensure_topics

        self.topics = Topics(settings.topic_prefix)
        names = [self.topics.metrics, self.topics.lifecycle]
        ensure_topics(settings, names)
        self.consumer = RecordConsumer(settings, names, from_beginning=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.paths = {base: out_dir / f"{base}.jsonl" for base in RECORDINGS}
        self._files: dict[str, IO[str]] = {base: open(p, "w") for base, p in self.paths.items()}
        self.since_ts = since_ts
        self.counts: Counter[str] = Counter()
        self.max_ts: dict[str, float] = {}
        self.finished: set[str] = set()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="aip-experiment-recorder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for item in self.consumer.poll(timeout_s=0.2):
                    self._write(item)
        except BaseException as exc:  # surfaced by the driver
            self.error = exc

    def _write(self, item: Any) -> None:
        base = self.topics.base(item.topic)
        if base not in self._files:
            return
        if item.error is not None:
            line = {"_topic": base, "_partition": item.partition, "_offset": item.offset, "_error": item.error}
        else:
            record = item.record
            if record.ts < self.since_ts:
                return  # an older experiment's record on a shared broker
            line = {"_topic": base, **to_dict(record)}
            with self._lock:
                self.max_ts[base] = max(self.max_ts.get(base, record.ts), record.ts)
                if base == "jobs.lifecycle" and record.kind == "finished":
                    self.finished.add(record.job_id)
        self._files[base].write(json.dumps(line, allow_nan=False) + "\n")
        with self._lock:
            self.counts[base] += 1

    def seen(self, metrics_until_ts: float, finished_jobs: set[str]) -> bool:
        """Metrics up to ``metrics_until_ts`` and the ``finished`` of every job in ``finished_jobs`` are recorded."""
        with self._lock:
            return self.max_ts.get("gpu.metrics", -math.inf) >= metrics_until_ts and finished_jobs <= self.finished

    def close(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join(timeout=10)
        self.consumer.close()
        for fh in self._files.values():
            fh.close()
        return dict(self.counts)


# ---------------------------------------------------------------------- samplers
@dataclass(frozen=True)
class Gpu:
    uuid: str
    name: str
    index: int


def find_gpu(nvml: Any, index: int) -> Gpu:
    """The GPU at NVML ``index`` (``nvml=None``: the real pynvml)."""
    from producers.nvml import NvmlSampler, NvmlUnavailable

    try:
        sampler = NvmlSampler(nvml).open()
    except ModuleNotFoundError:
        raise ExperimentError("nvidia-ml-py (module pynvml) is not installed: pip install 'aip[producer]'") from None
    except NvmlUnavailable as exc:
        raise ExperimentError(f"{exc} (or run `aip experiment --fake-nvml` for a CPU rehearsal)") from None
    try:
        whole = [d for d in sampler.devices if d.parent_uuid is None]
        if not 0 <= index < len(whole):
            raise ExperimentError(f"no GPU with NVML index {index} (found {len(whole)})")
        d = whole[index]
        return Gpu(d.uuid, d.name, d.index)
    finally:
        sampler.close()


class InProcessSampler:
    """The producers library's NVML sampler and publisher in a thread, over an injected NVML module."""

    def __init__(self, settings: Settings, nvml: Any, interval_s: float) -> None:
        from producers.nvml import NvmlSampler, run_sampler
        from producers.publisher import Publisher

        self.sampler = NvmlSampler(nvml, host=settings.host).open()
        self.publisher = Publisher(settings, f"experiment-nvml-{os.getpid()}")
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=run_sampler,
            args=(self.sampler, self.publisher.publish, interval_s, self._stop),
            name="aip-experiment-nvml",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sampler.close()
        left = self.publisher.close(timeout_s=30.0)
        return {"sampler": "in-process", "left_in_spool": left}


class CommandSampler:
    """``aip produce nvml --no-discovery`` as a child process (the real NVML path)."""

    def __init__(self, settings: Settings, interval_s: float, log_path: Path, argv: Sequence[str] | None = None) -> None:
        cmd = list(argv or [sys.executable, "-m", "aip.cli", "produce", "nvml", "--interval", f"{interval_s}", "--no-discovery"])
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            cmd,
            env=os.environ | settings_env(settings),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )

    def check(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise ExperimentError(f"`aip produce nvml` exited with code {code}; see {self._log.name}")

    def close(self) -> dict[str, Any]:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        self._log.close()
        lines = [ln for ln in (out or "").splitlines() if ln.startswith("{")]
        summary: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        return {"sampler": "aip produce nvml", "exit_code": self.proc.returncode, **summary}


# ---------------------------------------------------------------------- jobs
class JobProcess:
    """One ``python -m workloads.run`` child with the ready/go handshake."""

    def __init__(self, spec: JobSpec, job_id: str, gpu: Gpu, cfg: ExperimentConfig, env: dict[str, str], log_path: Path) -> None:
        self.spec = spec
        self.job_id = job_id
        cmd = [
            sys.executable, "-m", "workloads.run", "--model", spec.model, "--batch-size", str(spec.batch_size),
            "--size", cfg.size, "--device", cfg.device, "--job-id", job_id, "--gpu-uuid", gpu.uuid,
            "--report-every", str(cfg.report_every_s), "--duration", str(cfg.duration_per_run_s), "--wait-go", *cfg.job_args,
        ]  # fmt: skip
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.summary: dict[str, Any] = {}

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def wait_ready(self, deadline: float) -> bool:
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                return False
            if line is None:
                return False
            if line == "ready":
                return True
        return False

    def go(self, go_at: float, end_at: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"go {go_at:.6f} {end_at:.6f}\n")
        self.proc.stdin.close()

    def wait(self, timeout_s: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        while True:
            try:
                line = self.lines.get(timeout=5)
            except queue.Empty:
                break
            if line is None:
                break
            if line.startswith("{"):
                self.summary = json.loads(line)
        self._log.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@dataclass
class RunResult:
    index: int
    job_types: list[str]
    job_ids: list[str]
    go_at: float | None = None
    end_at: float | None = None
    exit_codes: list[int] = field(default_factory=list)
    steps_per_s: list[float | None] = field(default_factory=list)
    error: str | None = None


def run_combination(
    index: int,
    combo: Sequence[JobSpec],
    gpu: Gpu,
    cfg: ExperimentConfig,
    env: dict[str, str],
    clock: Callable[[], float] = time.time,
) -> RunResult:
    """Start the jobs of one combination together, train them for whole windows, wait for them to exit."""
    ids = [f"r{index:02d}-{spec.job_type}-{os.urandom(3).hex()}" for spec in combo]
    result = RunResult(index, [s.job_type for s in combo], ids)
    logs = cfg.out_dir / "jobs"
    logs.mkdir(parents=True, exist_ok=True)
    procs = [JobProcess(spec, job_id, gpu, cfg, env, logs / f"{job_id}.log") for spec, job_id in zip(combo, ids, strict=True)]
    deadline = time.monotonic() + cfg.ready_timeout_s
    if not all(p.wait_ready(deadline) for p in procs):
        for p in procs:
            p.kill()
        result.error = f"a job was not ready within {cfg.ready_timeout_s:g} s (see {logs})"
        return result
    go_at, end_at = go_instants(clock(), cfg.window_s, cfg.duration_per_run_s)
    result.go_at, result.end_at = go_at, end_at
    for p in procs:
        p.go(go_at, end_at)
    grace_s = 120.0
    result.exit_codes = [p.wait(max(1.0, end_at - clock()) + grace_s) for p in procs]
    result.steps_per_s = [p.summary.get("steps_per_s") for p in procs]
    if any(result.exit_codes):
        result.error = f"exit codes {result.exit_codes} (see {logs})"
    return result


# ---------------------------------------------------------------------- the experiment
def convert_outputs(out_dir: Path, window_s: float) -> dict[str, Any]:
    """Recordings in ``out_dir`` -> ``observations.csv``, ``table.md`` and ``table.csv``."""
    recordings = [out_dir / "recordings" / f"{base}.jsonl" for base in RECORDINGS]
    missing = [str(p) for p in recordings if not p.exists()]
    if missing:
        raise ExperimentError(f"no recordings: {', '.join(missing)} missing")
    csv_path = out_dir / "observations.csv"
    summary = dataset.convert(recordings, csv_path, window_s)
    t = table.paper_table(table.read_rows(csv_path))
    (out_dir / "table.md").write_text(table.to_markdown(t))
    table.write_csv(t, out_dir / "table.csv")
    return summary


def run_experiment(
    cfg: ExperimentConfig, settings: Settings, *, nvml: Any = None, clock: Callable[[], float] = time.time
) -> dict[str, Any]:
    """Run the whole experiment on one GPU and write everything under ``cfg.out_dir``; return the summary.

    ``nvml`` None samples with the real ``aip produce nvml``; a module-like
    object (for example :class:`producers.fakenvml.FakeNvml`) is sampled in-process.
    """
    cfg.check()
    out = cfg.out_dir
    out.mkdir(parents=True, exist_ok=True)
    runs = plan_runs(cfg.jobs, cfg.triples)
    gpu = find_gpu(nvml, cfg.gpu_index)
    started = clock()
    progress(f"{len(runs)} runs on {gpu.name} ({gpu.uuid}), about {cfg.duration_per_run_s:g} s each; writing to {out}")
    env = os.environ | settings_env(settings)
    if nvml is None and "CUDA_VISIBLE_DEVICES" not in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu.index)
    recorder = Recorder(settings, out / "recordings", since_ts=started - 1.0)
    sampler: InProcessSampler | CommandSampler
    sampler = (
        InProcessSampler(settings, nvml, cfg.sample_interval_s)
        if nvml is not None
        else CommandSampler(settings, cfg.sample_interval_s, out / "producer.log")
    )
    results: list[RunResult] = []
    skipped = 0
    run_walls_s: list[float] = []
    try:
        for i, combo in enumerate(runs, 1):
            elapsed_s = clock() - started
            if cfg.max_wall_s is not None and run_walls_s and elapsed_s + max(run_walls_s) + cfg.window_s > cfg.max_wall_s:
                skipped = len(runs) - i + 1
                progress(f"stopping after {elapsed_s:.0f} s: {skipped} runs would end after --max-wall {cfg.max_wall_s:g} s")
                break
            run_started = clock()
            if isinstance(sampler, CommandSampler):
                sampler.check()
            if recorder.error is not None:
                raise ExperimentError(f"recording failed: {recorder.error}")
            names = " + ".join(s.job_type for s in combo)
            progress(f"run {i}/{len(runs)}: {names}")
            r = run_combination(i, combo, gpu, cfg, env, clock)
            results.append(r)
            run_walls_s.append(clock() - run_started)
            rates = ", ".join(f"{t} {v} steps/s" for t, v in zip(r.job_types, r.steps_per_s, strict=False))
            progress(f"run {i}/{len(runs)}: {'FAILED: ' + r.error if r.error else 'done: ' + rates}")
        ends = [r.end_at for r in results if r.end_at is not None]
        last_end = max(ends, default=clock())
        expected = {j for r in results if r.go_at is not None for j in r.job_ids}
        deadline = time.monotonic() + max(30.0, cfg.window_s * 4)
        while not recorder.seen(last_end + cfg.window_s, expected) and time.monotonic() < deadline:
            time.sleep(0.2)  # the driver (not a test) waits for the last window's records to arrive
    finally:
        sampler_summary = sampler.close()
        counts = recorder.close()
        (out / "runs.json").write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    progress(
        f"recorded {counts.get('gpu.metrics', 0)} samples and {counts.get('jobs.lifecycle', 0)} lifecycle events; converting"
    )
    conversion = convert_outputs(out, cfg.window_s)
    summary = {
        "environment": gpu.name,
        "gpu_uuid": gpu.uuid,
        "runs": len(results),
        "failed_runs": sum(r.error is not None for r in results),
        "skipped_runs": skipped,
        "window_s": cfg.window_s,
        "sample_interval_s": cfg.sample_interval_s,
        "duration_per_run_s": cfg.duration_per_run_s,
        "size": cfg.size,
        "jobs": [j.job_type for j in cfg.jobs],
        "recorded": counts,
        "producer": sampler_summary,
        "wall_s": round(clock() - started, 1),
        **conversion,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    progress(f"{conversion['rows']} observation rows in {len(conversion['groups'])} groups -> {out / 'observations.csv'}")
    return summary

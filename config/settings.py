"""Every setting of the project, declared once: type, default, environment variable, help.

``Settings.from_env()`` reads ``AIP_*`` variables; command-line flags override
them through ``replace``.  Secrets are masked whenever settings are printed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

EMBEDDED_HOST = "127.0.0.1"
EMBEDDED_PORT = 19092
MASK = "****"


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message says which and why."""


def _setting(default: Any, help: str, *, secret: bool = False, choices: tuple[str, ...] = ()) -> Any:
    return field(default=default, metadata={"help": help, "secret": secret, "choices": choices})


@dataclass(frozen=True)
class Settings:
    # Kafka connection
    broker: str = _setting(
        f"{EMBEDDED_HOST}:{EMBEDDED_PORT}", "bootstrap servers: host:port, a comma-separated list, or kafka://host:port"
    )
    security_protocol: str = _setting(
        "PLAINTEXT", "Kafka security protocol", choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
    )
    sasl_mechanism: str = _setting("PLAIN", "SASL mechanism", choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"))
    sasl_username: str = _setting("", "SASL user name")
    sasl_password: str = _setting("", "SASL password", secret=True)
    ssl_cafile: str = _setting("", "CA certificate file for TLS")
    ssl_certfile: str = _setting("", "client certificate file for TLS")
    ssl_keyfile: str = _setting("", "client key file for TLS")
    ssl_check_hostname: bool = _setting(True, "verify the broker's host name against its certificate")
    client_id: str = _setting("aip", "Kafka client id")
    topic_prefix: str = _setting("", "prefix of every topic name (tenants, tests)")
    partitions: int = _setting(8, "partitions of topics the project creates")
    replication_factor: int = _setting(1, "replication factor of topics the project creates")
    connect_timeout_s: float = _setting(10.0, "give up connecting to the broker after this long")
    request_timeout_s: float = _setting(30.0, "Kafka request timeout")
    rebalance_timeout_s: float = _setting(
        3.0,
        "consumer group rebalance timeout (Tansu 0.6.0 holds a static member's JoinGroup and SyncGroup 3 s each, whatever it is)",
    )
    fetch_max_wait_s: float = _setting(
        0.25,
        "a stream worker's fetch waits at most this long for new records (faust's own 1.5 s left host-batched "
        "input idle on the embedded broker)",
    )
    producer_linger_s: float = _setting(
        0.05,
        "a stream worker's producer waits up to this long to fill a batch (faust's own 0: many small batches, which "
        "the embedded broker re-lists on every fetch)",
    )
    producer_batch_bytes: int = _setting(
        256 * 1024, "a stream worker's producer batches records per partition up to this many bytes (faust's own: 16 KB)"
    )
    direct_delivery: bool = _setting(
        True,
        "a stream worker's fetch loop hands each message to faust's streams without faust's four tasks per message "
        "when the stream has room for it, and its agents take their batches straight from their streams' queues "
        "(false: faust's own fetch loop and take_events)",
    )
    # producers
    host: str = _setting("", "host name in records (default: this machine's)")
    sample_interval_s: float = _setting(1.0, "NVML sampling interval")
    spool_dir: str = _setting("", "on-disk spool for records the broker has not acknowledged (default: ~/.cache/aip/spool)")
    spool_max_records: int = _setting(1_000_000, "spool bound; beyond it the oldest records are dropped and counted")
    job_id: str = _setting("", "job reporter: job id (set by `aip run-job` for the command it wraps)")
    job_type: str = _setting("", "job reporter: job type (set by `aip run-job`)")
    job_gpu_uuid: str = _setting("", "job reporter: GPU UUID the job runs on (set by `aip run-job`)")
    job_batch_size: int = _setting(0, "job reporter: batch size (0: unknown)")
    job_wrapped: bool = _setting(False, "job reporter: `aip run-job` emits started/finished, the library only progress")
    kubernetes: bool = _setting(
        False,
        "aip produce nvml: attribute GPUs and processes to the pods of node_name (kubelet PodResources API, Kubernetes "
        "API, /proc/<pid>/cgroup) and send pods' job events (started when a pod gains a GPU, finished when it loses it)",
    )
    podresources_socket: str = _setting(
        "/var/lib/kubelet/pod-resources/kubelet.sock", "kubernetes: the kubelet's PodResources API socket (gRPC)"
    )
    node_name: str = _setting("", "kubernetes: the node whose pods are attributed (the DaemonSet sets it from spec.nodeName)")
    kubernetes_api: str = _setting(
        "", "kubernetes: API server URL, e.g. http://127.0.0.1:8001 (default: in-cluster configuration, the service account)"
    )
    step_socket: str = _setting(
        "/var/run/aip/steps.sock", "local socket on which the step hook of training processes sends its step counts"
    )
    # stream
    window_s: float = _setting(10.0, "tumbling window length in event time")
    lateness_s: float = _setting(5.0, "events this late still go into their window; later ones are dead-lettered")
    lifecycle_hold_s: float = _setting(
        120.0,
        "metric windows wait at most this long (event time) for jobs.lifecycle when no running job reports progress",
    )
    progress_hold_s: float = _setting(
        600.0,
        "while progress is due (a running job reported it, or one finished less than this ago), metric windows wait "
        "for jobs.lifecycle up to this long (event time)",
    )
    backlog_hold_s: float = _setting(
        3600.0,
        "while a GPU's jobs.lifecycle partition has records this worker has not applied yet (it reads a backlog), metric "
        "windows wait for them up to this long (event time)",
    )
    stage1_batch: int = _setting(1000, "stage 1 handles input in batches of up to this many events (1: event by event)")
    stage1_batch_wait_s: float = _setting(
        0.25,
        "stage 1 takes a batch at most this long after the previous one was handled (stage1_batch > 1; sooner when "
        "full, at once after a quiet spell)",
    )
    stage2_batch_wait_s: float = _setting(
        0.25, "stage 2 takes a batch of up to 200 observation records at most this long after the previous one was handled"
    )
    observation_batch_bytes: int = _setting(
        256 * 1024,
        "stage 1 publishes the observations of one input batch as one record per environment (ObservationBatch) of at "
        "most this many bytes (0: one Observation per record, for stage-2 workers older than ObservationBatch)",
    )
    changelog_buckets: int = _setting(
        32,
        "stage 1 writes each input partition's GPU states to its changelog as this many records at most (a GPU's "
        "state in the record of its bucket, every GPU of a bucket in each write); 0: one record per GPU, as workers "
        "before it wrote and read",
    )
    checkpoint_interval_s: float = _setting(
        5.0, "stage 1 writes its state (windows, job sets, solo profiles) to state_dir this often, then commits offsets"
    )
    models_save_interval_s: float = _setting(
        60.0, "stage 2 saves its models (and the observation ids they learned) to state_dir this often"
    )
    alert_threshold_pct: float = _setting(50.0, "raise an alert when interference reaches this")
    alert_clear_pct: float = _setting(35.0, "clear it when interference falls below this")
    prediction_max_pct: float = _setting(
        1000.0, "predictions are bounded to [-100, this]; bounded ones are counted (stage2 kind predictions_clipped)"
    )
    max_jobs_per_gpu: int = _setting(
        3,
        "jobs a GPU may run at once, as a Kubernetes time-slicing configuration's replicas (the simulator runs at most "
        "3): a GPU running this many publishes its predictions with full true and no what-if entries, and the "
        "extender and the scheduler client never place a job there (0: no limit)",
    )
    refit_max_lag_s: float = _setting(
        0.0,
        "how far stage 2 may outrun its refits: once event time has advanced this many seconds more than the wall clock "
        "since the rows of the served models were taken, and a refit is due, it refits at once and waits; in real time "
        "it never binds; faster (a paced run, a replay) it keeps the models as fresh as in real time, and a backlog "
        "after an outage takes the refits' time longer (0: no bound; aip bench accuracy runs with 60)",
    )
    refit_interval_s: float = _setting(
        300.0,
        "seconds of event time at least between an environment's batch refits (due every refit_every observations or "
        "at drift); a refit costs the same however many observations came since the last, so a large fleet would "
        "otherwise refit back to back; an environment's first refit does not wait (0: no wait)",
    )
    serving: str = _setting(
        "stage2",
        "where predictions, what-if entries and alerts are made: stage2 (with learning, in the one worker of the "
        "environment) or sharded (learning publishes model snapshots on models.snapshots; every worker serves the "
        "GPUs of its stage 1 from the latest one; needs snapshot_key)",
        choices=("stage2", "sharded"),
    )
    snapshot_key: str = _setting(
        "", "serving sharded: the key (shared by every worker) that signs the river learners in model snapshots", secret=True
    )
    snapshot_chunk_bytes: int = _setting(
        256 * 1024,
        "serving sharded: a model snapshot is sent in records of at most this many bytes (Kafka's default limit: 1 MB)",
    )
    state_dir: str = _setting("", "worker state: models and profiles (default: ~/.cache/aip/state)")
    group_instance_id: str = _setting(
        "",
        "worker's static consumer-group membership id: restarted with the same id, it gets its partitions back "
        "without waiting for its old session to expire (default: host name + state_dir; none: dynamic membership)",
    )
    leave_group_on_stop: bool = _setting(
        True,
        "a worker that stops cleanly (SIGINT/SIGTERM) leaves the consumer group, static member or not, so its "
        "partitions move at once (false: a static member's partitions wait for its session to expire, and on the "
        "embedded broker a group whose leader stopped can wait for it for good)",
    )
    observations_retention_ms: int = _setting(
        -1,
        "retention.ms of interference.observations when the project creates it: a worker that takes over an "
        "environment rebuilds its models from this history (-1: keep forever; shorter loses what a worker without "
        "a model snapshot can rebuild)",
    )
    web_host: str = _setting("127.0.0.1", "worker HTTP bind address (0.0.0.0 in the container image)")
    web_port: int = _setting(6066, "worker HTTP port: /predictions, /leaderboard, /profiles, /metrics")
    gc_gen0_threshold: int = _setting(
        20_000,
        "a worker freezes what its start made out of the garbage collector and collects the young generation every "
        "this many allocations (0: Python's collector as it is, every 700)",
    )
    worker_stop_within_s: float = _setting(
        45.0, "after SIGINT/SIGTERM a worker is gone within this long, its broker reachable or not (then exit 1, no final save)"
    )
    metrics_port: int = _setting(0, "producer Prometheus port (0: off)")
    # scheduler extender (`aip extender`)
    extender_host: str = _setting("127.0.0.1", "extender HTTP bind address (0.0.0.0 in a container)")
    extender_port: int = _setting(8888, "extender HTTP port: /filter, /prioritize, /volcano/*, /score, /healthz, /metrics")
    extender_full_scale_pct: float = _setting(
        250.0, "extender: a predicted cost (newcomer + existing slowdown) of this many percent or more scores 0 (of 10)"
    )
    extender_neutral_score: int = _setting(5, "extender: score (0-10) of a node without predictions or a pod without a job type")
    # ranking rules of the scheduler client and the extender (clients/scheduler.py)
    novel_risk: str = _setting(
        "upper",
        "scheduler client and extender: a what-if entry for a job type never measured here (regime novel) is ranked "
        "by its 90 % interval's upper end, each job already there at the same margin (upper), by its expected "
        "slowdown (expected), or not at all (withhold: ranked by load)",
    )
    explore_margin_pct: float = _setting(
        0.0,
        "scheduler client and extender: among GPUs within this many points of the best predicted cost, prefer one "
        "whose entry is a job set never measured, by an exploration bonus (0: off)",
    )
    explore_width_share: float = _setting(
        0.1, "exploration bonus: this share of the never-measured entry's 90 % interval width, at most the margin"
    )

    # ------------------------------------------------------------------
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then ``AIP_<NAME>`` variables, then ``overrides`` (None values are ignored).

        >>> Settings.from_env({"AIP_WINDOW_S": "5"}).window_s
        5.0
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(f"AIP_{f.name.upper()}")
            if raw is not None and raw != "":
                values[f.name] = _parse(f, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        settings.check()
        return settings

    def replace(self, **overrides: Any) -> Settings:
        settings = dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})
        settings.check()
        return settings

    def check(self) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata["choices"]
            value = getattr(self, f.name)
            if choices and value not in choices:
                raise SettingsError(f"{f.name} (AIP_{f.name.upper()}): {value!r} is not one of {', '.join(choices)}")
        if not self.bootstrap_servers:
            raise SettingsError("broker (AIP_BROKER): no address given; use host:port")
        if self.alert_clear_pct > self.alert_threshold_pct:
            raise SettingsError("alert_clear_pct must not exceed alert_threshold_pct")
        if self.max_jobs_per_gpu < 0:
            raise SettingsError("max_jobs_per_gpu must be 0 (no limit) or a number of jobs, e.g. 3")
        if self.gc_gen0_threshold < 0:
            raise SettingsError(
                "gc_gen0_threshold must be 0 (Python's collector as it is) or a number of allocations, e.g. 20000"
            )
        if not self.prediction_max_pct > 0:
            raise SettingsError("prediction_max_pct must be positive (a slowdown in %, e.g. 1000)")
        if self.serving == "sharded" and len(self.snapshot_key) < 16:
            raise SettingsError(
                "serving sharded needs snapshot_key (AIP_SNAPSHOT_KEY): 16 characters or more, the same on every worker"
            )
        if not 0 <= self.changelog_buckets <= 4096:
            raise SettingsError("changelog_buckets must be between 0 (one record per GPU) and 4096")
        if self.observation_batch_bytes != 0 and not 1024 <= self.observation_batch_bytes <= 900 * 1024:
            raise SettingsError("observation_batch_bytes must be 0 or between 1024 and 921600 (below Kafka's 1 MB message limit)")
        if not 1024 <= self.snapshot_chunk_bytes <= 900 * 1024:
            raise SettingsError("snapshot_chunk_bytes must be between 1024 and 921600 (below Kafka's 1 MB message limit)")
        if self.window_s <= 0 or self.lateness_s < 0:
            raise SettingsError("window_s must be positive and lateness_s non-negative")
        if self.refit_max_lag_s < 0:
            raise SettingsError("refit_max_lag_s (AIP_REFIT_MAX_LAG_S) must be 0 (off) or a number of seconds, e.g. 60")
        if self.refit_interval_s < 0:
            raise SettingsError("refit_interval_s (AIP_REFIT_INTERVAL_S) must be 0 (no wait) or a number of seconds, e.g. 300")
        if not 0 <= self.producer_linger_s <= 1:
            raise SettingsError("producer_linger_s (AIP_PRODUCER_LINGER_S) must be in [0, 1] seconds, e.g. 0.05")
        if not 1024 <= self.producer_batch_bytes <= 900 * 1024:
            raise SettingsError("producer_batch_bytes must be between 1024 and 921600 (below Kafka's 1 MB message limit)")
        if not 0 < self.fetch_max_wait_s <= 30:
            raise SettingsError("fetch_max_wait_s (AIP_FETCH_MAX_WAIT_S) must be in (0, 30] seconds, e.g. 0.25")
        for name in ("stage1_batch_wait_s", "stage2_batch_wait_s"):
            if not 0 < getattr(self, name) <= 10:
                raise SettingsError(f"{name} (AIP_{name.upper()}) must be in (0, 10] seconds, e.g. 0.25")

    @property
    def bootstrap_servers(self) -> list[str]:
        """``broker`` as a list of host:port.

        >>> Settings(broker="kafka://a:1, b:2").bootstrap_servers
        ['a:1', 'b:2']
        """
        out = []
        for part in self.broker.split(","):
            part = part.strip()
            if part.startswith("kafka://"):
                part = part[len("kafka://") :]
            part = part.rstrip("/")
            if not part:
                continue
            host, sep, port = part.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise SettingsError(f"broker (AIP_BROKER): {part!r} is not host:port")
            out.append(part)
        return out

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def public_dict(self) -> dict[str, Any]:
        """All settings with secrets masked: safe to print or log."""
        return {
            f.name: (MASK if f.metadata["secret"] and getattr(self, f.name) else getattr(self, f.name))
            for f in dataclasses.fields(self)
        }

    def secrets(self) -> list[str]:
        return [getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["secret"] and getattr(self, f.name)]

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.public_dict().items())
        return f"Settings({inner})"

    __str__ = __repr__


def _parse(f: dataclasses.Field[Any], raw: str) -> Any:
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    name = f"AIP_{f.name.upper()}"
    try:
        if kind == "bool":
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        raise SettingsError(f"{name}: {raw!r} is not a valid {kind}") from None
    return raw


def describe() -> list[tuple[str, str, str, str]]:
    """(environment variable, type, default, help) for every setting: the README's table."""
    rows = []
    for f in dataclasses.fields(Settings):
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        default = MASK if f.metadata["secret"] else f.default
        rows.append((f"AIP_{f.name.upper()}", str(kind), repr(default), f.metadata["help"]))
    return rows


def markdown_table() -> str:
    """The README's configuration table (regenerate with ``python -m config``)."""
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for env, kind, default, help_text in describe():
        rows.append(f"| `{env}` | {kind} | `{default}` | {help_text} |")
    return "\n".join(rows)

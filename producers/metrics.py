"""Prometheus metrics of one producer, in a registry of its own (tests never collide)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class ProducerMetrics:
    """Samples taken, records sent, spooled and dropped, NVML errors by kind.

    >>> m = ProducerMetrics()
    >>> m.nvml_errors.labels(kind="GpuIsLost").inc()
    >>> m.value("aip_producer_nvml_errors_total", kind="GpuIsLost")
    1.0
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.samples_taken = Counter("aip_producer_samples_taken", "GPU samples taken (one per GPU per interval)", registry=r)
        self.records_sent = Counter("aip_producer_records_sent", "records the broker acknowledged", registry=r)
        self.records_spooled = Counter(
            "aip_producer_records_spooled", "records that waited in the spool while the broker was unavailable", registry=r
        )
        self.records_dropped = Counter(
            "aip_producer_records_dropped", "oldest records dropped because the spool was full", registry=r
        )
        self.send_failures = Counter("aip_producer_send_failures", "batches the broker did not acknowledge (retried)", registry=r)
        self.nvml_errors = Counter("aip_producer_nvml_errors", "NVML calls that failed, by error kind", ["kind"], registry=r)
        self.spool_records = Gauge("aip_producer_spool_records", "records waiting in the spool", registry=r)
        self.sample_seconds = Histogram(
            "aip_producer_sample_duration_seconds",
            "wall time to sample all GPUs once",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (0.0 when absent): handy in tests and summaries."""
        v = self.registry.get_sample_value(name, labels or None)
        return 0.0 if v is None else float(v)

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Serve /metrics on ``port``; returns the server (or None when port is 0)."""
        if not port:
            return None
        return start_http_server(port, addr=addr, registry=self.registry)

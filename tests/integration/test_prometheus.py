"""A real Prometheus (Debian's 2.42) scraping a real worker fed by the simulator on the embedded broker.

It loads the shipped rules, with one change said here: the interference alert's ``for:`` of
5 minutes is rendered as 3 s in the test's copy (its expression is the shipped one).  The
test then checks that the alert went pending and firing on exactly the GPUs that
``interference.alerts`` has in alert at the end of the run, that every recording rule and
every expression of the Grafana dashboard returns series, and that the worker's /metrics
passes ``promtool check metrics`` with no warning.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import wait_for, worker_settings

from aip.faults.worker import WorkerProcess, metric_values

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "aip-rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "aip-interference.json"
START_TS = 1_700_000_000.0
ENV = "v100"
ALERT = "AipGpuInterferenceHigh"
TEST_FOR = "3s"  # the shipped rule says 5m


def render_rules(path: Path) -> None:
    """The shipped rules with the interference alert's ``for:`` shortened to :data:`TEST_FOR` (nothing else changed)."""
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == ALERT]
    assert len(rules) == 1 and rules[0]["for"] == "5m"
    rules[0]["for"] = TEST_FOR
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


class Prometheus:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return list(data["result"])

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def alert_gpus(self, state: str) -> set[str]:
        return {s["metric"]["gpu_uuid"] for s in self.query(f'ALERTS{{alertname="{ALERT}", alertstate="{state}"}}')}


@pytest.fixture
def stack(broker: Any, tmp_path: Path) -> Iterator[tuple[WorkerProcess, Prometheus]]:
    """A worker and a Prometheus scraping it every second, started side by side."""
    from aip.broker import free_port

    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail("prometheus not found: `make setup` installs Debian's prometheus package (scripts/ensure-prometheus.sh)")
    settings = worker_settings(broker, tmp_path, "p", partitions=2)
    worker = WorkerProcess(settings, free_port(), tmp_path / "worker.log").start()
    render_rules(tmp_path / "aip-rules.yml")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "aip-rules.yml")],
        "scrape_configs": [{"job_name": "aip-worker", "static_configs": [{"targets": [f"127.0.0.1:{worker.web_port}"]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")  # closed below
    proc = subprocess.Popen(
        [exe, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    prometheus = Prometheus(port)
    try:
        wait_for(lambda: prometheus.ready() or proc.poll() is not None, timeout_s=30, what="Prometheus ready")
        assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
        wait_for(worker.ready, timeout_s=60, what="the worker's web server")
        yield worker, prometheus
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        assert worker.stop(60) in (0, -15), worker.log_tail()


def produce(settings: Any, events: Any) -> None:
    from transport import RecordProducer

    with RecordProducer(settings) as p:
        for topic, record in events:
            p.send(topic, record)
        p.send_raw("gpu.metrics", b"{not json", key=b"GPU-bad")  # one dead letter, so its series exist
        p.flush(30)


def read_all(settings: Any, topic: str, until: Any, timeout_s: float = 60.0) -> list[Any]:
    from transport import RecordConsumer

    with RecordConsumer(settings, [topic], from_beginning=True) as c:
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            records.extend(i.record for i in c.poll(timeout_s=0.3) if i.record is not None)
            if until(records):
                break
        return records


def gpus_in_alert_on_the_topic(observations: list[Any], alerts: list[Any], horizon_s: float) -> set[str]:
    """GPUs with a job in raised state (its last alert on the topic), among the jobs each GPU's newest window lists,
    on GPUs whose newest window is within ``horizon_s`` of the environment's newest (the series' documented life)."""
    newest: dict[str, Any] = {}
    for o in observations:
        if o.gpu_uuid not in newest or o.window_start > newest[o.gpu_uuid].window_start:
            newest[o.gpu_uuid] = o
    env_end = max(o.window_end for o in observations)
    state: dict[tuple[str, str], str] = {}
    for a in alerts:
        state[(a.gpu_uuid, a.job_id)] = a.state
    out = set()
    for gpu, o in newest.items():
        if o.window_end < env_end - horizon_s:
            continue
        if any(state.get((gpu, job)) == "raised" for job in (o.job_id, *o.co_job_ids)):
            out.add(gpu)
    return out


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    return exprs


def instant(expr: str) -> str:
    """A dashboard expression with Grafana's variables set: every environment, a 1-minute rate window."""
    return expr.replace("$environment", ".*").replace("$__rate_interval", "1m")


def test_prometheus_alerts_on_the_gpus_the_alerts_topic_has_in_alert(stack: tuple[WorkerProcess, Prometheus]) -> None:
    from producers.sim import Simulator
    from streams.interference_metrics import HORIZON_WINDOWS

    worker, prometheus = stack
    s = worker.settings
    events = list(Simulator(gpus=6, gpu_model=ENV, seed=1, start_ts=START_TS, duration_s=900).events())
    produce(s, events)

    # stage 1 consumed every input and stage 2 applied every observation stage 1 published
    def settled() -> bool:
        page = worker.get("/metrics")
        consumed = sum(metric_values(page, "aip_stream_consumed_records_total", topic="gpu.metrics")) + sum(
            metric_values(page, "aip_stream_consumed_records_total", topic="jobs.lifecycle")
        )
        emitted = sum(metric_values(page, "aip_stream_published_records_total", topic="observations"))
        applied = sum(metric_values(page, "aip_observations_total", environment=ENV))
        return consumed >= len(events) + 1 and applied >= emitted > 0

    wait_for(settled, timeout_s=120, interval_s=0.5, what="the worker to process the run")
    emitted = sum(metric_values(worker.get("/metrics"), "aip_stream_published_records_total", topic="observations"))
    observations = read_all(s, "interference.observations", lambda r: len(r) >= emitted)

    # the topic holds every alert the worker counts: read until a count taken after the read agrees (the
    # worker may publish more in between, as its last windows close)
    def published_alerts() -> int:
        return sum(metric_values(worker.get("/metrics"), "aip_stream_published_records_total", topic="alerts"))

    alerts: list = []

    def topic_agrees() -> bool:
        nonlocal alerts
        before = published_alerts()
        alerts = read_all(s, "interference.alerts", lambda r: len(r) >= before)
        return len(alerts) == published_alerts() == before

    wait_for(topic_agrees, timeout_s=60, interval_s=1, what="the alerts topic to hold every alert the worker counts")
    assert alerts
    expected = gpus_in_alert_on_the_topic(observations, alerts, HORIZON_WINDOWS * s.window_s)
    assert expected, "the run must have GPUs in alert"

    def shown() -> set[str]:
        return {r["metric"]["gpu_uuid"] for r in prometheus.query("aip:gpu_interference_percent:max")}

    # the worker can settle within a second of the run: Prometheus scrapes it and evaluates the rule every second
    wait_for(lambda: shown() - expected, timeout_s=30, interval_s=0.5, what="Prometheus to show GPUs not in alert too")

    # after the rule's for: delay, Prometheus fires on exactly those GPUs; they were pending first
    try:
        wait_for(lambda: prometheus.alert_gpus("firing") == expected, timeout_s=30, what="the alert firing on those GPUs")
    finally:
        print("firing:", prometheus.alert_gpus("firing"), "expected:", expected)
    now = time.time()
    pending = prometheus.get(
        "/api/v1/query_range",
        query=f'ALERTS{{alertname="{ALERT}", alertstate="pending"}}',
        start=str(now - 120),
        end=str(now),
        step="1",
    )
    assert expected <= {r["metric"]["gpu_uuid"] for r in pending["result"]}
    for r in prometheus.query(f'ALERTS{{alertname="{ALERT}", alertstate="firing"}}'):
        value = prometheus.query(f'aip:gpu_interference_percent:max{{gpu_uuid="{r["metric"]["gpu_uuid"]}"}}')
        assert float(value[0]["value"][1]) >= s.alert_clear_pct  # raised jobs are at or above the clear level

    # every recording rule and every dashboard expression parses and returns series
    records = sorted({r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "record" in r})
    empty = [e for e in records if not prometheus.query(e)]
    assert not empty, f"recording rules without series: {empty}"
    empty = [e for e in dashboard_exprs() if not prometheus.query(instant(e))]
    assert not empty, f"dashboard expressions without series: {empty}"

    # the real worker's page passes Prometheus' own checker without a warning
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=worker.get("/metrics"), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr
    assert not re.search(r'job_id="', worker.get("/metrics")), "no job ids in labels"

"""promtool on the shipped rules and on every component's /metrics (Prometheus' own checker, no warning allowed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus"
MISSING = "promtool not found: `make setup` installs Debian's prometheus package (or see scripts/ensure-prometheus.sh)"


def promtool(*args: str, stdin: bytes | None = None, cwd: Path = RULES) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail(MISSING)  # a failure, not a skip: make test must run these
    return subprocess.run(
        [exe, *args], input=None if stdin is None else stdin.decode(), capture_output=True, text=True, cwd=cwd, timeout=60
    )


def test_rules_are_valid() -> None:
    result = promtool("check", "rules", "aip-rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_unit_tests_pass() -> None:
    result = promtool("test", "rules", "aip-rules.test.yml")
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def minutes(duration: str) -> float:
    """A promtool duration of this file (``90s``, ``5m``, ``1h``) in minutes."""
    return float(duration[:-1]) * {"s": 1 / 60, "m": 1.0, "h": 60.0}[duration[-1]]


def test_every_alert_is_tested_firing_and_not_firing_after_its_delay() -> None:
    """Not firing is checked where an expression that is always true would fire: an evaluation later than the
    alert's ``for:`` (before it every alert is silent, pending or not)."""
    import yaml

    delays = {
        r["alert"]: minutes(r.get("for", "0m"))
        for g in yaml.safe_load((RULES / "aip-rules.yml").read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    firing: set[str] = set()
    silent: set[str] = set()
    for test in yaml.safe_load((RULES / "aip-rules.test.yml").read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            if case["exp_alerts"]:
                firing.add(case["alertname"])
            elif minutes(case["eval_time"]) > delays[case["alertname"]]:
                silent.add(case["alertname"])
    assert delays and firing == set(delays) and silent == set(delays), (set(delays) - firing, set(delays) - silent)


def test_the_scrape_config_is_valid(tmp_path: Path) -> None:
    config = (RULES / "prometheus.yml").read_text().replace("/etc/prometheus/rules/aip-rules.yml", str(RULES / "aip-rules.yml"))
    (tmp_path / "prometheus.yml").write_text(config)
    result = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def check_metrics(page: bytes) -> None:
    result = promtool("check", "metrics", stdin=page)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_the_producers_metrics_pass_promtool() -> None:
    from producers.metrics import ProducerMetrics

    m = ProducerMetrics()
    m.nvml_errors.labels(kind="GpuIsLost").inc()
    m.sample_seconds.observe(0.002)
    check_metrics(generate_latest(m.registry))


def test_the_extenders_metrics_pass_promtool() -> None:
    from clients.extender import ExtenderMetrics

    m = ExtenderMetrics()
    m.requests.labels(verb="prioritize", code="200").inc()
    m.latency.labels(verb="prioritize").observe(0.001)
    for counter in (m.no_job_type, m.unknown_job_type, m.nodes_without_predictions, m.nodes_failed):
        counter.labels(verb="filter").inc()
    m.bad_annotations.inc()
    check_metrics(generate_latest(m.registry))


def test_the_workers_metrics_pass_promtool() -> None:
    """Every family the worker renders, each with a sample (the real worker's page is checked in test_prometheus.py)."""
    from collections import Counter

    from events import Alert, Leaderboard, LeaderboardEntry, Observation, Prediction, ServedModel, WhatIf
    from streams.interference_metrics import InterferenceMetrics
    from streams.metrics import StreamMetrics

    ts = 1_700_000_000.0
    board = Leaderboard(
        ts=ts, environment="v100", entries=[LeaderboardEntry(model="knn", category="all", mode="observed", kind="online", samples=3, mae=4.0)],
        selected={"observed:all": "knn"}, served=[ServedModel(mode="observed", regime="seen", model="knn", category="all", error_pct=4.0)],
    )  # fmt: skip
    m = StreamMetrics(
        Counter(windows=3), Counter(predictions_clipped=1), leaderboards=lambda: {"v100": board}, highwater=lambda t, p: 10
    )
    m.consumed_message("gpu.metrics", 0, 4)
    m.published["predictions"] += 1
    m.dead_letters["late"] += 1
    m.observations["v100"] += 1
    gauges = InterferenceMetrics(50.0, 35.0)
    m.registry.register(gauges)
    o = Observation(
        window_start=ts, window_end=ts + 10, gpu_uuid="G1", environment="v100", job_id="j1", job_type="bert",
        co_job_types=["resnet"], co_job_ids=["j2"], interference_pct=60.0,
    )  # fmt: skip
    p = Prediction(
        ts=ts, gpu_uuid="G1", environment="v100", job_id="j1", job_type="bert", job_set=["bert", "resnet"], mode="placement",
        interference_pct=55.0, model="knn", category="all", measured_pct=60.0, regime="seen",
        what_if=[WhatIf(job_type="bert", newcomer_pct=10.0, existing_pct=20.0)],
    )  # fmt: skip
    a = Alert(ts=ts, state="raised", gpu_uuid="G1", job_id="j1", interference_pct=60.0, threshold=50.0, source="measured")
    gauges.observe(o, [p], [a])
    page, _ = m.render()
    assert b"aip_gpu_whatif_cost_percent{" in page and b"aip_model_served_error_points{" in page
    check_metrics(page)

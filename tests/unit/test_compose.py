"""docker-compose.yml cannot run here (no Docker engine); check it agrees with the code."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import yaml

from aip.cli import build_parser
from config import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SETTING_VARS = {f"AIP_{f.name.upper()}" for f in dataclasses.fields(Settings)}


def _subcommands() -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return set(action.choices)


def test_services_and_profiles() -> None:
    services = COMPOSE["services"]
    assert {"kafka", "worker", "producer", "kafka-2", "kafka-3"} <= set(services)
    assert "profiles" not in services["kafka"], "one broker by default"
    assert services["kafka-2"]["profiles"] == services["kafka-3"]["profiles"] == ["cluster"]
    assert services["producer"]["pid"] == "host" and services["producer"]["runtime"] == "nvidia"
    assert "container_name" not in services["worker"] and "ports" not in services["worker"], "worker must scale with --scale"


def test_kafka_runs_in_kraft_mode() -> None:
    for name in ("kafka", "kafka-2", "kafka-3"):
        env = COMPOSE["services"][name]["environment"]
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert "CONTROLLER_QUORUM_VOTERS" in " ".join(env)
        assert "zookeeper" not in str(COMPOSE["services"][name]).lower()


def test_commands_exist_in_the_cli() -> None:
    commands = _subcommands()
    parser = build_parser()
    for name in ("worker", "producer", "extender"):
        command = COMPOSE["services"][name]["command"]
        assert command[0] in commands
        parser.parse_args(command)  # flags must parse too


def test_environment_variables_are_settings() -> None:
    for name in ("worker", "producer", "extender"):
        env = COMPOSE["services"][name]["environment"]
        aip_vars = {k for k in env if k.startswith("AIP_")}
        assert aip_vars, name
        unknown = aip_vars - SETTING_VARS
        assert not unknown, f"{name} sets variables no setting reads: {unknown}"
        assert env["AIP_BROKER"].split(":-")[-1].rstrip("}") == "kafka:9092"
        Settings.from_env({k: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(v)) for k, v in env.items() if k in SETTING_VARS})


def test_images_install_extras_that_exist() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    dockerfile = (ROOT / "Dockerfile").read_text()
    for extra in re.findall(r"pip install '\.\[(\w+)\]'", dockerfile):
        assert re.search(rf"^{extra} = \[", pyproject, re.M), extra
    for name in ("worker", "producer", "extender"):
        assert f"AS {COMPOSE['services'][name]['build']['target']}" in dockerfile


def test_worker_replicas_share_no_state_volume_and_each_has_its_own_membership_id() -> None:
    worker = COMPOSE["services"]["worker"]
    assert "replicas" in worker.get("deploy", {}), "the worker runs as replicas"
    named = set(COMPOSE.get("volumes") or {})
    for mount in worker.get("volumes", []):
        source = (mount.split(":")[0] if isinstance(mount, str) else mount.get("source", "")) or ""
        target = mount.split(":")[1] if isinstance(mount, str) else mount.get("target", "")
        assert source not in named, f"named volume {source} would be shared by every worker replica"
        assert not target.startswith(worker["environment"]["AIP_STATE_DIR"]), "the state directory is per replica"
    # static membership: the id derives from the host name, so no fixed hostname or id for every replica
    assert "hostname" not in worker and "container_name" not in worker
    assert "AIP_GROUP_INSTANCE_ID" not in worker["environment"]


def test_every_named_volume_belongs_to_one_unscaled_service() -> None:
    users: dict[str, list[str]] = {}
    for name, service in COMPOSE["services"].items():
        for mount in service.get("volumes", []):
            source = mount.split(":")[0] if isinstance(mount, str) else mount.get("source", "")
            if source in (COMPOSE.get("volumes") or {}):
                users.setdefault(source, []).append(name)
                assert "replicas" not in service.get("deploy", {}), f"{name} scales but mounts {source}"
    assert all(len(v) == 1 for v in users.values()), users


def test_worker_web_port_is_reachable_from_other_containers() -> None:
    worker = COMPOSE["services"]["worker"]
    assert worker["environment"]["AIP_WEB_HOST"] == "0.0.0.0"
    assert "ENV AIP_WEB_HOST=0.0.0.0" in (ROOT / "Dockerfile").read_text()
    port = int(worker["environment"]["AIP_WEB_PORT"])
    assert str(port) in [str(p) for p in worker["expose"]]
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = [c for job in scrape["scrape_configs"] for c in job.get("dns_sd_configs", [])]
    assert any(t["names"] == ["worker"] and t["port"] == port for t in targets), "Prometheus scrapes every worker replica"
    prometheus = COMPOSE["services"]["prometheus"]
    assert any(v.startswith("./deploy/prometheus/prometheus.yml:") for v in prometheus["volumes"])


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> host path (relative to the repository) of a service's bind mounts."""
    out = {}
    for v in service.get("volumes", []):
        source, target = v.split(":")[:2]
        out[target] = source.removeprefix("./")
    return out


def _host_path(mounts: dict[str, str], container_path: str) -> Path | None:
    for target, source in mounts.items():
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            return ROOT / source / container_path[len(target) :].lstrip("/")
    return None


def test_prometheus_in_compose_loads_the_rules_and_scrapes_every_component() -> None:
    prometheus = COMPOSE["services"]["prometheus"]
    assert prometheus["profiles"] == ["monitoring"]
    mounts = _mounts(prometheus)
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    for rule_file in config["rule_files"]:
        path = _host_path(mounts, rule_file)
        assert path is not None and path.is_file(), f"{rule_file} is not mounted from the repository"
        assert path.name == "aip-rules.yml"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert {"aip-worker", "aip-extender", "aip-producer"} <= set(jobs)
    rules = (ROOT / "deploy" / "prometheus" / "aip-rules.yml").read_text()
    assert 'job="aip-worker"' in rules, "the worker-down rule names the workers' scrape job"
    extender = COMPOSE["services"]["extender"]
    assert jobs["aip-extender"]["static_configs"][0]["targets"] == [f"extender:{extender['environment']['AIP_EXTENDER_PORT']}"]
    producer = COMPOSE["services"]["producer"]
    assert jobs["aip-producer"]["dns_sd_configs"][0]["port"] == int(producer["environment"]["AIP_METRICS_PORT"])


def test_grafana_is_provisioned_with_the_prometheus_datasource_and_the_dashboard() -> None:
    grafana = COMPOSE["services"]["grafana"]
    assert grafana["profiles"] == ["monitoring"] and "prometheus" in grafana["depends_on"]
    mounts = _mounts(grafana)
    provisioning = _host_path(mounts, "/etc/grafana/provisioning")
    assert provisioning is not None and provisioning.is_dir()
    datasources = [d for f in (provisioning / "datasources").glob("*.yml") for d in yaml.safe_load(f.read_text())["datasources"]]
    prometheus_port = COMPOSE["services"]["prometheus"]["ports"][0].split(":")[-1].strip('"')
    assert any(d["type"] == "prometheus" and d["url"] == f"http://prometheus:{prometheus_port}" for d in datasources)
    uids = {d["uid"] for d in datasources}
    providers = [p for f in (provisioning / "dashboards").glob("*.yml") for p in yaml.safe_load(f.read_text())["providers"]]
    dashboards = []
    for provider in providers:
        folder = _host_path(mounts, provider["options"]["path"])
        assert folder is not None and folder.is_dir(), provider
        dashboards.extend(folder.glob("*.json"))
    assert dashboards, "no dashboard JSON where the provider looks"
    home = _host_path(mounts, grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert home in dashboards
    for path in dashboards:
        dashboard = json.loads(path.read_text())
        used = {p["datasource"]["uid"] for p in dashboard["panels"]} | {
            t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]
        }
        assert used <= uids, f"{path.name} refers to datasources not provisioned: {used - uids}"
        assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_observations_keep_the_history_models_are_rebuilt_from() -> None:
    env = COMPOSE["services"]["worker"]["environment"]
    assert env["AIP_OBSERVATIONS_RETENTION_MS"].endswith(":--1}")


def test_replicas_with_the_same_state_path_get_different_membership_ids(monkeypatch: Any) -> None:
    import socket

    from streams.app import app_config, group_instance_id

    settings = Settings(state_dir="/var/lib/aip")  # what every replica has
    ids = set()
    for host in ("3f2a9c1d0b7e", "9b8e7d6c5a4f"):  # container host names of two replicas
        monkeypatch.setattr(socket, "gethostname", lambda host=host: host)
        ids.add(group_instance_id(settings))
    assert len(ids) == 2
    assert app_config(Settings())["web_bind"] == "127.0.0.1"
    assert app_config(Settings(web_host="0.0.0.0"))["web_bind"] == "0.0.0.0"


def test_docker_waits_for_a_worker_longer_than_the_worker_takes_to_be_gone() -> None:
    from config import Settings

    grace = COMPOSE["services"]["worker"]["stop_grace_period"]
    assert grace.endswith("s") and float(grace[:-1]) > Settings().worker_stop_within_s

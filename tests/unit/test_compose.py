"""docker-compose.yml cannot run here (no Docker engine); check it agrees with the code."""

from __future__ import annotations

import dataclasses
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
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = [c for job in scrape["scrape_configs"] for c in job.get("dns_sd_configs", [])]
    assert any(t["names"] == ["worker"] and t["port"] == port for t in targets), "Prometheus scrapes every worker replica"
    prometheus = COMPOSE["services"]["prometheus"]
    assert any("deploy/prometheus.yml" in v for v in prometheus["volumes"])


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

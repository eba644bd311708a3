"""docker-compose.yml cannot run here (no Docker engine); check it agrees with the code."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

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
    for name in ("worker", "producer"):
        command = COMPOSE["services"][name]["command"]
        assert command[0] in commands
        parser.parse_args(command)  # flags must parse too


def test_environment_variables_are_settings() -> None:
    for name in ("worker", "producer"):
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
    for name in ("worker", "producer"):
        assert f"AS {COMPOSE['services'][name]['build']['target']}" in dockerfile

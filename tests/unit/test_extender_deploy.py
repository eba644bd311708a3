"""The deployment examples of the extender agree with the code (no cluster here: their fields are checked)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from aip.cli import build_parser
from clients.extender import VERBS
from config import Settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ROUTES = {path for (method, path) in VERBS if method == "POST"}


def _route(url_prefix: str, verb: str) -> str:
    """What kube-scheduler and Volcano call: strings.TrimRight(urlPrefix, "/") + "/" + verb."""
    return urlsplit(url_prefix.rstrip("/") + "/" + verb).path


def test_kube_scheduler_configuration_calls_the_extenders_routes() -> None:
    config = yaml.safe_load((DEPLOY / "kube-scheduler" / "scheduler-config.yaml").read_text())
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1" and config["kind"] == "KubeSchedulerConfiguration"
    (ext,) = config["extenders"]
    assert {_route(ext["urlPrefix"], ext[v]) for v in ("filterVerb", "prioritizeVerb")} == {"/filter", "/prioritize"} <= ROUTES
    assert isinstance(ext["weight"], int) and ext["weight"] > 0
    assert ext["ignorable"] is True and ext["nodeCacheCapable"] is True
    assert urlsplit(ext["urlPrefix"]).port == Settings().extender_port


def test_extender_manifest_runs_the_command_on_the_port_it_exposes() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "base" / "extender.yaml").read_text()))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    service = next(d for d in docs if d["kind"] == "Service")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    build_parser().parse_args(container["args"])
    env = {e["name"]: e["value"] for e in container["env"]}
    settings = Settings.from_env(env)
    assert settings.extender_host == "0.0.0.0"
    assert container["ports"][0]["containerPort"] == settings.extender_port == service["spec"]["ports"][0]["port"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz" and ("GET", "/healthz") in VERBS


def test_volcano_configuration_calls_the_extenders_volcano_routes() -> None:
    configmap = yaml.safe_load((DEPLOY / "volcano" / "volcano-scheduler-configmap.yaml").read_text())
    conf: dict[str, Any] = yaml.safe_load(configmap["data"]["volcano-scheduler.conf"])
    plugins = [p for tier in conf["tiers"] for p in tier["plugins"]]
    (ext,) = [p for p in plugins if p["name"] == "extender"]
    args = ext["arguments"]
    routes = {_route(args["extender.urlPrefix"], args[f"extender.{v}Verb"]) for v in ("predicate", "prioritize")}
    assert routes == {"/volcano/predicate", "/volcano/prioritize"} <= ROUTES
    assert args["extender.ignorable"] is True and args["extender.managedResources"] == ["nvidia.com/gpu"]
    assert "nodeorder" in {p["name"] for p in plugins}  # the other node-order plugins stay

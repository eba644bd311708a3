"""deploy/kubernetes/ rendered by kustomize, validated offline against the Kubernetes schemas, and checked against the code.

No cluster here: ``kubectl kustomize`` renders the example overlay (and the base), ``kubernetes-validate`` checks every
object against the OpenAPI schemas of a pinned Kubernetes version, strictly (unknown fields fail), and the rest checks
that what the manifests set is what the code reads.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from aip.cli import build_parser
from config import Settings

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAY = KUBERNETES / "overlays" / "example"
BASE = KUBERNETES / "base"
KUBERNETES_VERSION = "1.30"  # the oldest Kubernetes release the manifests are checked against
SETTING_VARS = {f"AIP_{f.name.upper()}" for f in dataclasses.fields(Settings)}
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
WORKLOADS = ("DaemonSet", "StatefulSet", "Deployment")
NAMESPACED = {"ServiceAccount", "ConfigMap", "Secret", "Service", *WORKLOADS}
# the component each workload runs: its service in docker-compose.yml (image, Dockerfile target)
COMPONENTS = {"aip-producer": "producer", "aip-worker": "worker", "aip-extender": "extender"}
MISSING = "kubectl not found: `make setup` installs it (scripts/ensure-kubectl.sh)"


def kubectl() -> str:
    beside = Path(sys.executable).parent / "kubectl"  # the venv's, from scripts/ensure-kubectl.sh
    exe = str(beside) if beside.is_file() else shutil.which("kubectl")
    if exe is None:
        pytest.fail(MISSING)  # a failure, not a skip: make test must run these
    return exe


def render(path: Path) -> list[dict[str, Any]]:
    result = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.fixture(scope="module")
def overlay() -> list[dict[str, Any]]:
    return render(OVERLAY)


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render(BASE)


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def generated(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """A ConfigMap or Secret of a kustomize generator: its name carries a content hash unless disabled."""
    (doc,) = [d for d in docs if d["kind"] == kind and re.fullmatch(rf"{name}(-[a-z0-9]{{10}})?", d["metadata"]["name"])]
    return doc


def data(doc: dict[str, Any]) -> dict[str, str]:
    if doc["kind"] == "Secret":
        return {k: base64.b64decode(v).decode() for k, v in doc.get("data", {}).items()} | doc.get("stringData", {})
    return dict(doc.get("data", {}))


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return [*spec.get("initContainers", []), *spec["containers"]]


def main_container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(workload)["containers"]
    return container


def environment(docs: list[dict[str, Any]], container: dict[str, Any], pod: str = "aip-worker-0") -> dict[str, str]:
    """What the container's process sees: envFrom sources, then env (values from the downward API as the kubelet fills them)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        kind, ref = ("ConfigMap", source["configMapRef"]) if "configMapRef" in source else ("Secret", source["secretRef"])
        env.update(data(one(docs, kind, ref["name"])))
    downward = {"spec.nodeName": "gpu-node-1", "metadata.name": pod}
    for var in container.get("env", []):
        env[var["name"]] = var["value"] if "value" in var else downward[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def settings_of(docs: list[dict[str, Any]], container: dict[str, Any]) -> Settings:
    return Settings.from_env({k: v for k, v in environment(docs, container).items() if k.startswith("AIP_")})


# ---------------------------------------------------------------------- every object valid


def test_every_rendered_object_is_valid_against_the_pinned_kubernetes_schemas(
    overlay: list[dict[str, Any]], base: list[dict[str, Any]]
) -> None:
    kinds = {d["kind"] for d in overlay}
    assert {"Namespace", "ClusterRole", "ClusterRoleBinding", "Secret", *NAMESPACED} <= kinds, kinds
    for doc in [*overlay, *base]:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")


def test_the_validator_rejects_a_misspelt_field(overlay: list[dict[str, Any]]) -> None:
    daemonset = json.loads(json.dumps(one(overlay, "DaemonSet", "aip-producer")))
    pod_spec(daemonset)["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="hostPid"):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)


def test_the_overlay_puts_every_namespaced_object_in_its_namespace(overlay: list[dict[str, Any]]) -> None:
    namespace = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())["namespace"]
    assert one(overlay, "Namespace", namespace)
    for doc in overlay:
        if doc["kind"] in NAMESPACED:
            assert doc["metadata"]["namespace"] == namespace, doc["metadata"]


# ---------------------------------------------------------------------- settings, commands, images, ports


def test_every_environment_variable_the_manifests_set_is_a_setting(overlay: list[dict[str, Any]]) -> None:
    seen: set[str] = set()
    for workload in (d for d in overlay if d["kind"] in WORKLOADS):
        for container in containers(workload):
            env = environment(overlay, container)
            aip = {k for k in env if k.startswith("AIP_")}
            unknown = aip - SETTING_VARS
            assert not unknown, f"{workload['metadata']['name']}/{container['name']} sets variables no setting reads: {unknown}"
            assert set(env) - aip <= {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}
            Settings.from_env({k: env[k] for k in aip})  # every value parses and passes the settings' checks
            seen |= aip
    # what each component is told, from the Secret and the shared ConfigMap
    assert {"AIP_BROKER", "AIP_SECURITY_PROTOCOL", "AIP_SASL_PASSWORD", "AIP_PARTITIONS"} <= seen
    for name in ("aip-settings", "aip-kafka"):
        kind = "Secret" if name == "aip-kafka" else "ConfigMap"
        assert set(data(generated(overlay, kind, name))) <= SETTING_VARS


def test_the_kafka_settings_come_from_the_secret(overlay: list[dict[str, Any]]) -> None:
    secret = generated(overlay, "Secret", "aip-kafka")
    kafka = data(secret)
    assert {"AIP_BROKER", "AIP_SECURITY_PROTOCOL", "AIP_SASL_USERNAME", "AIP_SASL_PASSWORD"} <= set(kafka)
    settings = Settings.from_env(kafka)
    assert settings.uses_sasl and settings.uses_tls
    for workload in (d for d in overlay if d["kind"] in WORKLOADS):
        container = main_container(workload)
        refs = [s["secretRef"]["name"] for s in container["envFrom"] if "secretRef" in s]
        assert refs == [secret["metadata"]["name"]], workload["metadata"]["name"]
        assert not {v["name"] for v in container.get("env", [])} & set(kafka), "the Secret's values are not overridden"
        # the TLS files: the paths the Secret names are in the mounted TLS Secret
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        tls = mounts["kafka-tls"]
        assert tls["readOnly"] is True and volumes["kafka-tls"]["secret"]["secretName"] == "aip-kafka-tls"
        assert Path(settings.ssl_cafile).parent == Path(tls["mountPath"])


def test_commands_exist_in_the_cli(overlay: list[dict[str, Any]]) -> None:
    parser = build_parser()
    for workload in (d for d in overlay if d["kind"] in WORKLOADS):
        parser.parse_args(main_container(workload)["args"])  # flags must parse too


def test_the_hook_init_container_runs_a_cli_command(overlay: list[dict[str, Any]]) -> None:
    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    (init,) = pod_spec(one(overlay, "DaemonSet", "aip-producer"))["initContainers"]
    if init["args"][0] not in commands:
        pytest.skip(f"`aip {init['args'][0]}` is not a command of this CLI yet")
    parser.parse_args(init["args"])


def test_images_are_the_compose_images_of_each_component(overlay: list[dict[str, Any]], base: list[dict[str, Any]]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    tags = {i["name"]: i for i in yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())["images"]}
    for name, service in COMPONENTS.items():
        compose = COMPOSE["services"][service]
        assert f"AS {compose['build']['target']}" in dockerfile
        compose_name = compose["image"].split(":")[0]
        for workload_docs, expected in ((base, compose["image"]), (overlay, None)):
            workload = next(d for d in workload_docs if d["kind"] in WORKLOADS and d["metadata"]["name"] == name)
            for container in containers(workload):
                if expected is not None:
                    assert container["image"] == expected, (name, container["name"])
                else:
                    tag = tags[compose_name]
                    assert container["image"] == f"{tag['newName']}:{tag['newTag']}"
                    assert tag["newName"].rsplit("/", 1)[-1] == compose_name


def test_ports_are_the_ones_the_code_listens_on(overlay: list[dict[str, Any]]) -> None:
    listen = {
        "aip-worker": lambda s: s.web_port,
        "aip-extender": lambda s: s.extender_port,
        "aip-producer": lambda s: s.metrics_port,
    }
    for name, port_of in listen.items():
        workload = next(d for d in overlay if d["kind"] in WORKLOADS and d["metadata"]["name"] == name)
        container = main_container(workload)
        settings = settings_of(overlay, container)
        (port,) = container["ports"]
        assert port["containerPort"] == port_of(settings) > 0, name
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert int(annotations["prometheus.io/port"]) == port["containerPort"]
        if name != "aip-producer":
            host = settings.web_host if name == "aip-worker" else settings.extender_host
            assert host == "0.0.0.0", f"{name} must listen beyond the pod's loopback"
            service = one(overlay, "Service", name)
            (service_port,) = service["spec"]["ports"]
            assert (
                service_port["targetPort"] == port["name"]
                and service["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"]
            )
    # the defaults of the code, so that the examples elsewhere (compose, kube-scheduler) agree
    assert main_container(one(overlay, "StatefulSet", "aip-worker"))["ports"][0]["containerPort"] == Settings().web_port
    assert main_container(one(overlay, "Deployment", "aip-extender"))["ports"][0]["containerPort"] == Settings().extender_port
    producer = main_container(one(overlay, "DaemonSet", "aip-producer"))
    assert str(producer["ports"][0]["containerPort"]) == COMPOSE["services"]["producer"]["environment"]["AIP_METRICS_PORT"]


def test_kube_scheduler_calls_the_extender_service_of_the_base(base: list[dict[str, Any]]) -> None:
    scheduler = yaml.safe_load((ROOT / "deploy" / "kube-scheduler" / "scheduler-config.yaml").read_text())
    (extender,) = scheduler["extenders"]
    service = one(base, "Service", "aip-extender")
    (port,) = service["spec"]["ports"]
    meta = service["metadata"]
    assert extender["urlPrefix"] == f"http://{meta['name']}.{meta['namespace']}.svc.cluster.local:{port['port']}"


# ---------------------------------------------------------------------- RBAC


def test_rbac_gives_the_producer_read_access_to_pods_and_nothing_else(overlay: list[dict[str, Any]]) -> None:
    roles = [d for d in overlay if d["kind"] in ("Role", "ClusterRole")]
    bindings = [d for d in overlay if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert [r["metadata"]["name"] for r in roles] == ["aip-producer"]
    (role,) = roles
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    (binding,) = bindings
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role["kind"], "name": "aip-producer"}
    account = one(overlay, "ServiceAccount", "aip-producer")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "aip-producer", "namespace": account["metadata"]["namespace"]}
    ]
    assert pod_spec(one(overlay, "DaemonSet", "aip-producer"))["serviceAccountName"] == "aip-producer"
    # the workers and the extender read no Kubernetes object: their own accounts, no token mounted
    for kind, name in (("StatefulSet", "aip-worker"), ("Deployment", "aip-extender")):
        spec = pod_spec(one(overlay, kind, name))
        assert spec["serviceAccountName"] == name and spec["automountServiceAccountToken"] is False
        assert one(overlay, "ServiceAccount", name)["automountServiceAccountToken"] is False


# ---------------------------------------------------------------------- the producer, the workers


def test_the_producer_runs_on_gpu_nodes_with_what_attribution_needs(overlay: list[dict[str, Any]]) -> None:
    daemonset = one(overlay, "DaemonSet", "aip-producer")
    spec = pod_spec(daemonset)
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["hostPID"] is True, "PIDs map to pods through /proc/<pid>/cgroup of the host's processes"
    comment = re.search(r"((?:\s*#.*\n)+)\s*hostPID: true", (BASE / "producer.yaml").read_text())
    assert comment and "/proc/<pid>/cgroup" in comment.group(1), "the manifest says why it needs the host's PIDs"
    assert spec["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    container = main_container(daemonset)
    assert "nvidia.com/gpu" not in str(container.get("resources", {})), "the producer takes no GPU from the device plugin"
    settings = settings_of(overlay, container)
    env = {v["name"]: v for v in container["env"]}
    assert settings.kubernetes is True
    for var in ("AIP_NODE_NAME", "AIP_HOST"):
        assert env[var]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", var
    assert settings.podresources_socket == Settings().podresources_socket
    assert settings.step_socket == Settings().step_socket
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}

    def host_path(container_path: str, of: dict[str, dict[str, Any]] = mounts) -> str:
        (mount,) = [m for p, m in of.items() if Path(container_path).is_relative_to(p)]
        source = volumes[mount["name"]]["hostPath"]["path"]
        return str(Path(source) / Path(container_path).relative_to(mount["mountPath"]))

    # the kubelet's socket, read-only, at the path the kubelet serves it on the node
    assert host_path(settings.podresources_socket) == settings.podresources_socket
    assert mounts[str(Path(settings.podresources_socket).parent)]["readOnly"] is True
    # the step socket and the hook directory: on the node, where training pods reach them
    assert host_path(settings.step_socket) == settings.step_socket
    (init,) = spec["initContainers"]
    hook_dir = init["args"][-1]
    init_mounts = {m["mountPath"]: m for m in init["volumeMounts"]}
    assert host_path(hook_dir, init_mounts) == hook_dir and Path(hook_dir).parent == Path(settings.step_socket).parent
    assert host_path(settings.spool_dir) == settings.spool_dir, "the spool outlives the pod"


def test_workers_are_a_statefulset_with_their_own_state_and_stable_membership_ids(overlay: list[dict[str, Any]]) -> None:
    statefulset = one(overlay, "StatefulSet", "aip-worker")
    container = main_container(statefulset)
    env = {v["name"]: v for v in container["env"]}
    assert env["AIP_GROUP_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    ids = {settings_of_pod(overlay, container, f"aip-worker-{i}").group_instance_id for i in range(3)}
    assert ids == {"aip-worker-0", "aip-worker-1", "aip-worker-2"}
    settings = settings_of(overlay, container)
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    (state,) = [m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    assert state["mountPath"] == settings.state_dir
    service = one(overlay, "Service", statefulset["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert statefulset["spec"]["replicas"] == 3  # the overlay's
    assert pod_spec(statefulset)["terminationGracePeriodSeconds"] > settings.worker_stop_within_s


def settings_of_pod(docs: list[dict[str, Any]], container: dict[str, Any], pod: str) -> Settings:
    return Settings.from_env({k: v for k, v in environment(docs, container, pod).items() if k.startswith("AIP_")})


# ---------------------------------------------------------------------- one copy of the rules and the dashboard


def test_the_rules_and_the_dashboard_are_the_repository_files(overlay: list[dict[str, Any]]) -> None:
    rules = ROOT / "deploy" / "prometheus" / "aip-rules.yml"
    assert data(one(overlay, "ConfigMap", "aip-prometheus-rules")) == {rules.name: rules.read_text()}
    dashboards = {p.name: p.read_text() for p in (ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")}
    configmap = one(overlay, "ConfigMap", "aip-grafana-dashboards")
    assert dashboards and data(configmap) == dashboards
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert not list(KUBERNETES.rglob("*.json")) and not list(KUBERNETES.rglob("aip-rules*")), "one copy of each file"


def test_the_scrape_jobs_find_every_component_and_carry_the_names_the_rules_use(
    overlay: list[dict[str, Any]], tmp_path: Path
) -> None:
    scrape = yaml.safe_load(data(one(overlay, "ConfigMap", "aip-prometheus-scrape"))["prometheus-scrape.yml"])
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    assert set(jobs) == {"aip-worker", "aip-extender", "aip-producer"}
    assert 'job="aip-worker"' in (ROOT / "deploy" / "prometheus" / "aip-rules.yml").read_text()
    for name, job in jobs.items():
        workload = next(d for d in overlay if d["kind"] in WORKLOADS and d["metadata"]["name"] == name)
        (port,) = main_container(workload)["ports"]
        (keep,) = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
        assert keep["regex"] == f"{workload['spec']['selector']['matchLabels']['app']};{port['name']}"
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: `make setup` installs Debian's prometheus package (scripts/ensure-prometheus.sh)")
    # Debian's Prometheus is built without Kubernetes discovery: promtool checks the rest of each job (relabelling,
    # rules) with a static target in its place, and the discovery block is checked here
    for job in scrape["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}], job["job_name"]
        job["static_configs"] = [{"targets": ["localhost:1"]}]
    config = {"rule_files": [str(ROOT / "deploy" / "prometheus" / "aip-rules.yml")], **scrape}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------------- what a training pod adds (docs/OPERATIONS.md)


def test_the_training_pod_snippet_in_the_docs_reaches_the_hook_and_the_socket(overlay: list[dict[str, Any]]) -> None:
    operations = (ROOT / "docs" / "OPERATIONS.md").read_text()
    section = operations.split("\n## Kubernetes\n", 1)[1].split("\n## ", 1)[0]
    snippets = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, re.S)]
    (pod,) = [s for s in snippets if isinstance(s, dict) and s.get("kind") == "Pod"]
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    assert pod["metadata"]["annotations"]["aip.io/job-type"]
    daemonset = one(overlay, "DaemonSet", "aip-producer")
    (init,) = pod_spec(daemonset)["initContainers"]
    hook_dir = Path(init["args"][-1])
    (run_aip,) = [v for v in pod_spec(daemonset)["volumes"] if v.get("hostPath", {}).get("path") == str(hook_dir.parent)]
    (container,) = pod["spec"]["containers"]
    assert {"name": "PYTHONPATH", "value": str(hook_dir)} in container["env"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(hook_dir.parent)]
    assert volumes[mount["name"]]["hostPath"]["path"] == run_aip["hostPath"]["path"] == mount["mountPath"]
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1

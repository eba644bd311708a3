"""Request bodies shaped as kube-scheduler and Volcano send them (shared by the extender tests).

kube-scheduler (pkg/scheduler/extender.go) marshals ``extenderv1.ExtenderArgs`` with Go's
encoding/json: the Go field names as keys (``Pod``, ``Nodes``, ``NodeNames``) and the core
v1 objects with their json tags. Volcano's extender plugin marshals ``PredicateRequest`` /
``PrioritizeRequest`` (json tags ``task``, ``node``, ``nodes``) around ``api.TaskInfo`` and
``api.NodeInfo``, which have no tags (``Name``, ``Pod``, ``Node``).
"""

from __future__ import annotations

from typing import Any


def pod(annotations: dict[str, str] | None = None, name: str = "train-resnet-7f9c") -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name, "namespace": "ml", "uid": "5b0c3f0e-6a55-4d51-9a3e-1f6f0c2d7a11", "resourceVersion": "48213",
        "creationTimestamp": "2026-12-01T08:00:00Z", "labels": {"app": "train"},
    }  # fmt: skip
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "metadata": meta,
        "spec": {
            "containers": [{"name": "trainer", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "4", "nvidia.com/gpu": "1"}}}],
            "restartPolicy": "Never", "schedulerName": "default-scheduler", "priority": 0,
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }  # fmt: skip


def node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"kubernetes.io/hostname": name,
                     "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB"}},
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {"capacity": {"cpu": "64", "nvidia.com/gpu": "8"}, "allocatable": {"cpu": "63", "nvidia.com/gpu": "8"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def kube_args(the_pod: dict[str, Any], names: list[str], *, node_cache_capable: bool = True) -> dict[str, Any]:
    """``ExtenderArgs``: ``NodeNames`` when nodeCacheCapable, else ``Nodes`` (a NodeList); the other is null."""
    if node_cache_capable:
        return {"Pod": the_pod, "Nodes": None, "NodeNames": names}
    return {"Pod": the_pod, "Nodes": {"metadata": {}, "items": [node(n) for n in names]}, "NodeNames": None}


def task_info(the_pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "UID": the_pod["metadata"]["uid"], "Job": "ml/train-resnet", "Name": the_pod["metadata"]["name"],
        "Namespace": "ml", "TaskRole": "worker", "Resreq": {"MilliCPU": 4000, "Memory": 0, "ScalarResources": {"nvidia.com/gpu": 1000}},
        "InitResreq": None, "NodeName": "", "Status": 1, "Priority": 0, "VolumeReady": False, "Preemptable": False,
        "BestEffort": False, "RevocableZone": "", "NumaInfo": None, "Pod": the_pod,
    }  # fmt: skip


def node_info(name: str) -> dict[str, Any]:
    return {
        "Name": name, "Node": node(name), "State": {"Phase": 1, "Reason": ""},
        "Idle": {"MilliCPU": 60000, "ScalarResources": {"nvidia.com/gpu": 7000}}, "Used": {"MilliCPU": 3000},
        "Tasks": {}, "RevocableZone": "", "Others": None,
    }  # fmt: skip


def volcano_predicate(the_pod: dict[str, Any], name: str) -> dict[str, Any]:
    return {"task": task_info(the_pod), "node": node_info(name)}


def volcano_prioritize(the_pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"task": task_info(the_pod), "nodes": [node_info(n) for n in names]}

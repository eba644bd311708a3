"""Request and response bodies as kube-scheduler and Volcano send and read them (shared by the extender tests).

kube-scheduler: the JSON below is copied verbatim from kube-scheduler's own test of its extender types,
``TestCompatibility`` in ``extender/v1/types_test.go`` of https://github.com/kubernetes/kube-scheduler
(commit e87dbddd27a5bd4c2028727c7ccc082cfb2cdc09; the staging copy of kubernetes'
``staging/src/k8s.io/kube-scheduler/extender/v1``), Copyright 2020 The Kubernetes Authors, licensed under
the Apache License, Version 2.0 (http://www.apache.org/licenses/LICENSE-2.0).  It is what Go's
encoding/json writes for ``ExtenderArgs``, ``ExtenderFilterResult`` and ``HostPriority``: the Go field
names as keys (the types have no json tags), the core v1 objects with theirs.  The bodies the tests send
are that ``ExtenderArgs`` with the pod's annotations and the node names of the test.

Volcano: ``PredicateRequest`` / ``PrioritizeRequest`` (json tags ``task``, ``node``, ``nodes``) are in
``pkg/scheduler/plugins/extender/argument.go``; they hold ``api.TaskInfo`` (``pkg/scheduler/api/job_info.go``,
with the embedded ``TransactionContext``) and ``api.NodeInfo`` (``pkg/scheduler/api/node_info.go``), which
have no json tags; of https://github.com/volcano-sh/volcano at commit ed72c7c815a9fd547a787134676f73d42e9d049c,
Copyright The Volcano Authors, Apache License, Version 2.0.  Volcano has no JSON fixture of them, so
:func:`task_info` and :func:`node_info` write every exported field of those structs in their declaration
order with Go's zero value (``null`` for a nil pointer or map), as ``json.Marshal`` does, and the values a
pending one-GPU task and a ready node have.
"""

from __future__ import annotations

import copy
import json
from typing import Any

# ---------------------------------------------------------------- kube-scheduler, verbatim (Apache-2.0)
EXTENDER_ARGS_JSON = (
    '{"Pod":{"metadata":{"name":"podname"},"spec":{"containers":null},"status":{}},"Nodes":{"metadata":{},'
    '"items":[{"metadata":{"name":"nodename"},"spec":{},"status":{"daemonEndpoints":{"kubeletEndpoint":{"Port":0}},'
    '"nodeInfo":{"machineID":"","systemUUID":"","bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"",'
    '"kubeletVersion":"","kubeProxyVersion":"","operatingSystem":"","architecture":""}}}]},"NodeNames":["node1"]}'
)
EXTENDER_FILTER_RESULT_JSON = (
    '{"Nodes":{"metadata":{},"items":[{"metadata":{"name":"nodename"},"spec":{},"status":{"daemonEndpoints":'
    '{"kubeletEndpoint":{"Port":0}},"nodeInfo":{"machineID":"","systemUUID":"","bootID":"","kernelVersion":"",'
    '"osImage":"","containerRuntimeVersion":"","kubeletVersion":"","kubeProxyVersion":"","operatingSystem":"",'
    '"architecture":""}}}]},"NodeNames":["node1"],"FailedNodes":{"foo":"bar"},"FailedAndUnresolvableNodes":'
    '{"baz":"qux"},"Error":"myerror"}'
)
HOST_PRIORITY_JSON = '{"Host":"myhost","Score":1}'
# -----------------------------------------------------------------------------------------------------

_ARGS = json.loads(EXTENDER_ARGS_JSON)


def pod(annotations: dict[str, str] | None = None, name: str = "podname") -> dict[str, Any]:
    """kube-scheduler's pod (``ExtenderArgs.Pod`` above), named ``name``, with ``annotations`` in its
    ``metadata`` (``ObjectMeta.Annotations``, json tag ``annotations``, omitted when empty)."""
    out = copy.deepcopy(_ARGS["Pod"])
    out["metadata"]["name"] = name
    if annotations is not None:
        out["metadata"]["annotations"] = dict(annotations)
    return out


def node(name: str) -> dict[str, Any]:
    """kube-scheduler's node (``ExtenderArgs.Nodes.items[0]`` above), named ``name``."""
    out = copy.deepcopy(_ARGS["Nodes"]["items"][0])
    out["metadata"]["name"] = name
    return out


def kube_args(the_pod: dict[str, Any], names: list[str], *, node_cache_capable: bool = True) -> dict[str, Any]:
    """``ExtenderArgs`` as kube-scheduler's ``HTTPExtender`` fills it: ``NodeNames`` when the extender is
    nodeCacheCapable, else ``Nodes`` (a NodeList); the other is a nil pointer, ``null``."""
    args = copy.deepcopy(_ARGS)
    args["Pod"] = the_pod
    if node_cache_capable:
        args["Nodes"], args["NodeNames"] = None, list(names)
    else:
        args["Nodes"]["items"], args["NodeNames"] = [node(n) for n in names], None
    return args


# ---------------------------------------------------------------------- Volcano (from its Go types)
def _resource(milli_cpu: float, memory: float, gpus: float | None) -> dict[str, Any]:
    """``api.Resource``: MilliCPU, Memory, ScalarResources, MaxTaskNum."""
    return {"MilliCPU": milli_cpu, "Memory": memory, "ScalarResources": None if gpus is None else {"nvidia.com/gpu": gpus},
            "MaxTaskNum": 0}  # fmt: skip


PENDING = 1  # api.TaskStatus Pending (1 << 0)
READY = 1  # api.NodePhase Ready (1 << 0)


def task_info(the_pod: dict[str, Any]) -> dict[str, Any]:
    """``api.TaskInfo`` of a pending task of ``the_pod``: its exported fields in declaration order, the
    embedded ``TransactionContext``'s (NodeName, EvictionOccurred, JobAllocatedHyperNode, Status) inline."""
    return {
        "UID": the_pod["metadata"].get("uid", ""), "Job": "ml/train", "Name": the_pod["metadata"]["name"],
        "Namespace": the_pod["metadata"].get("namespace", ""), "TaskRole": "worker",
        "Resreq": _resource(4000.0, 0.0, 1000.0), "InitResreq": _resource(4000.0, 0.0, 1000.0), "DRAResreq": None,
        "ResourceClaimKeys": None, "ResourceClaimDRAResreq": None,
        "NodeName": "", "EvictionOccurred": False, "JobAllocatedHyperNode": "", "Status": PENDING,
        "LastTransaction": None, "Priority": 0, "VolumeReady": False, "Preemptable": False, "BestEffort": False,
        "HasRestartableInitContainer": False, "SchGated": False, "RevocableZone": "", "NumaInfo": None,
        "Pod": the_pod, "PodAnnotations": the_pod["metadata"].get("annotations"), "CustomBindErrHandlerSucceeded": False,
    }  # fmt: skip


def node_info(name: str) -> dict[str, Any]:
    """``api.NodeInfo`` of a ready node with 8 GPUs, one in use: its exported fields in declaration order."""
    return {
        "Name": name, "Node": node(name), "State": {"Phase": READY, "Reason": ""},
        "Releasing": _resource(0.0, 0.0, None), "Pipelined": _resource(0.0, 0.0, None),
        "Idle": _resource(60000.0, 0.0, 7000.0), "Used": _resource(4000.0, 0.0, 1000.0),
        "Allocatable": _resource(64000.0, 0.0, 8000.0), "Capacity": _resource(64000.0, 0.0, 8000.0),
        "ResourceUsage": None, "Tasks": {}, "NumaInfo": None, "UnassignedNumaPods": None, "NumaSchedulerInfo": None,
        "RevocableZone": "", "Others": None, "OversubscriptionNode": False, "OfflineJobEvicting": False,
        "OversubscriptionResource": None, "ImageStates": None, "Generation": 0, "BindGeneration": 0,
    }  # fmt: skip


def volcano_predicate(the_pod: dict[str, Any], name: str) -> dict[str, Any]:
    """``PredicateRequest``: ``{"task": TaskInfo, "node": NodeInfo}``."""
    return {"task": task_info(the_pod), "node": node_info(name)}


def volcano_prioritize(the_pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """``PrioritizeRequest``: ``{"task": TaskInfo, "nodes": [NodeInfo]}``."""
    return {"task": task_info(the_pod), "nodes": [node_info(n) for n in names]}

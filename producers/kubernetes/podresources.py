"""GPUs to pods: the kubelet PodResources API v1 ``List`` (gRPC over the kubelet's unix socket).

The NVIDIA device plugin registers the resource ``nvidia.com/gpu`` with device ids ``GPU-<uuid>`` (NVML's
UUID of the GPU) and, under time-slicing, ``GPU-<uuid>::<n>`` for the n-th replica of that GPU: several pods
then hold the same GPU.

>>> gpu_of_device("GPU-8f0c::3"), gpu_of_device("GPU-8f0c")
('GPU-8f0c', 'GPU-8f0c')
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


class PodResourcesError(RuntimeError):
    """The kubelet's PodResources API could not be read; the message says why and what to check."""


@dataclass(frozen=True)
class Assignment:
    """A GPU a container of a pod holds (one per device id; time-sliced replicas of one GPU collapse)."""

    namespace: str
    pod: str
    container: str
    gpu_uuid: str


def gpu_of_device(device_id: str) -> str:
    """The GPU UUID of a device id (a time-slicing replica ``GPU-<uuid>::<n>`` is its GPU)."""
    return device_id.split("::", 1)[0]


def assignments(response: Any, resource: str = GPU_RESOURCE) -> list[Assignment]:
    """The GPUs of ``resource`` in a ``ListPodResourcesResponse``, one per (pod, container, GPU)."""
    out: dict[Assignment, None] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name != resource:
                    continue
                for device_id in devices.device_ids:
                    out[Assignment(pod.namespace, pod.name, container.name, gpu_of_device(device_id))] = None
    return list(out)


class PodResourcesClient:
    """``List`` on the kubelet's PodResources socket (the producer mounts its directory read-only)."""

    def __init__(self, socket_path: str | Path = DEFAULT_SOCKET, *, timeout_s: float = 5.0, resource: str = GPU_RESOURCE) -> None:
        self.socket_path = Path(socket_path)
        self.timeout_s = timeout_s
        self.resource = resource
        self._channel: Any = None
        self._stub: Any = None

    def list(self) -> list[Assignment]:
        """Every GPU held by a pod of this node now; :class:`PodResourcesError` when the kubelet cannot tell."""
        import grpc

        api_pb2: Any = importlib.import_module("producers.kubernetes.podresources_v1.api_pb2")  # generated, untyped
        api_pb2_grpc: Any = importlib.import_module("producers.kubernetes.podresources_v1.api_pb2_grpc")

        where = f"kubelet pod-resources socket {self.socket_path}"
        if not self.socket_path.exists():
            raise PodResourcesError(
                f"{where} does not exist: mount the kubelet's pod-resources directory (AIP_PODRESOURCES_SOCKET)"
            )
        if self._stub is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        try:
            response = self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            self.close()
            code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
            details = exc.details() if hasattr(exc, "details") else str(exc)
            if not os.access(self.socket_path, os.R_OK | os.W_OK):
                raise PodResourcesError(f"{where}: permission denied (the producer must run as root to connect to it)") from None
            raise PodResourcesError(f"{where}: List failed ({code}: {details})") from None
        return assignments(response, self.resource)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

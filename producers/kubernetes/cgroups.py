"""A process's pod, from the pod UID in ``/proc/<pid>/cgroup`` (cgroup v1 and v2, cgroupfs and systemd drivers).

The kubelet puts each pod's containers under a cgroup named after the pod UID: ``pod<uid>`` with the cgroupfs
driver (``/kubepods/burstable/pod1b4e...-...``), ``kubepods-<qos>-pod<uid>.slice`` with ``-`` turned into ``_``
under the systemd driver.  The container's own cgroup below it names the container id
(``cri-containerd-<id>.scope``, ``docker-<id>.scope``, ``crio-<id>.scope``, or the bare id).

>>> line = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b4e2c3d_0000_4a5b_8c9d_00112233aabb.slice/cri-containerd-" + "ab" * 32 + ".scope"
>>> pod_of_cgroup(line) == ("1b4e2c3d-0000-4a5b-8c9d-00112233aabb", "ab" * 32)
True
>>> pod_of_cgroup("11:memory:/kubepods/besteffort/pod1b4e2c3d-0000-4a5b-8c9d-00112233aabb/" + "cd" * 32)[1] == "cd" * 32
True
>>> pod_of_cgroup("0::/user.slice/user-1000.slice/session-2.scope") is None
True
"""

from __future__ import annotations

import re
from pathlib import Path

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
POD_RE = re.compile(rf"pod({_UID})(?:\.slice)?(?:/|$)")
CONTAINER_RE = re.compile(r"(?:^|/)(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?(?:/|$)")


def pod_of_cgroup(text: str) -> tuple[str, str | None] | None:
    """(pod UID, container id or None) named in the contents of a ``/proc/<pid>/cgroup``; None outside a pod."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = POD_RE.search(path)
        if m is None:
            continue
        c = CONTAINER_RE.search(path[m.end() - 1 :])
        return m.group(1).replace("_", "-"), c.group(1) if c else None
    return None


def container_id(status_id: str) -> str:
    """The bare id of a pod status's ``containerID`` (``containerd://<id>``, ``docker://<id>``, ``cri-o://<id>``).

    >>> container_id("containerd://abc")
    'abc'
    """
    return status_id.rpartition("://")[2]


class ProcPods:
    """Pod of a process, read from ``proc`` (the host's ``/proc``: the producer needs the host PID namespace,
    since NVML reports host PIDs)."""

    def __init__(self, proc: str | Path = "/proc") -> None:
        self.proc = Path(proc)

    def pod_of(self, pid: int) -> tuple[str, str | None] | None:
        """(pod UID, container id or None); None for a process outside a pod or not visible here."""
        try:
            text = (self.proc / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        return pod_of_cgroup(text)

    def visible(self, pid: int) -> bool:
        """Whether ``pid`` exists in ``proc`` (a PID of another PID namespace does not)."""
        return (self.proc / str(pid)).exists()

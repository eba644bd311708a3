"""Training steps of an unmodified PyTorch script, counted in its own process and sent to a local collector.

Standard library only (Python 3.8 or later): this file and ``sitecustomize.py`` are all a training process
needs (no Kafka, no broker credentials, no ``aip``).  ``sitecustomize.py`` calls :func:`install` at interpreter start-up; it
imports nothing heavy and does not import torch.  When the script itself imports ``torch.optim`` (``import
torch`` does), a one-shot import watcher registers torch's global
``torch.optim.optimizer.register_optimizer_step_post_hook``.  One step is one ``step()`` of the first
optimizer that steps (a GAN's second optimizer does not double the count; when that optimizer is gone, the
next one that steps takes over).  A script that never imports torch pays one string comparison per import.

Reports follow :class:`StepRate` (the rule :class:`producers.lifecycle.JobReporter` uses): at most one per
``MIN_INTERVAL_S``, with the cumulative steps and the mean step time since the previous report, timed from
the first step (start-up and the first step's warm-up are not steps), and one for the steps left at exit.
A process whose script builds a ``JobReporter`` reports its steps there: the reporter calls
:func:`stand_down` and the hook sends nothing more.

Datagram: one per report, a UTF-8 JSON object sent without blocking to the unix datagram socket named by
``AIP_STEP_SOCKET`` (default ``/var/run/aip/steps.sock``)::

    {"v": 1, "pid": 4242, "steps": 120, "step_time_s": 0.0503, "ts": 1700000000.25,
     "pod_uid": "0f8c...", "job_id": "j1", "job_type": "ResNet-50"}

``v`` is the format version; ``steps`` counts steps since the process started; ``step_time_s`` is the mean
since the previous report of this pid; ``ts`` is the wall-clock time (Unix seconds) of the last step counted.
``pod_uid`` (the Kubernetes pod UID in ``/proc/self/cgroup``), ``job_id`` and ``job_type`` (env
``AIP_JOB_ID`` and ``AIP_JOB_TYPE``) are present only when known.  A collector that is gone, full or never
was costs nothing but a failed ``sendto``: every ``OSError`` is caught and sending backs off (doubling from
``BACKOFF_S`` up to ``BACKOFF_MAX_S``) while the counting goes on.
"""

from __future__ import annotations

import os
import sys
import time

Any = object  # annotations only: importing typing (or weakref) would cost a process that never trains milliseconds

VERSION = 1
MIN_INTERVAL_S = 2.0
"""At most one progress report per this many seconds (the hook's and ``JobReporter``'s)."""
SOCKET_ENV = "AIP_STEP_SOCKET"
DEFAULT_SOCKET = "/var/run/aip/steps.sock"
"""Where the node's collector listens (the ``step_socket`` setting's default)."""
BACKOFF_S = 1.0
BACKOFF_MAX_S = 60.0
MAX_DATAGRAM_BYTES = 1024
WATCHED = "torch.optim"


class StepRate:
    """When a progress report is due and the mean step time it carries.

    >>> rate = StepRate(min_interval_s=2.0)
    >>> [rate.step(t) for t in (10.0, 10.5, 11.0, 11.5, 12.0, 12.5)]
    [None, None, None, None, 0.5, None]
    >>> rate.steps, rate.rest()
    (6, 0.5)
    """

    __slots__ = ("due_s", "last_step_s", "min_interval_s", "since_s", "since_steps", "steps")

    def __init__(self, min_interval_s: float = MIN_INTERVAL_S) -> None:
        self.min_interval_s = min_interval_s
        self.steps = 0
        self.since_s: float | None = None
        self.since_steps = 0
        self.last_step_s: float | None = None
        self.due_s = float("-inf")  # before it, no report is due (the per-step path: one comparison)

    def start(self, now: float) -> None:
        """Time the next report's steps from ``now`` (without it, from the first step)."""
        self.since_s = now
        self.since_steps = self.steps
        self.due_s = now + self.min_interval_s

    def step(self, now: float, n: int = 1) -> float | None:
        """Count ``n`` steps finished at ``now``; when a report is due, its mean step time (and it counts as made)."""
        self.steps += n
        self.last_step_s = now
        if now < self.due_s:
            return None
        since = self.since_s
        if since is None or now - since < self.min_interval_s or self.steps <= self.since_steps:
            if since is None:
                self.start(now)
            return None
        step_time_s = (now - since) / (self.steps - self.since_steps)
        self.start(now)
        return step_time_s

    def rest(self) -> float | None:
        """The mean step time of the steps not reported yet, up to the last step (None when there are none)."""
        since, last = self.since_s, self.last_step_s
        if since is None or last is None or self.steps <= self.since_steps or last <= since:
            return None
        step_time_s = (last - since) / (self.steps - self.since_steps)
        self.start(last)
        return step_time_s


def pod_uid(cgroup_text: str) -> str | None:
    """The Kubernetes pod UID in a ``/proc/<pid>/cgroup`` text (cgroupfs or systemd driver, v1 or v2), else None.

    >>> pod_uid("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1f2e3d4c_0000_4aaa_8bbb_0123456789ab.slice/cri-containerd-1.scope")
    '1f2e3d4c-0000-4aaa-8bbb-0123456789ab'
    >>> pod_uid("12:memory:/kubepods/burstable/pod1f2e3d4c-0000-4aaa-8bbb-0123456789ab/abc")
    '1f2e3d4c-0000-4aaa-8bbb-0123456789ab'
    >>> pod_uid("0::/user.slice") is None
    True
    """
    import re

    m = re.search(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})", cgroup_text)
    return m.group(1).replace("_", "-") if m else None


class Sender:
    """Non-blocking datagrams to the collector's socket; failures back off and never raise."""

    def __init__(self, path: str, clock: Any = time.monotonic) -> None:
        self.path = path
        self.clock = clock
        self.sock: Any = None
        self.retry_at = 0.0
        self.backoff_s = BACKOFF_S
        self.sent = 0
        self.failed = 0

    def send(self, payload: bytes) -> bool:
        now = self.clock()
        if now < self.retry_at:
            self.failed += 1
            return False
        try:
            if self.sock is None:
                import socket

                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self.sock.setblocking(False)
            self.sock.sendto(payload, self.path)
        except OSError:
            self.failed += 1
            self.retry_at = now + self.backoff_s
            self.backoff_s = min(self.backoff_s * 2.0, BACKOFF_MAX_S)
            return False
        self.sent += 1
        self.backoff_s = BACKOFF_S
        return True


def _nothing() -> None:
    return None


class StepHook:
    """The optimizer step post-hook: counts one optimizer's steps and reports them through a :class:`Sender`."""

    def __init__(
        self,
        sender: Sender,
        min_interval_s: float = MIN_INTERVAL_S,
        clock: Any = time.perf_counter,
        wall: Any = time.time,
        environ: Any = os.environ,
        cgroup_path: str = "/proc/self/cgroup",
    ) -> None:
        self.sender = sender
        self.rate = StepRate(min_interval_s)
        self.clock = clock
        self.wall = wall
        self.environ = environ
        self.cgroup_path = cgroup_path
        self.handle: Any = None
        self.off = False
        self._optimizer: Any = _nothing  # a weak reference to the optimizer whose steps count
        self._tick = self.rate.step
        self._fields: dict[str, Any] | None = None

    def __call__(self, optimizer: Any, args: Any = (), kwargs: Any = None) -> None:
        if self._optimizer() is not optimizer and not self._adopt(optimizer):
            return  # another optimizer of the same training step
        step_time_s = self._tick(self.clock())
        if step_time_s is not None:
            self.report(step_time_s, self.wall())

    def _adopt(self, optimizer: Any) -> bool:
        """Count ``optimizer``'s steps from now on, unless the one counted so far still exists."""
        if self._optimizer() is not None:
            return False
        import weakref

        try:
            self._optimizer = weakref.ref(optimizer)
        except TypeError:
            self._optimizer = lambda: optimizer
        return True

    def report(self, step_time_s: float, ts: float) -> bool:
        """Send one report; False when it was not sent.  Never raises: the training step must not fail here."""
        if self.off:
            return False
        try:
            return self._report(step_time_s, ts)
        except Exception:
            return False

    def _report(self, step_time_s: float, ts: float) -> bool:
        if self._fields is None:
            self._fields = self._known_fields()
        import json

        message = {"v": VERSION, "pid": os.getpid(), "steps": self.rate.steps, "step_time_s": step_time_s, "ts": ts}
        message.update(self._fields)
        payload = json.dumps(message, separators=(",", ":")).encode()
        if len(payload) > MAX_DATAGRAM_BYTES:  # absurdly long env values: send the counts alone
            payload = json.dumps({k: message[k] for k in ("v", "pid", "steps", "step_time_s", "ts")}).encode()
        return self.sender.send(payload)

    def _known_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        try:
            with open(self.cgroup_path) as f:
                uid = pod_uid(f.read())
            if uid:
                fields["pod_uid"] = uid
        except OSError:
            pass
        for key, env in (("job_id", "AIP_JOB_ID"), ("job_type", "AIP_JOB_TYPE")):
            if self.environ.get(env):
                fields[key] = self.environ[env]
        return fields

    def flush(self) -> None:
        """Report the steps not reported yet (at interpreter exit)."""
        step_time_s = self.rate.rest()
        last = self.rate.last_step_s
        if step_time_s is not None and last is not None:
            self.report(step_time_s, self.wall() - (self.clock() - last))

    def register(self, optimizer_module: Any) -> bool:
        """Register with torch's global optimizer step post-hooks (``torch.optim.optimizer``); False on a torch without them."""
        if self.off or self.handle is not None:
            return False
        register = getattr(optimizer_module, "register_optimizer_step_post_hook", None)
        if register is None:
            return False
        self.handle = register(self)
        return True

    def stand_down(self) -> None:
        """Stop counting and reporting for good (the process reports its steps another way)."""
        self.off = True
        if self.handle is not None:
            try:
                self.handle.remove()
            except Exception:  # a torch handle that cannot remove itself must not break the script
                pass
            self.handle = None


class _ThenLoader:
    """A module's own loader, followed by a callback once the module has executed."""

    def __init__(self, loader: Any, then: Any) -> None:
        self.loader = loader
        self.then = then

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self.loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        self.loader.exec_module(module)
        self.then(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class TorchOptimWatcher:
    """A meta-path finder that does nothing but notice the import of ``torch.optim``, then leaves ``sys.meta_path``."""

    def __init__(self, then: Any) -> None:
        self.then = then

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != WATCHED:
            return None
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ThenLoader(spec.loader, self._done)
        return spec

    def _done(self, module: Any) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        optimizer_module = sys.modules.get(WATCHED + ".optimizer")
        if optimizer_module is not None:
            self.then(optimizer_module)

    def invalidate_caches(self) -> None:
        pass


hook: StepHook | None = None
"""This process's hook once :func:`install` has run."""


def _registered(optimizer_module: Any) -> None:
    if hook is not None:
        hook.register(optimizer_module)


def install(environ: Any = os.environ) -> StepHook | None:
    """Set up this process's hook once (a second call, e.g. from a chained copy, returns the first)."""
    global hook
    if hook is not None:
        return hook
    hook = StepHook(Sender(environ.get(SOCKET_ENV) or DEFAULT_SOCKET), environ=environ)
    optimizer_module = sys.modules.get(WATCHED + ".optimizer")
    if optimizer_module is not None and WATCHED in sys.modules:
        hook.register(optimizer_module)
    else:
        sys.meta_path.insert(0, TorchOptimWatcher(_registered))
    import atexit

    atexit.register(hook.flush)
    return hook


def stand_down() -> None:
    """Called by ``JobReporter``: this process reports its own steps, so the hook counts none."""
    if hook is not None:
        hook.stand_down()


_visited: list[str] = []


def chain(own_dir: str) -> Any:
    """Run the next ``sitecustomize`` on ``sys.path`` after ``own_dir`` (and after every hook copy already run).

    Returns the module run, or None when there is none.  A user's or a distribution's ``sitecustomize``
    thus still runs, once, and a second copy of the hook on the path chains on without looping.
    """
    import importlib.machinery

    _visited.append(os.path.realpath(own_dir or "."))
    path = [p for p in sys.path if os.path.realpath(p or ".") not in _visited]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return None
    module = type(sys)("sitecustomize")  # importlib.util.module_from_spec, without importing importlib.util
    module.__spec__, module.__loader__, module.__file__ = spec, spec.loader, spec.origin
    spec.loader.exec_module(module)
    return module

"""The step hook (producers/stephook) and its collector, without Kafka: a collector that is gone, chained
sitecustomize modules, scripts that report with JobReporter, the datagram contract."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from config import Settings
from producers.stepcollector import StepCollector, one_job, parse
from producers.stephook import HOOK_DIR, HOOK_FILES, install
from producers.stephook import aip_stephook as hookmod

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "tests" / "train_steps.py"


def child(
    code: str, tmp: Path, *, pythonpath: list[str], socket_path: str, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter with ``pythonpath`` first, as ``aip run-job`` starts one."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join([*pythonpath, str(ROOT)]),
        "AIP_STEP_SOCKET": socket_path,
    }
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp, capture_output=True, text=True, timeout=timeout)


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_the_default_socket_is_the_settings_default() -> None:
    assert Settings().step_socket == hookmod.DEFAULT_SOCKET
    assert Settings.from_env({hookmod.SOCKET_ENV: "/x/s.sock"}).step_socket == "/x/s.sock"


def test_step_rate_reports_every_interval_with_the_mean_step_time() -> None:
    rate = hookmod.StepRate(min_interval_s=2.0)
    due = [(i, t) for i in range(1, 101) if (t := rate.step(i * 0.125)) is not None]
    assert [i for i, _ in due] == [17, 33, 49, 65, 81, 97]  # the first step starts the clock: 16 steps of 0.125 s each time
    assert {t for _, t in due} == {0.125}
    assert rate.rest() == 0.125 and rate.rest() is None  # steps 98..100, then nothing left


def test_a_collector_that_is_gone_never_raises_and_sending_backs_off(tmp_path: Path) -> None:
    clock = Clock()
    sender = hookmod.Sender(str(tmp_path / "nobody.sock"), clock=clock)
    hook = hookmod.StepHook(sender, min_interval_s=0.0, clock=clock, cgroup_path=str(tmp_path / "no-cgroup"))
    opt = object.__new__(type("Opt", (), {}))
    for _ in range(1000):
        clock.t += 0.001
        hook(opt, (), {})
    assert hook.rate.steps == 1000 and sender.sent == 0
    assert sender.failed == 999  # every report failed ...
    assert sender.backoff_s > hookmod.BACKOFF_S  # ... and after a failed sendto the next ones wait
    assert sender.retry_at > clock.t


def test_a_report_that_fails_never_reaches_the_training_step(tmp_path: Path) -> None:
    class Broken(hookmod.Sender):
        def send(self, payload: bytes) -> bool:
            raise RuntimeError("a bug in sending")

    hook = hookmod.StepHook(Broken(str(tmp_path / "s")), min_interval_s=0.0, environ={"AIP_JOB_ID": "j"})
    opt = type("Opt", (), {})()
    for _ in range(5):
        hook(opt)
    assert hook.rate.steps == 5


def test_a_full_collector_never_blocks(tmp_path: Path) -> None:
    path = str(tmp_path / "full.sock")
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    deaf.bind(path)  # bound, never read: its queue fills up
    clock = Clock()
    sender = hookmod.Sender(path, clock=clock)
    results = []
    for _ in range(5000):
        clock.t += 120.0  # past any backoff: every call really tries
        results.append(sender.send(b"x" * 900))
    deaf.close()
    assert results[0] and not results[-1] and sender.failed > 0  # EAGAIN, caught: a send never waits


def test_only_the_first_optimizer_counts(tmp_path: Path) -> None:
    clock = Clock()
    hook = hookmod.StepHook(hookmod.Sender(str(tmp_path / "s")), clock=clock)
    cls = type("Opt", (), {})
    gen, disc = cls(), cls()
    for _ in range(10):
        hook(gen)
        hook(disc)
    assert hook.rate.steps == 10
    del gen  # gone: the next optimizer that steps takes over
    hook(disc)
    assert hook.rate.steps == 11


def test_the_hook_directory_is_what_a_training_process_needs(tmp_path: Path) -> None:
    written = install(tmp_path / "hook")
    assert sorted(p.name for p in written) == sorted(HOOK_FILES)
    for p in written:
        assert p.read_bytes() == (HOOK_DIR / p.name).read_bytes()
    # standard library only: what is copied imports nothing but the standard library and itself
    imported = set()
    for name in HOOK_FILES:
        for node in ast.walk(ast.parse((HOOK_DIR / name).read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add((node.module or "").split(".")[0])
    assert "aip_stephook" in imported and "json" in imported
    assert imported - {"aip_stephook", "__future__"} <= sys.stdlib_module_names, imported - sys.stdlib_module_names


def test_chained_sitecustomize_runs_once_and_torch_is_not_imported(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    marker = tmp_path / "marker"
    (user / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'a').write('ran\\n')\n")
    copy = tmp_path / "copy"
    install(copy)  # a second copy of the hook on the path (the node's, under aip run-job's)
    code = (
        "import sys, json; import aip_stephook as h;"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'installed': h.hook is not None,"
        " 'watching': any(type(f).__name__ == 'TorchOptimWatcher' for f in sys.meta_path)}))"
    )
    proc = child(code, tmp_path, pythonpath=[str(HOOK_DIR), str(copy), str(user)], socket_path=str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"torch": False, "installed": True, "watching": True}
    assert marker.read_text() == "ran\n"


def test_the_hook_registers_once_torch_is_imported(tmp_path: Path) -> None:
    code = (
        "import sys, aip_stephook as h; assert h.hook.handle is None; import torch;"
        "print(h.hook.handle is not None, any(type(f).__name__ == 'TorchOptimWatcher' for f in sys.meta_path))"
    )
    proc = child(code, tmp_path, pythonpath=[str(HOOK_DIR)], socket_path=str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False"]  # registered, and the watcher has left sys.meta_path


def test_training_with_no_collector_runs_to_the_end(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    code = f"import runpy, sys; sys.argv = ['train', {str(out)!r}, '250', '0.01']; runpy.run_path({str(TRAIN)!r}, run_name='__main__')"
    proc = child(code, tmp_path, pythonpath=[str(HOOK_DIR)], socket_path=str(tmp_path / "gone" / "steps.sock"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["steps"] == 250


REPORTER_SCRIPT = """
import json, sys, torch
from producers.lifecycle import JobReporter, track_optimizer
events = []
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
import time
with JobReporter("T", gpu_uuid="GPU-1", publish=lambda t, r: events.append(r), wrapped=True) as job:
    track_optimizer(job, opt)
    for _ in range(250):
        model(torch.randn(8, 4)).sum().backward()
        time.sleep(0.01)
        opt.step()
import aip_stephook
print(json.dumps({"progress": [e.steps for e in events], "hook_steps": aip_stephook.hook.rate.steps}))
"""


def test_a_script_that_uses_job_reporter_is_not_counted_twice(tmp_path: Path) -> None:
    path = tmp_path / "steps.sock"
    received: list[Any] = []
    with StepCollector(path, one_job("j", "T", "GPU-1"), lambda t, r: received.append(r), host="h") as collector:
        proc = child(REPORTER_SCRIPT, tmp_path, pythonpath=[str(HOOK_DIR)], socket_path=str(path))
        collector.poll()
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["progress"] and out["progress"][-1] <= 250  # the script's reporter counted its steps
    assert out["hook_steps"] == 0 and collector.counters["datagrams"] == 0 and received == []


def test_collector_follows_one_process_per_job_and_drops_bad_datagrams(tmp_path: Path) -> None:
    clock = Clock(0.0)
    events: list[Any] = []
    c = StepCollector(tmp_path / "s.sock", one_job("j", "T", "GPU-1", 32), lambda t, r: events.append(r), host="h", clock=clock)

    def msg(pid: int, steps: int) -> bytes:
        return json.dumps({"v": 1, "pid": pid, "steps": steps, "step_time_s": 0.1, "ts": 1.7e9 + clock.t}).encode()

    assert c.handle(msg(10, 20)) == 1
    clock.t = 2.0
    assert c.handle(msg(11, 5)) == 0  # a second rank of the same job while the first reports: ignored
    clock.t = 4.0
    assert c.handle(msg(10, 40)) == 1
    clock.t = 20.0
    assert c.handle(msg(12, 30)) == 1  # the first has been silent: the new process continues the count
    assert c.handle(b"{not json") == 0 and c.handle(json.dumps({"v": 2}).encode()) == 0
    assert [e.steps for e in events] == [20, 40, 70] and {e.batch_size for e in events} == {32}
    assert [e.pid for e in events] == [10, 10, 12] and c.steps("j") == 70
    assert c.counters["other_pid"] == 1 and c.counters["invalid"] == 2


def test_resolve_failures_and_unknown_processes_are_counted(tmp_path: Path) -> None:
    def resolve(m: dict[str, Any]) -> Any:
        if m["pid"] == 1:
            raise KeyError("pod lookup")
        return None

    c = StepCollector(tmp_path / "s.sock", resolve, lambda t, r: None)
    ok = {"v": 1, "steps": 1, "step_time_s": 0.1, "ts": 1.7e9}
    assert c.handle(json.dumps(ok | {"pid": 1}).encode()) == 0
    assert c.handle(json.dumps(ok | {"pid": 2}).encode()) == 0
    assert c.counters["resolve_failed"] == 1 and c.counters["unresolved"] == 1


def test_the_kernel_vouches_for_the_sender_pid(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    def resolve(m: dict[str, Any]) -> Any:
        seen.append(m)
        return ("j", "T", "GPU-1")

    with StepCollector(tmp_path / "s.sock", resolve, lambda t, r: None) as c:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.sendto(
            json.dumps({"v": 1, "pid": 1, "steps": 3, "step_time_s": 0.2, "ts": 1.7e9, "pod_uid": "u"}).encode(), str(c.path)
        )
        assert c.poll(timeout_s=5.0) == 1
    assert seen[0]["pod_uid"] == "u" and seen[0]["pid"] == 1
    if sys.platform == "linux":
        assert seen[0]["sender_pid"] == os.getpid()
    assert not (tmp_path / "s.sock").exists()  # close removes the socket


def test_parse_names_what_is_wrong() -> None:
    good = {"v": 1, "pid": 1, "steps": 2, "step_time_s": 0.5, "ts": 1.7e9}
    assert parse(json.dumps(good).encode())["step_time_s"] == 0.5
    for bad, why in (
        ({**good, "step_time_s": "fast"}, "step_time_s"),
        ({**good, "pid": True}, "pid"),
        ({**good, "job_id": 3}, "job_id"),
        ({**good, "ts": 1.7e12}, "Unix seconds"),  # milliseconds
        ([1], "JSON object"),
    ):
        with pytest.raises(ValueError, match=why):
            parse(json.dumps(bad).encode())

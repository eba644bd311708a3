"""``config.process.die_with_parent``: a child started with it leads its own process group and dies when its parent is SIGKILLed."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys

import pytest
from conftest import children, exited, wait_for

PARENT = """
import subprocess, sys, time
import functools, os
from config.process import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=functools.partial(die_with_parent, os.getpid()))
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_child_dies_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert children(parent.pid) == [child]
        assert os.getpgid(child) == child  # a process group of its own
        assert not exited(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        wait_for(lambda: exited(child), timeout_s=10, what="the orphaned child to exit")
    finally:
        parent.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_whose_parent_died_before_it_asked_for_the_signal_exits() -> None:
    """Killed between the fork and the child's prctl, a parent sends no signal: the child, whose parent is then
    another process than the one that started it, exits at once instead of running on as an orphan."""
    from config.process import die_with_parent

    not_my_parent = os.getpid() + 1  # what the child sees once its parent is gone: some other process
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=functools.partial(die_with_parent, not_my_parent)
    )
    try:
        assert child.wait(10) == 0
    finally:
        child.kill()

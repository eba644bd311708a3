"""Child-process set-up that every layer may use (the standard library only, like the settings)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def exit_with_parent(owner_pid: int | None = None) -> None:  # pragma: no cover - runs in the child
    """Linux SIGTERMs this process when its parent dies, even by SIGKILL (elsewhere a no-op).  With
    ``owner_pid``: exit at once if the parent is no longer that process (it died before the signal was set,
    so none would come)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if owner_pid is not None and os.getppid() != owner_pid:
        os._exit(0)


def die_with_parent(owner_pid: int | None = None) -> None:  # pragma: no cover - runs in the child
    """``preexec_fn`` for children: :func:`exit_with_parent`, and the child gets its own process group
    (Ctrl-C goes to the parent, which stops its children in order).  Give the parent's pid
    (``functools.partial(die_with_parent, os.getpid())``): a parent killed between the fork and the child's
    ``prctl`` sends no signal, and the child, seeing another parent, exits instead of living on as an orphan."""
    exit_with_parent(owner_pid)
    os.setpgrp()

"""Child-process set-up that every layer may use (the standard library only, like the settings)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:  # pragma: no cover - runs in the child
    """``preexec_fn`` for children: Linux SIGTERMs the child when the process that started it dies
    (even by SIGKILL; elsewhere a no-op), and the child gets its own process group (Ctrl-C goes to
    the parent, which stops its children in order)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    os.setpgrp()

"""The step hook injected into training processes (``sitecustomize.py`` + ``aip_stephook.py``): standard library only.

The directory itself goes first on a child's ``PYTHONPATH`` (``aip run-job``) or is copied beside the node
collector's socket (``aip hook install DIR``); see :mod:`producers.stephook.aip_stephook`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HOOK_DIR = Path(__file__).resolve().parent
HOOK_FILES = ("sitecustomize.py", "aip_stephook.py")
"""What a training process needs of the hook: copied as they are, nothing else of the package."""


def install(target: str | Path) -> list[Path]:
    """Copy the hook's files into ``target`` (created when missing); return the paths written.

    Each file is written under a temporary name and renamed, so a training process starting meanwhile
    reads either the old file or the new one, never half of one.
    """
    out = Path(target)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in HOOK_FILES:
        tmp = out / f".{name}.tmp"
        shutil.copyfile(HOOK_DIR / name, tmp)
        tmp.chmod(0o644)
        tmp.replace(out / name)
        written.append(out / name)
    return written

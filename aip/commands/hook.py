"""``aip hook install DIR``: copy the step hook where training processes can put it on their ``PYTHONPATH``.

On Kubernetes the producer DaemonSet runs ``aip hook install /var/run/aip/hook`` (an init container does)
on the hostPath ``/var/run/aip`` that also holds the collector's socket; a training pod then sets
``PYTHONPATH=/var/run/aip/hook`` and mounts ``/var/run/aip``.  ``aip hook path`` prints the directory
the installed package ships it in.
"""

from __future__ import annotations

import argparse
from typing import Any

from aip.errors import CliError


def register(sub: Any) -> None:
    p = sub.add_parser("hook", help="the step hook of unmodified PyTorch scripts: copy it for training pods")
    verbs = p.add_subparsers(dest="verb", required=True)
    inst = verbs.add_parser("install", help="copy sitecustomize.py and aip_stephook.py into DIR (created when missing)")
    inst.add_argument("dir", help="target directory, e.g. /var/run/aip/hook")
    inst.set_defaults(func=install)
    path = verbs.add_parser("path", help="print the directory the package ships the hook in")
    path.set_defaults(func=show_path)


def install(args: argparse.Namespace) -> int:
    from producers.stephook import install as copy_hook

    try:
        written = copy_hook(args.dir)
    except OSError as exc:
        raise CliError(f"cannot install the step hook in {args.dir}: {exc.strerror or exc}") from None
    for path in written:
        print(path)
    return 0


def show_path(args: argparse.Namespace) -> int:
    from producers.stephook import HOOK_DIR

    print(HOOK_DIR)
    return 0

"""Start-up of the aip step hook in a training process (this directory first on ``PYTHONPATH``).

It sets up the hook (``aip_stephook``: standard library only, torch untouched until the script imports it)
and then runs the ``sitecustomize`` that this one hides, if any (a user's or the distribution's).
"""

import os as _os

try:
    import aip_stephook as _hook

    _hook.install()
except Exception:  # the hook must never stop a script from starting
    _hook = None  # type: ignore[assignment]

if _hook is not None:
    _hook.chain(_os.path.dirname(_os.path.abspath(__file__)))

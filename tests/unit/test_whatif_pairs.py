"""The what-if cache's pair predictions (``WhatIfCache(pairs=True)``, serving sharded): kept per snapshot, they give
the entries computed without them; models swapped for a new snapshot get none of the old pairs."""

from __future__ import annotations

import itertools
import math
from typing import Any

from models.environment import EnvironmentModels
from models.synthetic import gavel_observations
from streams.whatif import WhatIfCache


def _close(x: Any, y: Any) -> bool:
    """Equal, floats to 1e-9: a batch model's vectorised arithmetic may differ in the last bit with the rows of
    its call, and a kept pair was predicted in another call than the one that would predict it again."""
    if isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return len(x) == len(y) and all(_close(u, v) for u, v in zip(x, y, strict=True))
    if hasattr(x, "__struct_fields__"):
        return type(x) is type(y) and all(_close(getattr(x, f), getattr(y, f)) for f in x.__struct_fields__)
    return x == y


def test_kept_pairs_give_the_entries_of_pairs_predicted_anew() -> None:
    em, known = EnvironmentModels("v100"), {}
    for o in gavel_observations(600, seed=5):
        em.learn(o)
        known.setdefault(o.job_type, o.solo)
    em.refit_now()
    types = sorted(known)[:8]
    running = [list(r) for r in itertools.combinations(types, 2)] + [list(r) for r in itertools.combinations(types[:5], 3)]
    kept, anew = WhatIfCache(pairs=True), WhatIfCache(pairs=False)
    for run in running:  # every running set asks three-job sets of its pairs: the later ones find them kept
        a = kept.entries(em, known, run, [known[t] for t in run])
        b = anew.entries(em, known, run, [known[t] for t in run])
        assert a and _close(a, b)
    assert kept.pairs is not None and len(kept.pairs["v100"]) > len(types) and anew.pairs is None
    kept.forget("v100")  # a new snapshot's models: none of the old pairs
    assert "v100" not in kept.pairs

"""A tree's random state seeded again instead of made anew: the same draws, without numpy's entropy at every tree.

scikit-learn turns a tree's integer ``random_state`` into a ``RandomState`` twice per RandomForest tree (its bootstrap
rows, ``_forest._generate_sample_indices``, and its splitter, ``DecisionTreeRegressor._fit``) and once per ExtraTrees
tree or DecisionTree fit.  ``numpy.random.RandomState(seed)`` first seeds a fresh MT19937 from the operating system's entropy
(``SeedSequence``), then seeds it again from ``seed``: about 120 us, against 2 us for ``RandomState.seed(seed)`` of
one that exists.  The bench's refit of 10,000 observations made 1,884 of them (1,304 trees, 580 bootstraps): about
0.2 s of CPU; a forest's fit of about 1,300 rows took 4-16 % less (docs/BENCHMARKS.md, "Models").

:func:`install` puts, in those two places, a ``RandomState`` of the calling thread seeded with ``seed``: the state
``RandomState(seed)`` starts in (``seed`` resets the whole MT19937 state and the cached Gaussian), so the draws are the
same (``tests/unit/test_tree_seeds.py``: forests fitted with and without it predict the same floats).  Each place has
its own, and each draws from it before the next tree's call seeds it again: the bootstrap rows at once, the splitter
when the tree's builder starts.  Anything but an integer goes to scikit-learn's own ``check_random_state``.

Installed only on the scikit-learn releases whose code it was read against (``SKLEARN_VERSIONS``).
"""

from __future__ import annotations

import numbers
import threading
from typing import Any

import numpy as np

SKLEARN_VERSIONS = ((1, 9),)
"""(major, minor) of the scikit-learn releases whose tree and forest code this was read against."""

_states = threading.local()
_originals: dict[str, Any] = {}
_installing = threading.Lock()


def seeded(slot: str, seed: Any) -> Any:
    """This thread's ``RandomState`` of ``slot``, seeded with ``seed`` when it is an integer; else None.

    >>> a = seeded("doc", 7).randint(1000, size=3)
    >>> bool((a == np.random.RandomState(7).randint(1000, size=3)).all())
    True
    """
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        return None
    state = getattr(_states, slot, None)
    if state is None:
        state = np.random.RandomState(0)
        setattr(_states, slot, state)
    state.seed(seed)
    return state


def tree_random_state(seed: Any) -> Any:
    """``check_random_state`` as a tree's ``_fit`` calls it."""
    state = seeded("tree", seed)
    return _originals["check_random_state"](seed) if state is None else state


def generate_sample_indices(random_state: Any, *args: Any, **kwargs: Any) -> Any:
    """A forest tree's bootstrap rows, ``_forest._generate_sample_indices`` on this thread's seeded state."""
    state = seeded("bootstrap", random_state)
    return _originals["generate_sample_indices"](random_state if state is None else state, *args, **kwargs)


def install() -> bool:
    """Put :func:`tree_random_state` and :func:`generate_sample_indices` in scikit-learn's place, once; False where the
    installed release is not one this was read against (scikit-learn's own stay)."""
    if _originals:  # asked at every forest and tree made
        return True
    import sklearn
    from sklearn.ensemble import _forest
    from sklearn.tree import _classes

    if tuple(int(p) for p in sklearn.__version__.split(".")[:2]) not in SKLEARN_VERSIONS:
        return False
    with _installing:  # refits in two threads: the second must not keep the first's replacement as the original
        if not _originals:
            _originals["check_random_state"] = _classes.check_random_state
            _originals["generate_sample_indices"] = _forest._generate_sample_indices
            _classes.check_random_state = tree_random_state
            _forest._generate_sample_indices = generate_sample_indices
    return True


def uninstall() -> None:
    """scikit-learn's own back (tests)."""
    from sklearn.ensemble import _forest
    from sklearn.tree import _classes

    with _installing:
        if _originals:
            _classes.check_random_state = _originals.pop("check_random_state")
            _forest._generate_sample_indices = _originals.pop("generate_sample_indices")

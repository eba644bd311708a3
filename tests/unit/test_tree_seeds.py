"""Trees' random states seeded again (models.zoo.treeseeds): the same forests as scikit-learn's own states give."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from models.zoo import make_batch, treeseeds
from models.zoo.frames import Prepared

pytest.importorskip("sklearn")
if not treeseeds.install():
    pytest.skip("the installed scikit-learn's trees are not those treeseeds was read against", allow_module_level=True)

NAMES = ("RandomForest", "ExtraTrees", "DecisionTree")


def data(seed: int, copies: bool) -> Prepared:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(400, 5))
    x[rng.random(x.shape) < 0.02] = np.nan
    if copies:  # duplicated rows: fitted as distinct rows weighted by their copies (a weighted bootstrap)
        x = x[rng.integers(0, 150, size=400)]
    y = 3.0 * np.nan_to_num(x[:, 0]) + np.sin(np.nan_to_num(x[:, 1])) + rng.normal(scale=0.1, size=400)
    return Prepared.of_array([f"c{i}" for i in range(5)], x, y)


def predictions(installed: bool) -> dict[tuple[str, int, bool], np.ndarray]:
    if installed:
        treeseeds.install()
    else:
        treeseeds.uninstall()
    out = {}
    for name in NAMES:
        for seed in (0, 3):
            for copies in (False, True):
                d = data(seed, copies)
                out[(name, seed, copies)] = make_batch(name, seed).fit_prepared(d).predict_array(d.a)
    return out


def test_the_same_predictions_as_with_scikit_learns_own_states():
    try:
        theirs = predictions(installed=False)
        ours = predictions(installed=True)
    finally:
        treeseeds.install()
    assert theirs.keys() == ours.keys()
    for key in theirs:
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=str(key))
    # the seeds matter: another seed grows another forest, so equal predictions above are not a constant model's
    assert not np.array_equal(theirs[("RandomForest", 0, True)], theirs[("RandomForest", 3, True)])


def test_threads_fitting_at_once_get_the_same_forests():
    expected = predictions(installed=True)
    got: dict[int, dict] = {}

    def fit(i: int) -> None:
        got[i] = predictions(installed=True)

    threads = [threading.Thread(target=fit, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 3
    for result in got.values():
        for key, values in expected.items():
            np.testing.assert_array_equal(result[key], values, err_msg=str(key))


def test_other_seeds_go_to_scikit_learn():
    from sklearn.tree import _classes

    state = np.random.RandomState(5)
    assert _classes.check_random_state(state) is state
    assert _classes.check_random_state(None) is np.random.mtrand._rand
    assert treeseeds.seeded("x", True) is None  # a bool is not a seed here (scikit-learn's own error stays its own)
    with pytest.raises(ValueError):
        _classes.check_random_state("seven")

"""Serving a batch of observations at once (setting sharded: :meth:`Serving.served_ahead`,
:meth:`EnvironmentModels.serve_many`) gives each what serving it alone gives: the same predictions, to the bit."""

from __future__ import annotations

import copy

import msgspec
import numpy as np
import pandas as pd
import pytest

from events import Observation
from models.environment import EnvironmentModels
from models.synthetic import gavel_observations
from models.zoo.scikit import SKLEARN, SklearnModel
from models.zoo.torchmlp import TorchMLP
from streams.serving import Serving


def _learned() -> EnvironmentModels:
    em = EnvironmentModels("v100")
    for o in gavel_observations(400, seed=11):
        em.learn(o)
    em.refit_now()
    return em


def _with_triples(observations: list[Observation]) -> list[Observation]:
    """The observations, and after each a job set of three: its job next to its co-runner and the next one's job."""
    out = []
    for o, nxt in zip(observations, observations[1:] + observations[:1], strict=True):
        out.append(o)
        out.append(
            msgspec.structs.replace(
                o, job_id=o.job_id + "/3", co_job_types=[*o.co_job_types, nxt.job_type],
                co_job_ids=[*o.co_job_ids, nxt.job_id + "/3"], co_solo=[*o.co_solo, nxt.solo],
            )
        )  # fmt: skip
    return out


def test_serve_many_gives_each_observation_what_serving_it_alone_gives() -> None:
    em = _learned()
    batch = _with_triples([o for o in gavel_observations(60, seed=12) if o.colocated])
    composed = [s.results["placement"] for s in em.serve_many(batch) if len(s.views.sample.co_job_types) == 2]
    assert any(r is not None and r.model.startswith("compose/") for r in composed)
    alone, together = copy.deepcopy(em), copy.deepcopy(em)
    one = [alone.serve(o) for o in batch]
    many = together.serve_many(batch)
    assert [s.observation_id for s in many] == [o.observation_id for o in batch]
    assert [(s.raw, s.results, s.withheld) for s in many] == [(s.raw, s.results, s.withheld) for s in one]
    assert any(r is not None for s in many for r in s.results.values())
    assert (together.clipped, together.withheld_novel) == (alone.clipped, alone.withheld_novel)
    assert together.serve_many([]) == []


def test_a_served_batch_publishes_what_serving_each_alone_publishes() -> None:
    em = _learned()
    known = {}
    for o in gavel_observations(400, seed=11):
        known.setdefault(o.job_type, o.solo)
    batch = _with_triples(gavel_observations(40, seed=13))
    outs = []
    for ahead in (False, True):
        serving = Serving(clock=lambda: 1.0e9)
        serving.install("v100", 1, copy.deepcopy(em), known)
        served = serving.served_ahead(batch) if ahead else [None] * len(batch)
        assert ahead == any(s is not None for s in served)
        outs.append([serving.serve(o, [], s) for o, s in zip(batch, served, strict=True)])
    alone, together = outs
    assert [(o.predictions, o.alerts) for o in together] == [(o.predictions, o.alerts) for o in alone]
    assert sum(len(o.predictions) for o in together) > len(batch) // 2


def test_the_mlp_predicts_a_row_alike_whatever_rows_its_call_has() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 6))
    frame = pd.DataFrame(X, columns=[f"f{i}" for i in range(6)])
    mlp = TorchMLP(epochs=5).fit(frame, list(X @ rng.normal(size=6)))
    rows = frame.to_dict("records")
    together = mlp.predict_rows(rows)
    assert [float(v) for v in together] == [mlp.predict_one(r) for r in rows]
    one_by_one = [float(mlp._forward(X[i : i + 1])[0]) for i in range(len(X))]  # a 2-D product of that row alone
    assert [float(v) for v in together] == one_by_one
    assert list(mlp.predict_rows(rows[:1])) == one_by_one[:1] and len(mlp.predict_rows([])) == 0


@pytest.mark.parametrize("name", sorted(SKLEARN))
def test_every_scikit_learn_model_serves_a_row_alike_whatever_rows_its_call_has(name: str) -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 5)) * [1.0, 10.0, 100.0, 0.1, 1.0]
    frame = pd.DataFrame(X, columns=[f"c{i}" for i in range(5)])
    model = SklearnModel(name).fit(frame, list(X[:, 0] * X[:, 1] + X[:, 2] + rng.normal(size=200)))
    rows = (pd.DataFrame(rng.normal(size=(40, 5)) * [1.0, 10.0, 100.0, 0.1, 1.0], columns=frame.columns)).to_dict("records")
    together = [float(v) for v in model.predict_rows(rows)]
    alone = []
    for r in rows:
        model._memo = {}  # each row predicted, not remembered
        alone.append(model.predict_one(r))
    assert together == alone

"""The selection that holds on job families never seen: a family-grouped criterion picks the candidate that
transfers in ``aip evaluate`` (:func:`models.blend.blend`), and ``aip evaluate --json`` reports every candidate's held-out MAE beside it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aip.cli import main
from models.blend import blend, blend_members
from models.crossval import best_score, holdout_folds, with_families
from models.datasets import Dataset, Sample
from models.evaluate import candidate_scores, evaluate, fit_candidate

MODELS = ("LinearRegression", "DecisionTree", "KNN")

pytestmark = pytest.mark.usefixtures("few_identity_trees")



def _transfer_rows(families: int = 8, seed: int = 0) -> list[Sample]:
    """Job types ``f<i> (batch size 2|4|8)``, every pair, no family carried on the rows (as the stream's
    observations).  Solo ``S`` grows with the family (10 per family, plus a draw in [0, 3) per type); the slowdown
    is linear in the job's and the co-runner's ``S``, plus +-12 per pair of families: a model that memorises the
    families it has seen (a tree, nearest neighbours) learns that term from the pair's other job sets and wins the
    job-set CV; on a family never seen no model can know it, and only the linear fit carries the trend over."""
    rng = np.random.default_rng(seed)
    types = [(f, b) for f in range(families) for b in range(3)]
    solo_s = {t: 10.0 * t[0] + float(rng.uniform(0, 3)) for t in types}
    pair_term = rng.choice([-12.0, 12.0], (families, families))
    pair_term = np.triu(pair_term) + np.triu(pair_term, 1).T

    def name(t: tuple[int, int]) -> str:
        return f"f{t[0]} (batch size {2 ** (t[1] + 1)})"

    rows = []
    for i, a in enumerate(types):
        for c in types[i:]:
            group = " + ".join(sorted((name(a), name(c))))
            for job, co in ((a, c), (c, a)):
                y = 2.0 * solo_s[job] + solo_s[co] + float(pair_term[job[0], co[0]]) + float(rng.normal(0, 0.5))
                solo, co_solo = {"S": solo_s[job], "M": 1000.0}, {"S": solo_s[co], "M": 1000.0}
                rows.append(Sample(name(job), (name(co),), y, group, "gpu", {}, solo, (co_solo,)))
    return rows


def _targets(rows: list[Sample]) -> np.ndarray:
    return np.array([s.target for s in rows], dtype=float)


def test_on_new_families_the_linear_fit_transfers_and_the_memorisers_do_not() -> None:
    """The known answer: each family left out in turn, every other family trained on."""
    rows = with_families(_transfer_rows())
    assert rows is not None
    y = _targets(rows)
    err = {m: np.zeros(len(rows)) for m in MODELS}
    for train, test in holdout_folds(rows, 8, 0, "family"):
        for m in MODELS:
            err[m][test] = fit_candidate(m, "2", [rows[i] for i in train], "placement")([rows[i] for i in test]) - y[test]
    lin, tree, knn = (float(np.mean(np.abs(err[m]))) for m in MODELS)
    assert lin < 0.7 * knn and lin < 0.5 * tree


def test_job_set_cv_prefers_the_linear_fit_and_the_family_grouped_selection_the_one_that_transfers() -> None:
    rows = _transfer_rows()
    pair = candidate_scores(rows, "placement", models=MODELS, k=3, holdout="pair", average=0, upweighted=False, baselines=False)
    best_pair = best_score(pair, "placement")
    assert best_pair is not None and best_pair.model in ("DecisionTree", "KNN")  # they fit the seen families best
    fam_rows = with_families(rows)
    assert fam_rows is not None
    fam = candidate_scores(
        fam_rows, "placement", models=MODELS, k=3, holdout="family", average=0, upweighted=False, baselines=False
    )
    pick = blend(fam, _targets(fam_rows), "placement")
    assert pick is not None
    weight: dict[str, float] = {}
    for model, _, w in blend_members(pick.model):
        weight[model] = weight.get(model, 0.0) + w
    assert weight.get("LinearRegression", 0.0) >= 0.5 and weight.get("DecisionTree", 0.0) <= 0.25


def test_nested_family_holdout_blend_is_near_the_candidate_that_transfers() -> None:
    rows = with_families(_transfer_rows())
    assert rows is not None
    ev = evaluate(Dataset("transfer", rows, "lost_throughput_pct", ("placement",)), "placement", models=MODELS, holdout="family")
    cands = ev.candidate_mae
    assert cands["LinearRegression:2"] < 0.7 * min(cands["KNN:2"], cands["DecisionTree:2"])
    assert ev.best_single is not None and ev.best_single[0].startswith("LinearRegression:")
    assert ev.mae < 0.8 * min(cands["KNN:2"], cands["DecisionTree:2"]) and ev.mae <= 1.1 * ev.best_single[1]


@pytest.mark.parametrize("holdout", ["family", "pair"])
def test_json_reports_every_candidates_heldout_mae_and_the_best_single(tmp_path, capsys, holdout) -> None:  # type: ignore[no-untyped-def]
    rows = with_families(_transfer_rows(5))
    assert rows is not None
    lines = [
        "environment,job_type,co_job_types,job_family,co_job_families,interference_pct,solo_S,other_solo_S,solo_M,other_solo_M"
    ]
    lines += [
        f"h200,{s.job_type},{s.co_job_types[0]},{s.job_family},{s.co_job_families[0]},{s.target:.3f},{s.solo['S']},"
        f"{s.co_solos[0]['S']},1000,1000"
        for s in rows
    ]
    data = tmp_path / "obs.csv"
    data.write_text("\n".join(lines) + "\n")
    assert main(["evaluate", str(data), "--holdout", holdout, "--models", "LinearRegression,KNN", "--json"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    cands = last["candidate_mae"]
    singles = {f"{m}:{c}" for m in ("LinearRegression", "KNN") for c in ("1", "2", "3", "all")}
    singles |= {"baseline.median:all", "baseline.identity:all", "Upweighted[ExtraTrees:all]:all"}
    assert singles <= set(cands) and "Average:all" in cands
    assert all(v >= 0 for v in cands.values())
    best = min((v, k) for k, v in cands.items() if k in singles)
    assert (last["best_single_mae"], last["best_single"]) == best
    assert cands["baseline.median:all"] == last["median_baseline_mae"]  # the same rows, the same folds
    assert last["selected"].startswith("Blend[") and last["mae"] < last["median_baseline_mae"]

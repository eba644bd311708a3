"""``aip evaluate`` and models.evaluate: grouped CV, AIP choice, Gavel accuracy, reports, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aip.cli import main
from models.crossval import cross_validate, grouped_folds, holdout_folds
from models.datasets import Dataset, Sample, load, load_gavel

pytestmark = pytest.mark.usefixtures("few_identity_trees")


def test_gavel_features_beat_one_hot_baseline(data_dir) -> None:  # type: ignore[no-untyped-def]
    from models.evaluate import baseline_onehot

    ds = load_gavel(data_dir / "gavel" / "physical_cluster_throughputs.json", "v100")
    assert len(ds.samples) > 500 and len({s.group for s in ds.samples}) > 250
    scores = cross_validate(ds.samples, ["placement"], models=("ExtraTrees",), categories=("all",), k=5)
    base = baseline_onehot(ds.samples, 5)
    assert scores[0].mae <= 4.5
    assert base is not None and scores[0].mae < base


def test_gavel_pairs_stay_in_one_fold(data_dir) -> None:  # type: ignore[no-untyped-def]
    ds = load_gavel(data_dir / "gavel" / "physical_cluster_throughputs.json", "k80")
    groups = [s.group for s in ds.samples]
    for train, test in grouped_folds(groups, 5):
        assert not {groups[i] for i in train} & {groups[i] for i in test}
    # both jobs of a pair share a group; [0, 0] pairs are left out
    assert all(abs(s.target) < 100 for s in ds.samples)


def _csv(path, rows: int = 40) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    lines = ["environment,job_type,co_job_types,interference_pct,E_pct,T_pct,S_pct,V_pct,R_pct,W_pct,group"]
    for i in range(rows):
        y = rng.uniform(0, 100)
        pct = [0.5 * y + rng.normal(0, 2) for _ in range(6)]
        lines.append(
            f"h200,job{i % 10},job{(i + 1) % 10};job{(i + 2) % 10},{y:.2f}," + ",".join(f"{p:.2f}" for p in pct) + f",g{i % 10}"
        )
    path.write_text("\n".join(lines) + "\n")


def test_cli_json_last_line_and_report(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "obs.csv"
    _csv(data)
    rc = main(["evaluate", str(data), "--models", "LinearRegression,DecisionTree", "--json", "--report", str(tmp_path / "r")])
    assert rc == 0
    out = capsys.readouterr()
    last = json.loads(out.out.strip().splitlines()[-1])
    assert {"selected", "mae", "relative_error", "seconds", "rows"} <= set(last)
    from models.blend import blend_members

    assert last["rows"] == 40 and {m for m, _, _ in blend_members(last["selected"])} <= {"LinearRegression", "DecisionTree"}
    assert last["mae"] < 20  # the target is linear in the features
    assert "cross-validated" in out.err  # progress on stderr
    for f in ("predicted_vs_actual.png", "error_heatmap.png", "learning_curve.png", "summary.md"):
        assert (tmp_path / "r" / f).stat().st_size > 0


def test_cli_paper_rows_smoke(data_dir, capsys) -> None:  # type: ignore[no-untyped-def]
    rc = main(
        [
            "evaluate",
            str(data_dir / "aip_paper" / "colocation_rows.csv"),
            "--gpu",
            "TeslaP40",
            "--models",
            "LinearRegression,KNN",
            "--folds",
            "2",
            "--json",
        ]
    )
    assert rc == 0

    def no_constants(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1], parse_constant=no_constants)
    assert summary["rows"] == 4
    assert summary["interval_width_mean"] is None  # 4 rows: too few for a finite 90 % interval


@pytest.mark.parametrize(
    ("content", "name", "extra", "needle"),
    [
        (None, "missing.csv", [], "no such file"),
        ("a,b\n1,2\n", "bad.csv", [], "missing column interference_pct"),
        ("{}", "bad.json", [], "no GPU"),
        ("not json", "bad2.json", [], "cannot read Gavel JSON"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, content, name, extra, needle) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    assert main(["evaluate", str(path), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_mode_not_in_dataset(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "obs.csv"
    _csv(data, 10)
    assert main(["evaluate", str(data), "--mode", "placement"]) == 2
    assert "no placement-mode features" in capsys.readouterr().err
    assert load(data).modes == ("observed",)


# --------------------------------------------------------------------------- leaks, holdout schemes, intervals


def _pairs(families: int, per_family: int = 2, seed: int = 0, noise: float = 0.0) -> Dataset:
    """Pairs of job types (``f<i> (batch size <b>)``), both rows of a pair in one group.  The target is a random
    number per pair and the only feature that tells pairs apart is a pair id (``solo_throughput``): a model can
    only predict a row well if that very pair reached its training set."""
    rng = np.random.default_rng(seed)
    types = [f"f{f} (batch size {2 ** b})" for f in range(families) for b in range(per_family)]
    samples = []
    for n, (a, b) in enumerate((a, b) for i, a in enumerate(types) for b in types[i:]):
        y = float(rng.uniform(0, 100))
        group = " + ".join(sorted((a, b)))
        for job, other in ((a, b), (b, a)):
            fam, co = job.split(" ")[0], other.split(" ")[0]
            solo = {"throughput": float(n), "M": 1000.0}
            samples.append(Sample(job, (other,), y + float(rng.normal(0, noise)), group, "gpu", {}, solo, (solo,), fam, (co,)))
    return Dataset("pairs", samples, "lost_throughput_pct", ("placement",))


@pytest.mark.parametrize(("holdout", "families"), [("pair", 4), ("family", 5), ("family", 2)])
def test_no_test_row_reaches_selection_or_fitting(monkeypatch, holdout, families) -> None:  # type: ignore[no-untyped-def]
    """Everything an outer fold fits or cross-validates sees its training rows only, under either scheme, also
    when the inner selection has too few families (2 families: one left inside, no inner CV, the training median)."""
    import models.evaluate as ev_mod

    ds = _pairs(families)
    rid = {id(s): i for i, s in enumerate(ds.samples)}
    log: list[tuple[str, frozenset[int]]] = []
    real_fit, real_cv = ev_mod.fit_candidate, ev_mod.cross_validate

    def fit(name, category, train, mode, seed=0):  # type: ignore[no-untyped-def]
        log.append(("fit", frozenset(rid[id(s)] for s in train)))
        return real_fit(name, category, train, mode, seed)

    def cv(samples, *args, **kw):  # type: ignore[no-untyped-def]
        log.append(("cv", frozenset(rid[id(s)] for s in samples)))
        return real_cv(samples, *args, **kw)

    monkeypatch.setattr(ev_mod, "fit_candidate", fit)
    monkeypatch.setattr(ev_mod, "cross_validate", cv)
    marks: list[int] = []
    ev = ev_mod.evaluate(
        ds, "placement", models=("DecisionTree", "KNN"), holdout=holdout, report_table=False,
        progress=lambda m: marks.append(len(log)) if m.startswith("outer fold") else None,
    )  # fmt: skip
    folds = holdout_folds(ds.samples, 5 if holdout == "pair" else families, 0, holdout)
    assert len(folds) == len(marks) == ev.folds >= 2
    start = 0
    for (train, test), end in zip(folds, marks, strict=True):
        allowed = set(train.tolist())
        assert log[start:end], "each fold fits something"
        for kind, rows in log[start:end]:
            assert rows <= allowed and not rows & set(test.tolist()), kind
        if holdout == "family":  # and the training rows never involve a family only the test rows have
            seen = set().union(*(ds.samples[j].families for j in train))
            assert all(ds.samples[j].families - seen for j in test)
        start = end
    if families == 2:
        assert set(ev.outer_choices) == {"baseline.median:all"}
    # a leak would let the tree read each test pair's target off its id; honest, no candidate can
    assert ev.mae > 0.7 * ev.median_baseline_mae  # type: ignore[operator]


def test_family_holdout_json_keys_and_baselines_are_candidates(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    lines = ["environment,job_type,co_job_types,job_family,co_job_families,interference_pct,solo_S,other_solo_S,solo_M"]
    fams = [f"net{f}" for f in range(5)]
    for a in range(10):
        for b in range(a, 10):
            for job, other in ((a, b), (b, a)):
                y = 0.6 * (10 * other) + rng.normal(0, 1)
                lines.append(
                    f"h200,{fams[job // 2]}_bs{2 ** (job % 2)},{fams[other // 2]}_bs{2 ** (other % 2)},"
                    f"{fams[job // 2]},{fams[other // 2]},{y:.2f},{10 * job},{10 * other},100"
                )
    data = tmp_path / "obs.csv"
    data.write_text("\n".join(lines) + "\n")
    rc = main(["evaluate", str(data), "--holdout", "family", "--models", "LinearRegression,DecisionTree", "--json"])
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"mae", "relative_error", "median_baseline_mae", "baseline_mae", "interval_coverage", "interval_width_mean"} <= set(last)
    assert last["holdout"] == "family" and last["folds"] == 5  # one per job_family (not per job type: 10)
    # the co-runner's solo S decides the slowdown, also for families never trained on: well below both baselines
    # (not near 0: a linear fit reads a held-out family's all-zero family indicators as a shifted intercept)
    assert last["mae"] < 0.6 * last["median_baseline_mae"] and last["mae"] < last["baseline_mae"]


def test_csv_group_column_never_splits_a_job_set(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lines = ["environment,job_type,co_job_types,interference_pct,E_pct,group"]
    lines += [f"h200,a,b,{i},{i},g{i}" for i in range(4)]  # one job set, four group labels
    lines += [f"h200,c,d,{i},{i},g9" for i in range(4)] + ["h200,e,f,1,1,g9", "h200,x,y,1,1,"]
    data = tmp_path / "obs.csv"
    data.write_text("\n".join(lines) + "\n")
    groups = load(data).groups
    assert len(set(groups[:4])) == 1  # the job set a+b stays whole whatever its group labels say
    assert len(set(groups[4:9])) == 1 and groups[0] != groups[4] != groups[9]  # a shared label joins c+d and e+f


@pytest.mark.parametrize("holdout", ["pair", "family"])
def test_conformal_intervals_cover_90_percent_where_the_noise_is_known(holdout) -> None:  # type: ignore[no-untyped-def]
    """y = 2 x + N(0, 5): the 90 % interval is about 2 x 1.645 x 5 = 16.4 points wide and covers 90 % of new rows,
    under either scheme (``family``: 8 families, every test row's families never trained on)."""
    from models.evaluate import evaluate

    rng = np.random.default_rng(2)
    samples = []
    for i in range(400):
        x = float(rng.uniform(0, 50))
        solo = {"S": x, "M": 1.0, "throughput": 1.0}
        fam = (f"f{i % 8}", (f"f{(i + 3) % 8}",))  # families apart from the job types, which tell nothing
        samples.append(Sample("job", ("job",), 2 * x + float(rng.normal(0, 5)), f"g{i % 60}", "h", {}, solo, ({},), *fam))
    ds = Dataset("linear", samples, "interference_pct", ("placement",))
    models = ("LinearRegression", "DecisionTree", "KNN")  # three: the family interval weighs their disagreement
    ev = evaluate(ds, "placement", models=models, baseline=False, report_table=False, holdout=holdout)
    assert ev.interval_coverage is not None and 0.85 <= ev.interval_coverage <= 0.95
    assert ev.interval_width_mean is not None and 13.0 <= ev.interval_width_mean <= 20.0
    assert ev.mae < 5.0  # about 0.8 x 5 for the right model


def test_observed_mode_uses_everything_and_is_not_worse_than_placement() -> None:
    """Percent changes that say little, solo profiles that say a lot: observed mode, which knows both, holds out
    like placement mode, and far better than the paper's percent changes alone."""
    from models.evaluate import evaluate

    rng = np.random.default_rng(5)
    samples = []
    for a in range(12):
        for b in range(12):
            y = 0.6 * (8 * b) + float(rng.normal(0, 1))
            pcts = {p: 0.1 * y + float(rng.normal(0, 10)) for p in ("E", "T", "S", "V", "R", "W")}
            solo, co = {"S": 8.0 * a, "M": 100.0}, {"S": 8.0 * b, "M": 100.0}
            job, other = f"x{a}_{b}", f"y{a}_{b}"  # every row its own job types: identities tell nothing
            samples.append(Sample(job, (other,), y, f"{job} + {other}", "h", pcts, solo, (co,)))
    both = Dataset("both", samples, "interference_pct", ("observed", "placement"))
    pct_only = Dataset("pct", samples, "interference_pct", ("observed",))
    kw = {"models": ("LinearRegression", "DecisionTree"), "baseline": False, "report_table": False}
    observed, placement = evaluate(both, "observed", **kw), evaluate(both, "placement", **kw)
    paper = evaluate(pct_only, "observed", **kw)
    # choosing among more candidates (the union with noisy percent changes among them) costs a little, not more
    assert observed.mae <= 1.15 * placement.mae
    assert observed.mae < 0.5 * paper.mae
    assert all("placement" in c for c in observed.outer_choices)  # a view with the solo profiles, every fold


# --------------------------------------------------------------------------- probes


@pytest.mark.parametrize(("probes", "probe_seed"), [(1, None), (3, None), (1, 7), (3, 7)])
def test_revealed_probes_never_leak_a_test_row_and_never_split_a_group(monkeypatch, probes, probe_seed) -> None:  # type: ignore[no-untyped-def]
    """K job sets of each held-out family move to training whole (both rows of a pair); every fit and CV of the
    outer fold sees its training rows only; the scored rows are the rest; the probes of K are among those of K + 1.
    The same with the probes drawn by another seed than the folds' (``probe_seed``)."""
    import models.evaluate as ev_mod

    ds = _pairs(5)
    groups = [s.group for s in ds.samples]
    plain = holdout_folds(ds.samples, 5, 0, "family")
    folds = holdout_folds(ds.samples, 5, 0, "family", probes, probe_seed)
    more = holdout_folds(ds.samples, 5, 0, "family", probes + 1, probe_seed)
    assert 2 <= len(more) <= len(folds) <= len(plain)  # a fold left without test rows is dropped

    def base(te: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return next(f for f in plain if set(te.tolist()) <= set(f[1].tolist()))

    for tr, te in folds:
        tr0, te0 = base(te)
        tr1 = next((a for a, b in more if set(b.tolist()) <= set(te0.tolist())), tr)
        revealed = sorted(set(tr.tolist()) - set(tr0.tolist()))
        assert set(revealed) <= set(te0.tolist()) and not set(tr.tolist()) & set(te.tolist())
        assert set(te.tolist()) | set(revealed) == set(te0.tolist())  # the rest is scored
        rg = {groups[i] for i in revealed}
        assert not rg & {groups[i] for i in te}  # a revealed group moved whole
        seen = set().union(*(ds.samples[j].families for j in tr0))
        held = set().union(*(ds.samples[j].families for j in te0)) - seen
        for fam in held:  # K job sets of each held-out family (or all of them but the fold keeps test rows)
            own = {groups[i] for i in te0 if fam in ds.samples[i].families}
            assert len(rg & own) >= min(probes, len(own))
        assert set(tr.tolist()) <= set(tr1.tolist())  # nested: K's probes among K + 1's
    # everything an outer fold fits or cross-validates sees its training rows (probes included) only
    rid = {id(s): i for i, s in enumerate(ds.samples)}
    log: list[frozenset[int]] = []
    real_fit, real_cv = ev_mod.fit_candidate, ev_mod.cross_validate
    monkeypatch.setattr(ev_mod, "fit_candidate", lambda n, c, train, m, seed=0: log.append(frozenset(rid[id(s)] for s in train)) or real_fit(n, c, train, m, seed))
    monkeypatch.setattr(ev_mod, "cross_validate", lambda samples, *a, **kw: log.append(frozenset(rid[id(s)] for s in samples)) or real_cv(samples, *a, **kw))
    marks: list[int] = []
    ev = ev_mod.evaluate(
        ds, "placement", models=("DecisionTree",), holdout="family", probes=probes, probe_seed=probe_seed, report_table=False,
        progress=lambda m: marks.append(len(log)) if m.startswith("outer fold") else None,
    )  # fmt: skip
    start = 0
    for (tr, te), end in zip(folds, marks, strict=True):
        for rows in log[start:end]:
            assert rows <= set(tr.tolist()) and not rows & set(te.tolist())
        start = end
    assert ev.scored_rows == sum(len(te) for _, te in folds) == len(ev.actual) < len(ds.samples)
    assert ev.mae > 0.7 * ev.median_baseline_mae  # type: ignore[operator]  # a leak would read the pair id


def test_probe_seed_draws_other_probes_from_the_same_folds(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``probe_seed`` redraws which job sets are revealed and nothing else: the folds' families and the rows each
    fold holds out stay the seed's; by default (None) the draw is the seed's, so today's figures are unchanged; the
    evaluation reports the seed it drew with."""
    from models.evaluate import evaluate

    ds = _pairs(6)
    plain = holdout_folds(ds.samples, 6, 0, "family")
    default = holdout_folds(ds.samples, 6, 0, "family", 2)
    assert [(a.tolist(), b.tolist()) for a, b in default] == [
        (a.tolist(), b.tolist()) for a, b in holdout_folds(ds.samples, 6, 0, "family", 2, probe_seed=0)
    ]
    drawn = {}
    for seed in (0, 1, 2, 3):
        folds = holdout_folds(ds.samples, 6, 0, "family", 2, probe_seed=seed)
        held = []
        for tr, te in folds:  # each fold: the same held-out rows, split differently into probes and scored rows
            tr0, te0 = next(f for f in plain if set(te.tolist()) <= set(f[1].tolist()))
            assert set(tr0.tolist()) <= set(tr.tolist()) and set(tr.tolist()) | set(te.tolist()) == set(tr0.tolist()) | set(te0.tolist())
            held.append(frozenset(set(tr.tolist()) - set(tr0.tolist())))
        drawn[seed] = tuple(held)
    assert len(set(drawn.values())) > 1  # another seed, other probes
    kw = {"models": ("LinearRegression",), "holdout": "family", "probes": 2, "report_table": False, "baseline": False}
    a, b = evaluate(ds, "placement", **kw), evaluate(ds, "placement", probe_seed=0, **kw)  # type: ignore[arg-type]
    assert a.mae == b.mae and a.summary()["probe_seed"] is None and b.summary()["probe_seed"] == 0
    other = evaluate(ds, "placement", probe_seed=3, **kw)  # type: ignore[arg-type]
    assert other.mae != a.mae
    csv = tmp_path / "obs.csv"
    lines = ["environment,job_type,co_job_types,job_family,co_job_families,interference_pct,solo_S,other_solo_S"]
    lines += [f"h200,{s.job_type},{s.co_job_types[0]},{s.job_family},{s.co_job_families[0]},{s.target:.3f},1,1" for s in ds.samples]
    csv.write_text("\n".join(lines) + "\n")
    argv = ["evaluate", str(csv), "--holdout", "family", "--models", "LinearRegression", "--json", "--probes", "2"]
    assert main([*argv, "--probe-seed", "3"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["by_probes"]["2"]["probe_seed"] == 3
    assert main([*argv[:-2], "--probe-seed", "3"]) == 2  # a draw of nothing: --probe-seed needs --probes
    assert "--probes" in capsys.readouterr().err


def test_cli_probes_json_and_report(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    ds_lines = ["environment,job_type,co_job_types,job_family,co_job_families,interference_pct,solo_S,other_solo_S,solo_M"]
    rng = np.random.default_rng(4)
    fams = [f"net{f}" for f in range(4)]
    for a in range(8):
        for b in range(a, 8):
            for job, other in ((a, b), (b, a)):
                y = 0.6 * (10 * other) + (30.0 if job // 2 == 0 else 0.0) + rng.normal(0, 1)  # net0 a sensitive victim
                ds_lines.append(
                    f"h200,{fams[job // 2]}_bs{2 ** (job % 2)},{fams[other // 2]}_bs{2 ** (other % 2)},"
                    f"{fams[job // 2]},{fams[other // 2]},{y:.2f},{10 * job},{10 * other},100"
                )
    data = tmp_path / "obs.csv"
    data.write_text("\n".join(ds_lines) + "\n")
    argv = ["evaluate", str(data), "--holdout", "family", "--models", "ExtraTrees,LinearRegression", "--json"]
    assert main([*argv, "--probes", "0,2", "--report", str(tmp_path / "r")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["by_probes"]) == {"0", "2"}
    for k in ("0", "2"):
        assert {"mae", "median_baseline_mae", "interval_coverage", "scored_rows"} <= set(out["by_probes"][k])
    assert out["by_probes"]["0"]["mae"] == out["mae"]  # the top-level figures are the first K's
    assert out["by_probes"]["2"]["scored_rows"] < out["by_probes"]["0"]["scored_rows"] == out["rows"]
    assert (tmp_path / "r" / "probes.png").stat().st_size > 0 and "Probes" in (tmp_path / "r" / "summary.md").read_text()
    assert main([*argv[:-1], "--probes", "0"]) == 0  # K = 0 alone: today's family holdout
    capsys.readouterr()
    assert main(["evaluate", str(data), "--probes", "2"]) == 2  # probes need --holdout family
    assert "--holdout family" in capsys.readouterr().err


def test_probes_make_every_candidate_a_newcomer() -> None:
    """With job sets revealed (``weighted``), every batch candidate and the average are the Newcomer forms (thin
    families weighted up in each fold's own training rows); the baselines stay as they are.  A weight is whole
    copies: a uniform one leaves least squares' predictions as they were and counts the copies trained."""
    from models.evaluate import IDENTITY, MEDIAN, candidate_scores, fit_candidate, thin_family_weights

    ds = _pairs(5, noise=1.0)
    scores = candidate_scores(ds.samples, "placement", models=("DecisionTree", "LinearRegression"), k=2, holdout="family", probes=1, weighted=True)
    names = {s.model for s in scores}
    assert {MEDIAN, IDENTITY} < names
    assert all(n.startswith(("Upweighted[", "Average[Upweighted[")) for n in names - {MEDIAN, IDENTITY})
    assert "Upweighted[DecisionTree:all]" in names and any(n.startswith("Average[") for n in names)
    avg = next(n for n in names if n.startswith("Average["))
    assert np.isfinite(fit_candidate(avg, "all", ds.samples, "placement")(ds.samples[:3])).all()
    one = {"models": ("LinearRegression",), "categories": ("all",), "k": 3}
    plain = cross_validate(ds.samples, ["placement"], **one)  # type: ignore[arg-type]
    copies = cross_validate(ds.samples, ["placement"], **one, weights=lambda tr: [3] * len(tr))  # type: ignore[arg-type]
    assert np.allclose(plain[0].oof, copies[0].oof) and copies[0].trained == 3 * plain[0].trained
    # the weights a fold's training rows get are those of its own rows: a family thin there is weighted
    folds = holdout_folds(ds.samples, 5, 0, "family", 1)
    tr, _ = folds[0]
    w = thin_family_weights([ds.samples[i] for i in tr])
    assert max(w) == 8 and min(w) == 1

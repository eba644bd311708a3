"""A refit, as a pure function of the recent history: grouped CV of every batch model x category x mode (and of
the median baseline), then the best fitted on every row (:func:`run_refit`).

Which batch models a refit fits (the batch candidates until the next refit) is decided by their error on job
families they were not trained on: where the rows hold two job families or more (the job type without its batch
size, :func:`models.crossval.with_families`), a second cross-validation of placement mode holds out whole families
(:func:`models.crossval.family_folds`, at most :data:`FAMILY_CV_ROWS` training rows), and the ``final_fits`` with
the smallest family-grouped MAE per category are fitted.  A model that memorises the families it has seen wins
the job-set CV and loses this one.  The CV scores and conformal offsets the candidates are then judged and served
by stay the job-set CV's, comparable with the online learners' prequential errors on new job sets.
docs/MODELS.md, "Selection on families never seen".

This module never imports kafka or faust.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from events import MODES
from models.candidates import CvScore
from models.crossval import COST_ORDER, cross_validate, grouped_folds, with_families
from models.datasets import Sample
from models.intervals import conformal_offsets
from models.live import MEDIAN, median_cv_mae
from models.modelconfig import ModelConfig
from models.parallel import Fits
from models.views import CandidateKey


class Refitted(NamedTuple):
    """What a refit says of one candidate."""

    cv: CvScore | None
    """Its grouped-CV score (every batch model, and the median baseline)."""
    offsets: tuple[float, float] | None
    """Conformal 90 % offsets (lo, hi) from its out-of-fold residuals (None: not finite)."""
    model: Any = None
    """Fitted on every row: per mode x category the ``final_fits`` best batch models by CV; else None."""


@dataclass(frozen=True)
class RefitResult:
    """What a refit computed off the event loop; applied by :meth:`EnvironmentModels.apply_refit`."""

    candidates: dict[CandidateKey, Refitted]
    seconds: float
    rows: int
    """Rows of the refit: the final fits use all of them."""
    cv_rows: dict[str, int] = field(default_factory=dict)
    """Per mode, the rows cross-validation trained on (``refit_cv_rows`` when capped, else ``rows``)."""
    pool_fallbacks: int = 0
    """Batches of fits that ran in-process because a pool worker died or the pool timed out."""
    finished_at: float = field(default_factory=time.time)
    family_scores: dict[CandidateKey, CvScore] = field(default_factory=dict)
    """The family-grouped CV scores that ranked the batch models of :data:`FAMILY_MODES` for the final fits (empty:
    fewer than two job families in the rows, and the job-set CV ranked them)."""

    @property
    def scores(self) -> dict[CandidateKey, CvScore]:
        return {k: r.cv for k, r in self.candidates.items() if r.cv is not None}

    @property
    def fitted(self) -> dict[CandidateKey, Any]:
        return {k: r.model for k, r in self.candidates.items() if r.model is not None}


def best_by_cv(scores: Mapping[CandidateKey, CvScore], keep: int | None, models: Iterable[str]) -> list[CandidateKey]:
    """Per mode x category, the ``keep`` batch models (all when None) with the smallest finite CV MAE.

    >>> s = {CandidateKey("m", "1", n): CvScore(e, None, 1) for n, e in (("a", 3.0), ("b", 1.0), ("c", None))}
    >>> best_by_cv(s, 1, ["a", "b", "c"])
    [CandidateKey(mode='m', category='1', model='b')]
    """
    allowed = set(models)
    groups: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for (mode, cat, name), score in scores.items():
        if name in allowed and score.mae is not None:
            groups.setdefault((mode, cat), []).append((score.mae, name))
    out: list[CandidateKey] = []
    for (mode, cat), ranked in sorted(groups.items()):
        out.extend(CandidateKey(mode, cat, name) for _, name in sorted(ranked)[:keep])
    return out


FAMILY_CV_ROWS = 500
"""Training rows of the family-grouped cross-validation (a group-stratified subsample where there are more distinct
feature rows): it only ranks the batch models."""
FAMILY_MODES = ("placement",)
"""The modes whose batch models are ranked by the family-grouped CV: placement mode predicts from solo profiles,
which is what a family never co-located has."""


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _offsets(residuals: np.ndarray) -> tuple[float, float] | None:
    lo, hi = conformal_offsets(residuals)
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None


def run_refit(samples: Sequence[Sample], config: ModelConfig, seed: int) -> RefitResult:
    """Grouped CV of every batch model x category x mode (and of the median), then fit the best on all rows.

    The fits run on ``config.workers`` processes (:mod:`models.parallel`); the call stays a plain function."""
    from models.crossval import feature_frames, final_fit

    t0 = time.perf_counter()
    modes = [m for m in MODES if any(s.features(m, "all") for s in samples[:50])]
    frames = {mode: feature_frames(samples, mode) for mode in modes}
    y = np.array([s.target for s in samples], dtype=float)
    workers = config.workers if len(samples) >= config.pool_min_rows else 1
    by_family: dict[CandidateKey, CvScore] = {}
    families = with_families(samples)
    fam_modes = [m for m in modes if m in FAMILY_MODES]
    fallbacks = 0
    if families is not None and fam_modes:  # its own pool store: its folds are not the job-set CV's
        cap = FAMILY_CV_ROWS if config.refit_cv_rows is None else min(FAMILY_CV_ROWS, config.refit_cv_rows)
        with Fits(workers, config.pool_timeout_s) as fam_fits:
            fam = cross_validate(
                families, fam_modes, models=config.batch_models, k=config.folds, seed=seed, fits=fam_fits, max_rows=cap,
                frames=frames, holdout="family",
            )  # fmt: skip
            fallbacks += fam_fits.fallbacks
        by_family = {
            CandidateKey(s.mode, s.category, s.model): CvScore(s.mae, s.relative_error, s.samples)
            for s in fam
            if math.isfinite(s.mae)
        }
    with Fits(workers, config.pool_timeout_s) as fits:
        cv = cross_validate(
            samples, modes, models=config.batch_models, k=config.folds, seed=seed, fits=fits,
            max_rows=config.refit_cv_rows, frames=frames,
        )  # fmt: skip
        out = {
            CandidateKey(s.mode, s.category, s.model): Refitted(
                CvScore(_finite(s.mae), s.relative_error, s.samples), _offsets(y - s.oof) if len(s.oof) == len(y) else None
            )
            for s in cv
        }  # fmt: skip
        ranked = {
            k: by_family.get(k, r.cv)
            for k, r in out.items()
            if r.cv is not None and (not by_family or k.mode not in fam_modes or k in by_family)
        }
        keys = best_by_cv(ranked, config.final_fits, config.batch_models)
        calls = [(mode, cat, sorted(str(c) for c in frames[mode][cat].columns), name, seed) for mode, cat, name in keys]
        calls.sort(key=lambda c: COST_ORDER.index(c[3]) if c[3] in COST_ORDER else len(COST_ORDER))
        for c, model in zip(calls, fits.run(final_fit, calls), strict=True):
            key = CandidateKey(c[0], c[1], c[3])
            out[key] = out[key]._replace(model=model)
    folds = grouped_folds([s.group for s in samples], config.folds, seed)
    if folds:
        med = CvScore(_finite(median_cv_mae([s.target for s in samples], folds)), None, len(samples))
        med_oof = np.zeros(len(y))
        for train, test in folds:
            med_oof[test] = np.median(y[train])
        for mode in modes:
            out[CandidateKey(mode, "all", MEDIAN)] = Refitted(med, _offsets(y - med_oof))
    cv_rows = {mode: max((s.trained for s in cv if s.mode == mode), default=0) for mode in modes}
    return RefitResult(out, time.perf_counter() - t0, len(samples), cv_rows, fallbacks + fits.fallbacks, family_scores=by_family)

"""The tuning of one environment's models (:class:`ModelConfig`): selection, scoring, refits, baselines.

Not the deployment's settings: those are :class:`config.Settings` (brokers, topics, intervals, each with its
environment variable).  A ModelConfig travels inside the models' state (:mod:`models.state`), so a restored or
served model keeps the tuning it learned with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from models.zoo import ONLINE, REFIT_BATCH


@dataclass
class ModelConfig:
    window: int = 200
    """Rolling window of the prequential MAE (observations)."""
    min_samples: int = 10
    """A candidate competes in a regime once it has this many scored predictions there."""
    heavy_stride: int = 12
    """Each heavy online learner (KNN, Hoeffding tree, AMF) x mode x category learns every ``heavy_stride``-th
    observation, staggered so that about two heavy updates happen per observation."""
    online_sample: int = 4
    """The online learners (river) are tested and trained on a deterministic sample of the observations, one in
    ``online_sample`` by the hash of the observation's id (:func:`models.environment.draw`), the heavy ones on
    their stride within it; the baselines and the newcomer candidates see every one (the newcomer fewer where the
    sample thins, ``newcomer_full_below``; the batch candidates are tested on the same sample, ``batch_sampled``).
    1: every observation."""
    online_max_per_s: float = 10.0
    """At most about this many observations a second of event time (per environment) are the online learners'
    sample: where the previous window had more than ``online_sample * online_max_per_s`` a second, the sample
    thins to one in ``online_sample * k`` (:func:`thinning`), and the served model's drift and residuals are
    tested on one in ``k``.  A fleet of thousands of GPUs learns as much online as one of a few hundred, at the
    same cost; a small one is not thinned.  0: no bound."""
    batch_sampled: bool = True
    """The batch candidates are tested on the online learners' sample (one observation in ``online_sample``, the
    same rows: the selection compares them on the same observations); False: on every observation."""
    score_batch_every: int = 256
    """Observations per vectorised pass of the batch candidates' test (of those in the sample, with
    ``batch_sampled``; and at every refit and save), and per pass of the deferred candidates (the newcomer)."""
    max_pct: float = 1000.0
    """Predictions are bounded to ``[-100, max_pct]``; bounded ones are counted."""
    newcomer: bool = True
    """The ``Newcomer`` candidate (:class:`models.candidates.NewcomerCandidate`): a batch model plus per-type
    residual biases and factors learned online."""
    newcomer_full_below: int = 16
    """The newcomer learns (and is tested on) every observation of a slot (a job type next to its co-runners'
    types) measured fewer than this many times; the others, where the fleet thins the online learners' sample
    (``online_max_per_s``), on the same one in ``k`` as the served model's drift and residuals.  A new job type's
    first measurements are what the newcomer is for; a slot measured many times a second adds little, and at
    10,000 GPUs its every observation was 8.5 % of the learning worker's samples (docs/BENCHMARKS.md)."""
    newcomer_rank: int = 2
    """Rank of its victim x aggressor factors (0: biases only)."""
    newcomer_prior: float = 2.0
    """Its shrinkage: a type measured ``n`` times keeps ``n / (n + prior)`` of its mean residual."""
    compose_margin: float = 0.25
    """A job set of 3+ never measured is composed from its pairs (:mod:`models.compose`) until, on its first
    observations, the composition's error exceeds the served model's by this share."""
    new_members: int = 3
    """Placement mode serves a job set never measured (regime ``new``: what-if entries, their pairs, running jobs)
    by the mean of the ``new_members`` candidates with the smallest error in the ``new`` regime
    (:meth:`models.selector.Selector.members`; 1: the best alone): no one of them is best on every job set no one
    measured, and their errors there partly cancel (docs/MODELS.md, "Selection")."""
    predict_novel: bool = True
    """A job type never measured here but with a solo profile is predicted from the profile (placement mode,
    ``regime`` ``novel``, its interval widened to the spread of every measured slowdown); False: withheld."""
    refit_every: int = 500
    """Observations between periodic refits."""
    refit_min_rows: int = 30
    refit_rows: int = 10_000
    """A refit uses the most recent ``refit_rows`` labelled observations: the final fits use all of them
    (batch models fit the distinct feature rows, weighted by their copies)."""
    refit_cv_rows: int | None = 2_000
    """Cross-validation trains on a group-stratified subsample of this many rows in a mode whose refit rows hold
    more distinct feature rows than that (observed mode); every row is still scored out of fold.  None: no cap."""
    final_fits: int | None = 3
    """Per mode x category, the refit fits on all rows the ``final_fits`` batch models with the smallest CV
    error: they are the batch candidates until the next refit (up to 12 per mode).  None: every batch model.
    CV error only decides which models are fitted, not which is served.  Measured on 10,000 observations:
    3 instead of 1 made the refit 4.2 -> 5.9 s (median of 3 alternating runs, 2 workers)."""
    history: int = 10_000
    folds: int = 3
    workers: int | None = None
    """Processes a refit spreads its fits over (:mod:`models.parallel`, one pool per process); None: all cores."""
    pool_min_rows: int = 2_000
    """Refits of fewer observations run in-process (the pool would cost more than it saves)."""
    pool_timeout_s: float = 300.0
    """A pool fit not done by then (joblib's per-task timeout) abandons the pool (workers killed); the batch runs in-process."""
    jobset_min: int = 20
    """Measurements of one slot (job and co-runners) before it gets its own selection."""
    jobset_window: int = 50
    """Span of the per-slot exponentially weighted errors."""
    max_jobsets: int = 2000
    """Slots that keep their own errors (the first ones measured)."""
    baseline_span: int = 3
    """Span of the last-measured baseline's exponentially weighted mean."""
    median_window: int = 1000
    """Measurements in the median baseline's rolling window."""
    batch_models: tuple[str, ...] = REFIT_BATCH
    online_models: tuple[str, ...] = tuple(ONLINE)


def thinning(previous_count: int, window_s: float, config: ModelConfig) -> int:
    """How much thinner than ``online_sample`` the online learners' sample is for a window of ``window_s`` seconds
    whose previous window brought ``previous_count`` observations (:attr:`ModelConfig.online_max_per_s`; 1: not
    thinned).

    >>> c = ModelConfig()  # online_sample 4, online_max_per_s 10: up to 40 observations a second as they are
    >>> thinning(300, 10.0, c), thinning(400, 10.0, c), thinning(401, 10.0, c), thinning(10_000, 10.0, c)
    (1, 1, 2, 25)
    >>> thinning(10_000, 10.0, ModelConfig(online_max_per_s=0.0))
    1
    """
    if config.online_max_per_s <= 0 or window_s <= 0:
        return 1
    per_s = previous_count / window_s
    return max(1, math.ceil(per_s / (max(1, config.online_sample) * config.online_max_per_s)))

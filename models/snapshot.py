"""What serving needs of an environment's models, as one versioned, self-contained value (issue 23).

Learning (every observation of an environment, in one worker) writes a :class:`ServingSnapshot` with
:func:`snapshot_of`; serving (any worker, sharded by GPU) reads it back with :func:`serving_models` into an
:class:`models.environment.EnvironmentModels` that predicts exactly what the learner's would, for every
observation and what-if, at the time of the snapshot.  It holds only the candidates serving can reach
(:func:`served_keys`: the selection of each regime and mode, each slot's own choice, the baselines and the
feature model a served ``Newcomer`` builds on), with their records (errors, residuals, CV: what the selection
and the intervals read), the measurements (slots, job types, the range of slowdowns), the composition scores
of job sets of 3+, and the solo profiles of the job types known (what what-if entries ask about).  No history:
serving refits nothing.

Estimators travel in their own safe formats (:mod:`models.persist`): skops with the trusted type list for
scikit-learn, ``weights_only`` torch weights, msgspec for the baselines and the newcomer's biases; river
learners are pickles signed with HMAC-SHA256, here with a key every worker of the deployment shares (the
``snapshot_key`` setting): a snapshot signed with another key is refused before anything is unpickled.

Encoded by :func:`encode` (msgpack, zlib) to bytes the stream chunks onto a topic.  No Kafka, no faust.
"""

from __future__ import annotations

import math
import tempfile
import zlib
from collections.abc import Mapping
from pathlib import Path

import msgspec

from events import MODES, REGIMES
from models.candidates import KINDS, Candidate, EstimatorState
from models.environment import EnvironmentModels
from models.live import Measurements
from models.rolling import ResidualWindow
from models.state import FORMAT as STATE_FORMAT
from models.state import CandidateState, EnvironmentState
from models.views import CandidateKey

FORMAT = 1

Profile = dict[str, float | None]


class ComposeState(msgspec.Struct):
    n: int
    composed_abs: float
    served_abs: float


class ServingSnapshot(msgspec.Struct):
    """Everything :func:`serving_models` needs; ``version`` is set by the publisher (newer is larger)."""

    format: int
    version: int
    models: EnvironmentState
    """The environment's saved state, with only the served candidates and no history."""
    files: dict[str, bytes]
    """The estimators' files (relative path -> bytes), as their candidates' ``dump`` wrote them."""
    known: dict[str, Profile]
    """Job type -> its solo profile, every job type the learner knows in this environment."""
    compose: dict[str, ComposeState]
    """:attr:`EnvironmentModels.compose_scores` by ``seen`` (``"true"``/``"false"``)."""
    residuals: dict[str, list[float]]
    """Every :class:`models.intervals.ResidualWindow` attribute of the models by name (``many_residuals``...): the
    intervals they widen are served too."""

    @property
    def environment(self) -> str:
        return self.models.environment


def served_keys(models: EnvironmentModels) -> set[CandidateKey]:
    """The candidates a prediction or what-if of ``models`` can be served by, now."""
    sel = models.selector
    keys = {k for k, c in sel.candidates.items() if c.kind == "baseline"}  # the fallbacks, the novel interval's median
    for mode in MODES:
        for regime in REGIMES:
            choice = sel.selected[regime].get(mode)
            if choice is not None:
                keys.add(sel.candidate(mode, choice).key)
        for slot in sel.scored_in:
            picked = sel.choice(mode, slot)
            if picked is not None:
                keys.add(sel.candidate(mode, picked[1]).key)
    for k in list(keys):
        base = getattr(sel.candidates[k].estimator, "base_key", None)
        if base is not None:
            keys.add(base)
    return {k for k in keys if k in sel.candidates}


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


Dumped = tuple[EstimatorState | None, dict[str, bytes]]
DumpCache = dict[tuple[CandidateKey, int, int], Dumped]
"""A batch candidate's dump by (key, refits, index): its estimator changes only at a refit (skops is the slow part)."""


def dump_candidate(c: Candidate, index: int, key: bytes) -> Dumped:
    """A candidate's estimator state and files, as a snapshot holds them (a batch model's may be made in a thread:
    it does not change until the next refit replaces it)."""
    with tempfile.TemporaryDirectory(prefix="aip-snapshot-") as tmp:
        state = c.dump(Path(tmp), index, key)
        return state, _files(Path(tmp))


def dump_key(models: EnvironmentModels, c: Candidate, index: int) -> tuple[CandidateKey, int, int]:
    return c.key, models.refits, index


def batch_to_dump(models: EnvironmentModels) -> list[tuple[Candidate, int]]:
    """The served batch candidates (with their index): what :func:`snapshot_of` would dump, or take from its cache."""
    served = served_keys(models)
    return [(c, i) for i, c in enumerate(models.selector.candidates.values()) if c.batched and c.key in served]


def snapshot_of(
    models: EnvironmentModels,
    known: Mapping[str, Mapping[str, float | None]],
    key: bytes,
    version: int = 0,
    cache: DumpCache | None = None,
) -> ServingSnapshot:
    """The serving snapshot of ``models`` (river learners signed with ``key``); ``cache`` keeps batch candidates'
    dumps from one snapshot to the next (pass the same dict each time)."""
    models.score_pending()  # what the batch candidates were judged on so far
    sel = models.selector
    served = served_keys(models)
    candidates, files = [], {}
    fresh: DumpCache = {}
    for i, c in enumerate(sel.candidates.values()):
        if c.key not in served:
            continue
        if c.batched and cache is not None:
            ck = dump_key(models, c, i)
            dumped = fresh[ck] = cache.get(ck) or dump_candidate(c, i, key)
        else:
            dumped = dump_candidate(c, i, key)
        candidates.append(CandidateState((c.key.mode, c.key.category, c.key.model), c.kind, c.record.state(), dumped[0]))
        files.update(dumped[1])
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    state = EnvironmentState(
        STATE_FORMAT, models.environment, models.seed, models.config, models.observations, models.last_refit,
        models.refit_seconds, models.refits, 0, models.clipped, models.measurements.state(),
        sorted(sel.own_slots), candidates, [],
    )  # fmt: skip
    compose = {
        str(seen).lower(): ComposeState(s.n, float(s.composed_abs), float(s.served_abs))
        for seen, s in models.compose_scores.items()
    }
    residuals = {name: list(w.values) for name, w in vars(models).items() if isinstance(w, ResidualWindow)}
    return ServingSnapshot(FORMAT, version, state, files, {jt: dict(p) for jt, p in known.items()}, compose, residuals)


def serving_models(snapshot: ServingSnapshot, key: bytes) -> EnvironmentModels:
    """An :class:`EnvironmentModels` that serves as the learner did when it wrote ``snapshot``; raises
    :class:`models.persist.SignatureError` for river files not signed with ``key``."""
    if snapshot.format != FORMAT or snapshot.models.format != STATE_FORMAT:
        raise ValueError(f"snapshot format {snapshot.format}/{snapshot.models.format}, not {FORMAT}/{STATE_FORMAT}")
    state = snapshot.models
    m = EnvironmentModels(state.environment, seed=state.seed, config=state.config)
    m.observations, m.last_refit, m.refit_seconds = state.observations, state.last_refit, state.refit_seconds
    m.refits, m.clipped = state.refits, state.clipped
    sel = m.selector
    sel.measurements = Measurements.restore(state.measurements)
    sel.own_slots = set(state.own_slots)
    sel.candidates = {}
    with tempfile.TemporaryDirectory(prefix="aip-snapshot-") as tmp:
        directory = Path(tmp)
        for name, data in snapshot.files.items():
            path = (directory / name).resolve()
            if directory.resolve() not in path.parents:
                raise ValueError(f"snapshot file {name!r} is outside its directory")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        for cs in state.candidates:
            kind = KINDS[cs.kind]
            ck = CandidateKey(*cs.key)
            sel.candidates[ck] = kind(ck, kind.restore(cs.estimator, directory, key, m.config), m.config, cs.record)
    for c in sel.candidates.values():
        c.link(sel.candidates, refit=False)
    sel.changed()
    sel.stale.update(REGIMES)
    sel.select()
    for seen, cs in snapshot.compose.items():
        score = m.compose_scores[seen == "true"]
        score.n, score.composed_abs, score.served_abs = cs.n, cs.composed_abs, cs.served_abs
    for name, values in snapshot.residuals.items():
        if isinstance(getattr(m, name, None), ResidualWindow):
            setattr(m, name, ResidualWindow(m.config.history, [v for v in values if math.isfinite(v)]))
    return m


def encode(snapshot: ServingSnapshot) -> bytes:
    return zlib.compress(msgspec.msgpack.encode(snapshot), 1)


def decode(data: bytes) -> ServingSnapshot:
    """What :func:`encode` wrote (``msgspec.ValidationError`` on anything else)."""
    return msgspec.msgpack.decode(zlib.decompress(data), type=ServingSnapshot)

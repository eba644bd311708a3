"""What serving needs of an environment's models, as one versioned, self-contained value.

Learning (every observation of an environment, in one worker) writes a :class:`ServingSnapshot` with
:func:`snapshot_of`; serving (any worker, sharded by GPU) reads it back with :func:`serving_models` into an
:class:`models.environment.EnvironmentModels` that predicts exactly what the learner's would, for every
observation and what-if, at the time of the snapshot.  Its models are the learner's
:meth:`~models.environment.EnvironmentModels.to_state` with ``serving=True`` (the state local persistence writes,
less the candidates serving cannot reach and the history: serving refits nothing), and the solo profiles of the
job types known (what what-if entries ask about).

Estimators travel as bytes in their own safe formats (:mod:`models.persist`): skops with the trusted type list for
scikit-learn, ``weights_only`` torch weights, msgspec for the baselines and the newcomer's biases; river
learners are pickles signed with HMAC-SHA256, here with a key every worker of the deployment shares (the
``snapshot_key`` setting): a snapshot signed with another key is refused before anything is unpickled.

Encoded by :func:`encode` (msgpack, zlib) to bytes the stream chunks onto a topic.  No Kafka, no faust.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import msgspec

from models.candidates import Candidate, EstimatorState
from models.environment import EnvironmentModels
from models.state import FORMAT as STATE_FORMAT
from models.state import EnvironmentState
from models.views import CandidateKey

FORMAT = 2

Profile = dict[str, float | None]


class ServingSnapshot(msgspec.Struct):
    """Everything :func:`serving_models` needs; ``version`` is set by the publisher (newer is larger)."""

    format: int
    version: int
    models: EnvironmentState
    """The environment's state for serving (``to_state(key, serving=True)``)."""
    known: dict[str, Profile]
    """Job type -> its solo profile, every job type the learner knows in this environment."""

    @property
    def environment(self) -> str:
        return self.models.environment


DumpCache = dict[tuple[CandidateKey, int, int], EstimatorState | None]
"""A served batch candidate's estimator state by :func:`dump_key`: what was dumped since its last refit (the
batch models remember their own state per fit, so a dump made ahead, in a thread, is not made again)."""


def dump_candidate(c: Candidate, index: int, key: bytes) -> EstimatorState | None:
    """A candidate's estimator state as a snapshot holds it (a batch model's may be made in a thread: it does not
    change until the next refit replaces it, and the model remembers it)."""
    return c.estimator_state(key)


def dump_key(models: EnvironmentModels, c: Candidate, index: int) -> tuple[CandidateKey, int, int]:
    return c.key, models.refits, index


def batch_to_dump(models: EnvironmentModels) -> list[tuple[Candidate, int]]:
    """The served batch candidates (with their index): what :func:`snapshot_of` dumps."""
    served = models.selector.served_keys()
    return [(c, i) for i, c in enumerate(models.selector.candidates.values()) if c.batched and c.key in served]


def snapshot_of(
    models: EnvironmentModels,
    known: Mapping[str, Mapping[str, float | None]],
    key: bytes,
    version: int = 0,
    cache: DumpCache | None = None,
) -> ServingSnapshot:
    """The serving snapshot of ``models`` (river learners signed with ``key``); ``cache``: filled with the served
    batch candidates' states, by :func:`dump_key` (what a caller dumping ahead asks about)."""
    state = models.to_state(key, serving=True)
    if cache is not None:
        cache.clear()
        cache.update({dump_key(models, c, i): c.estimator_state(key) for c, i in batch_to_dump(models)})
    return ServingSnapshot(FORMAT, version, state, {jt: dict(p) for jt, p in known.items()})


def serving_models(snapshot: ServingSnapshot, key: bytes) -> EnvironmentModels:
    """An :class:`EnvironmentModels` that serves as the learner did when it wrote ``snapshot``; raises
    :class:`models.persist.SignatureError` for river learners not signed with ``key``."""
    if snapshot.format != FORMAT or snapshot.models.format != STATE_FORMAT or not snapshot.models.serving:
        raise ValueError(f"snapshot format {snapshot.format}/{snapshot.models.format}, not {FORMAT}/{STATE_FORMAT}")
    return EnvironmentModels.from_state(snapshot.models, key)


def encode(snapshot: ServingSnapshot) -> bytes:
    return zlib.compress(msgspec.msgpack.encode(snapshot), 1)


def decode(data: bytes) -> ServingSnapshot:
    """What :func:`encode` wrote (``msgspec.ValidationError`` on anything else)."""
    return msgspec.msgpack.decode(zlib.decompress(data), type=ServingSnapshot)

"""Dataset loaders for offline evaluation: Gavel's throughput JSON, the observations
CSV of docs/ARCHITECTURE.md ("Dataset formats") and the AIP paper's co-location rows.

Every loader returns a :class:`Dataset`: one :class:`Sample` per (job, pair or
window) with its group (the unordered job set; cross-validation never splits a
group) and its target.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import msgspec

from events import PARAMETERS
from models.features import observed_features, parse_job_type, placement_features

MISO_DIR = Path(__file__).resolve().parent / "data" / "miso_a100_solo"
MISO_METRICS = {"E": "power", "S": "util_sm", "V": "util_mem", "M": "memory"}
# Gavel family -> MISO model whose solo profile stands in for it (same architecture class).
MISO_FAMILY = {
    "resnet-18": "resnet",
    "resnet-50": "resnet",
    "transformer": "transformer",
    "cyclegan": "cyclegan",
    "recommendation": "embedding",
}


class DatasetError(ValueError):
    """The file is not a dataset this module can read (one line saying why)."""


@dataclass(frozen=True)
class Sample:
    job_type: str
    co_job_types: tuple[str, ...]
    target: float
    group: str
    environment: str = ""
    pcts: Mapping[str, float | None] = field(default_factory=dict)
    solo: Mapping[str, float | None] = field(default_factory=dict)
    co_solos: tuple[Mapping[str, float | None], ...] = ()
    job_family: str = ""
    """The job type without its batch size (``ResNet-50``); empty: the job type itself."""
    co_job_families: tuple[str, ...] = ()
    """The co-runners' families, in the order of ``co_job_types``; empty: their job types."""

    @property
    def families(self) -> frozenset[str]:
        """Every family this row involves (its own and its co-runners'): what ``--holdout family`` holds out.

        >>> sorted(Sample("a (batch size 8)", ("b",), 0.0, "g", job_family="a").families)
        ['a', 'b']
        """
        co = self.co_job_families if len(self.co_job_families) == len(self.co_job_types) else self.co_job_types
        return frozenset((self.job_family or self.job_type, *co))

    def features(self, mode: str, category: str = "all") -> dict[str, float]:
        if mode == "observed":
            return observed_features(self.pcts, category)
        return placement_features(self.solo, self.co_solos, category, job_type=self.job_type, co_job_types=self.co_job_types)

    @property
    def job_set(self) -> str:
        """The unordered job set (this job and its co-runners)."""
        return " + ".join(sorted((self.job_type, *self.co_job_types)))


@dataclass(frozen=True)
class Dataset:
    name: str
    samples: list[Sample]
    target_name: str
    modes: tuple[str, ...]

    @property
    def groups(self) -> list[str]:
        return [s.group for s in self.samples]

    @property
    def targets(self) -> list[float]:
        return [s.target for s in self.samples]


@lru_cache(maxsize=64)
def miso_profile(job_type: str) -> dict[str, float]:
    """A100 solo profile (MISO) for a job type whose family MISO measured, interpolated in log batch size.

    >>> p = miso_profile("Transformer (batch size 32)")
    >>> p["E"], p["M"]
    (238.92, 5615.0)
    >>> miso_profile("A3C")
    {}
    """
    family, batch = parse_job_type(job_type)
    model = MISO_FAMILY.get(family, family)
    out: dict[str, float] = {}
    for key, metric in MISO_METRICS.items():
        path = MISO_DIR / f"{metric}_{model}.json"
        if not path.exists():
            return {}
        table = sorted((float(b), float(v)) for b, v in msgspec.json.decode(path.read_bytes()).items())
        b = float(batch) if batch else table[0][0]
        out[key] = _interp_log(table, b)
    return out


def _interp_log(table: Sequence[tuple[float, float]], b: float) -> float:
    if b <= table[0][0]:
        return table[0][1]
    if b >= table[-1][0]:
        return table[-1][1]
    for (b0, v0), (b1, v1) in itertools.pairwise(table):
        if b0 <= b <= b1:
            w = (math.log(b) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return round(v0 + w * (v1 - v0), 6)
    return table[-1][1]


_GAVEL_KEY = re.compile(r"\('([^'\\]*)', (\d+)\)")


def _job_name(key: str) -> tuple[str, int]:
    """A Gavel job key, the repr of a (name, scale factor) tuple, read as text: ``ast.literal_eval`` compiles, and in
    CPython 3.11 a compile beside another thread's can fail ("AST constructor recursion depth mismatch").

    >>> _job_name("('LM (batch size 40)', 2)")
    ('LM (batch size 40)', 2)
    """
    m = _GAVEL_KEY.fullmatch(key)
    if m is None:
        raise DatasetError(f"unexpected Gavel job key {key!r}")
    return m[1], int(m[2])


def load_gavel(path: Path, gpu: str = "v100", *, scale: int = 1, miso: bool = True) -> Dataset:
    """Gavel pairs on one GPU type: target = lost throughput in percent, ``100 * (1 - THIS / SOLO)``.

    Each unordered pair that ran (not ``[0, 0]``) gives two samples, one per job, in one group.
    """
    try:
        data = msgspec.json.decode(Path(path).read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        raise DatasetError(f"cannot read Gavel JSON {path}: {exc}") from exc
    if not isinstance(data, dict) or gpu not in data:
        have = ", ".join(sorted(data)) if isinstance(data, dict) else "not an object"
        raise DatasetError(f"{path}: no GPU {gpu!r} in this Gavel file (have: {have})")
    table = data[gpu]
    solo: dict[str, dict[str, float]] = {}
    for key, entry in table.items():
        name, s = _job_name(key)
        if s != scale or not isinstance(entry, dict) or not entry.get("null"):
            continue
        profile = dict(miso_profile(name)) if miso else {}
        profile["throughput"] = float(entry["null"])
        solo[name] = profile
    samples: list[Sample] = []
    seen: set[frozenset[str]] = set()
    for key, entry in table.items():
        a, s = _job_name(key)
        if s != scale or a not in solo:
            continue
        for other_key, value in entry.items():
            if other_key == "null":
                continue
            b, s2 = _job_name(other_key)
            pair = frozenset((a, b))
            if s2 != scale or b not in solo or pair in seen:
                continue
            seen.add(pair)
            if not isinstance(value, list) or len(value) != 2 or not all(value):
                continue  # [0, 0]: the pair could not run together
            group = " + ".join(sorted((a, b)))
            for job, other, thr in ((a, b, value[0]), (b, a, value[1])):
                target = 100.0 * (1.0 - float(thr) / solo[job]["throughput"])
                samples.append(
                    Sample(
                        job, (other,), target, group, gpu, {}, solo[job], (solo[other],),
                        parse_job_type(job)[0], (parse_job_type(other)[0],),
                    )
                )
    if not samples:
        raise DatasetError(f"{path}: no co-located pairs at scale {scale} for {gpu!r}")
    return Dataset(f"gavel:{gpu}", samples, "lost_throughput_pct", ("placement",))


def _float(v: str | None) -> float | None:
    if v is None or v.strip() == "":
        return None
    try:
        x = float(v)
    except ValueError as exc:
        raise DatasetError(f"not a number: {v!r}") from exc
    return x if math.isfinite(x) else None


def load_csv(path: Path, gpu: str | None = None) -> Dataset:
    """The observations CSV of docs/ARCHITECTURE.md ("Dataset formats"), or the paper's rows (``gpu, combination, E_pct.., interference_pct``);
    gzip-compressed where the name ends in ``.gz``."""
    try:
        opener = gzip.open if Path(path).suffix.lower() == ".gz" else open
        with opener(path, "rt", newline="") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
        raise DatasetError(f"cannot read CSV {path}: {exc}") from exc
    if not rows:
        raise DatasetError(f"{path}: no rows")
    cols = set(rows[0])
    if "interference_pct" not in cols:
        raise DatasetError(f"{path}: missing column interference_pct (have: {', '.join(sorted(cols))})")
    paper = "combination" in cols and "job_type" not in cols
    if not paper and not {"job_type", "co_job_types"} <= cols:
        raise DatasetError(f"{path}: need columns job_type and co_job_types (or the paper's gpu, combination)")
    env_col = "gpu" if paper else "environment"
    if gpu is not None:
        if env_col not in cols:
            raise DatasetError(f"{path}: --gpu given but the file has no {env_col} column")
        rows = [r for r in rows if r.get(env_col) == gpu]
        if not rows:
            raise DatasetError(f"{path}: no rows for {env_col} {gpu!r}")
    modes: list[str] = []
    if any(f"{p}_pct" in cols for p in PARAMETERS):
        modes.append("observed")
    if any(c.startswith("solo_") for c in cols):
        modes.append("placement")
    if not modes:
        raise DatasetError(f"{path}: no feature columns (E_pct..W_pct or solo_<P>/other_solo_<P>)")
    samples: list[Sample] = []
    labels: list[tuple[str, str]] = []
    for i, r in enumerate(rows):
        try:
            target = _float(r.get("interference_pct"))
            if target is None:
                continue
            if paper:
                jobs = r["combination"].split("_")
                job, co = jobs[0], tuple(jobs[1:])
            else:
                job, co = r["job_type"], tuple(t for t in (r.get("co_job_types") or "").split(";") if t)
            pcts = {p: _float(r.get(f"{p}_pct")) for p in PARAMETERS}
            keys = (*PARAMETERS, "M", "throughput")
            solo = {k: _float(r.get(f"solo_{k}")) for k in keys}
            other = {k: _float(r.get(f"other_solo_{k}")) for k in keys}
        except DatasetError as exc:
            raise DatasetError(f"{path}: row {i + 2}: {exc}") from exc
        env = r.get(env_col) or ""
        family = (r.get("job_family") or "").strip()
        co_families = tuple(t for t in (r.get("co_job_families") or "").split(";") if t)
        if co_families and len(co_families) != len(co):
            raise DatasetError(f"{path}: row {i + 2}: {len(co_families)} co_job_families for {len(co)} co_job_types")
        job_set = f"{env}|{' + '.join(sorted((job, *co)))}"
        labels.append((job_set, f"{env}|group={r['group']}" if r.get("group") else job_set))
        samples.append(Sample(job, co, target, job_set, env, pcts, solo, (other,) if co else (), family, co_families))
    if len(samples) < 4:
        raise DatasetError(f"{path}: only {len(samples)} labelled rows; need at least 4")
    groups = merge_groups(labels)
    samples = [dataclasses.replace(smp, group=g) for smp, g in zip(samples, groups, strict=True)]
    return Dataset(Path(path).name, samples, "interference_pct", tuple(modes))


def merge_groups(labels: Sequence[tuple[str, ...]]) -> list[str]:
    """One group per row: rows sharing any label (their job set, or a ``group`` column) are in one group.

    A ``group`` column can only join rows, never split a job set: two rows of one job set with different
    ``group`` values would otherwise sit in training and test at once.

    >>> merge_groups([("ab", "g1"), ("cd", "g1"), ("ab", "g2"), ("ef", "g3")])
    ['ab', 'ab', 'ab', 'ef']
    """
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for row in labels:
        for other in row[1:]:
            a, b = find(row[0]), find(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return [find(row[0]) for row in labels]


DATA_DIR = Path(__file__).resolve().parent / "data"
BUILTIN = {
    "gavel": DATA_DIR / "gavel" / "physical_cluster_throughputs.json",
    "paper": DATA_DIR / "aip_paper" / "colocation_rows.csv",
    # measured on one NVIDIA H200 by `aip experiment` (data/h200/README.md); in a clone of the repository only:
    # 5 jobs solo and all 10 pairs; a second run of 4 of them, 6 pairs and 3 triples
    "h200": Path(__file__).resolve().parents[1] / "data" / "h200" / "observations.csv.gz",
    "h200-triples": Path(__file__).resolve().parents[1] / "data" / "h200" / "run2" / "observations.csv.gz",
}
"""Datasets that ship with the project (licences beside them), by short name."""


def resolve(name_or_path: Path | str) -> Path:
    """A short name of :data:`BUILTIN` (``gavel``, ``paper``, ``h200``, ``h200-triples``) or a path.

    >>> resolve("gavel").name, resolve("some/file.csv").name
    ('physical_cluster_throughputs.json', 'file.csv')
    """
    return BUILTIN.get(str(name_or_path), Path(name_or_path))


def load(path: Path | str, gpu: str | None = None) -> Dataset:
    """Load any supported dataset by its content (JSON: Gavel; CSV: observations or paper rows), or a
    shipped one by its short name (:data:`BUILTIN`)."""
    p = resolve(path)
    if not p.is_file():
        names = ", ".join(BUILTIN)
        raise DatasetError(f"no such file: {p} (shipped datasets by name: {names})")
    if p.suffix.lower() == ".json":
        return load_gavel(p, gpu or "v100")
    return load_csv(p, gpu)

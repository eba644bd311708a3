"""Measured data the simulator is calibrated on, and the contention model (pure functions).

* Throughputs: Gavel's measured steps/s of 26 job types on K80, P100 and V100,
  alone and space-shared in pairs (``data/gavel_pairs.json``, scale factor 1,
  MIT licence in ``data/LICENSE.gavel``).  Job types keep Gavel's names, for
  example ``"ResNet-50 (batch size 64)"``; ``batch_size`` is parsed from them.
* Solo metric profiles: MISO's A100 power, SM and memory-controller utilisation
  and memory use by batch size (``data/miso_a100_solo.json``, MIT licence in
  ``data/LICENSE.miso_a100_solo``), mapped to Gavel's job families, and scaled to
  each GPU's power limit, memory size and memory bandwidth.

Contention model (documented in docs/BENCHMARKS.md as well): a job's speed when
sharing a GPU is its solo throughput times, for every co-runner, the fraction of
its solo throughput Gavel measured with that co-runner (exact for pairs, a
product of pairwise factors for three jobs).  The GPU's metrics combine the
jobs' solo profiles weighted by their speed fractions ``a_i``: power adds above
idle up to the board limit, utilisations overlap as independent busy
probabilities ``1 - prod(1 - u_i a_i)``, memory adds, PCIe traffic scales
with each job's speed.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

GPU_MODELS = ("v100", "p100", "k80")


@dataclass(frozen=True)
class GpuSpec:
    """Board properties used to scale A100 profiles (per GPU die for the K80)."""

    name: str
    power_limit_w: float
    idle_w: float
    mem_total_mb: float
    mem_bw_gbps: float
    energy_counter: bool


A100 = GpuSpec("a100", 400.0, 55.0, 40536.0, 1555.0, True)
GPUS = {
    "v100": GpuSpec("v100", 300.0, 40.0, 16160.0, 900.0, True),
    "p100": GpuSpec("p100", 250.0, 30.0, 16280.0, 732.0, False),
    "k80": GpuSpec("k80", 149.0, 25.0, 11441.0, 240.0, False),
}

# Gavel job family -> MISO model whose A100 profile shapes it, and input bytes per
# sample (what crosses PCIe host->device each step, per sample in the batch).
FAMILIES: dict[str, tuple[str, float]] = {
    "ResNet-18": ("resnet", 150_528.0),  # 3x224x224 uint8 image
    "ResNet-50": ("resnet", 150_528.0),
    "Transformer": ("transformer", 200.0),  # ~50 int32 tokens
    "LM": ("bert", 1_400.0),  # 35 tokens x 40 bytes
    "Recommendation": ("embedding", 16.0),
    "A3C": ("mobilenet", 28_224.0),  # 4x84x84 frames
    "CycleGAN": ("cyclegan", 393_216.0),  # 2 x 3x256x256
}


@functools.cache
def _load(name: str) -> Any:
    return json.loads(resources.files("producers.data").joinpath(name).read_text())


def gavel_table(gpu_model: str) -> dict[str, Any]:
    """``{job_type: {"solo": steps/s, "pairs": {other: [this, other]}}}`` for one GPU model."""
    gpus = _load("gavel_pairs.json")["gpus"]
    if gpu_model not in gpus:
        raise ValueError(f"unknown gpu model {gpu_model!r}; choose one of {', '.join(sorted(gpus))}")
    table: dict[str, Any] = gpus[gpu_model]
    return table


def job_types(gpu_model: str) -> list[str]:
    return sorted(gavel_table(gpu_model))


def family(job_type: str) -> str:
    """Gavel's job family.

    >>> family("ResNet-50 (batch size 64)"), family("A3C")
    ('ResNet-50', 'A3C')
    """
    return job_type.split(" (", 1)[0]


@functools.lru_cache(maxsize=1024)
def batch_size(job_type: str) -> int | None:
    """Batch size in a Gavel job name, None when it has none.

    >>> batch_size("ResNet-50 (batch size 64)"), batch_size("CycleGAN")
    (64, None)
    """
    m = re.search(r"\(batch size (\d+)\)", job_type)
    return int(m.group(1)) if m else None


def speed_fraction(table: dict[str, Any], job: str, others: list[str]) -> float | None:
    """Fraction of its solo throughput ``job`` keeps next to ``others``; None when Gavel could not co-run them.

    >>> t = {"a": {"solo": 10.0, "pairs": {"b": [5.0, 8.0]}}, "b": {"solo": 10.0, "pairs": {"a": [8.0, 5.0]}}}
    >>> speed_fraction(t, "a", ["b"]), speed_fraction(t, "a", [])
    (0.5, 1.0)
    """
    solo = table[job]["solo"]
    frac = 1.0
    for other in others:
        pair = table[job]["pairs"].get(other)
        if not pair or pair[0] <= 0 or solo <= 0:
            return None
        frac *= pair[0] / solo
    return frac


def interference_pct(solo_throughput: float, colocated_throughput: float) -> float:
    """The interference rate (docs/ARCHITECTURE.md, "Definitions"): slowdown in percent, 0 means none.

    >>> interference_pct(10.0, 5.0)
    100.0
    """
    return (solo_throughput / colocated_throughput - 1.0) * 100.0


@dataclass(frozen=True)
class SoloProfile:
    """What one job does to a GPU when it runs alone at full speed."""

    job_type: str
    throughput: float
    power_w: float  # above the board's idle power
    sm_util_pct: float
    mem_util_pct: float
    mem_used_mb: float
    pcie_rx_kbps: float
    pcie_tx_kbps: float


def _rank_value(values: dict[str, float], position: float) -> float:
    """Linear interpolation over a profile's batch sizes by relative position 0..1."""
    keys = sorted(values, key=float)
    x = position * (len(keys) - 1)
    lo = math.floor(x)
    hi = min(lo + 1, len(keys) - 1)
    return values[keys[lo]] + (values[keys[hi]] - values[keys[lo]]) * (x - lo)


def solo_profile(gpu_model: str, job_type: str) -> SoloProfile:
    """The scaled solo profile of ``job_type`` on ``gpu_model``."""
    gpu = GPUS[gpu_model]
    table = gavel_table(gpu_model)
    fam = family(job_type)
    miso_model, bytes_per_sample = FAMILIES[fam]
    miso = _load("miso_a100_solo.json")["models"][miso_model]
    siblings = sorted((j for j in table if family(j) == fam), key=lambda j: batch_size(j) or 0)
    position = siblings.index(job_type) / (len(siblings) - 1) if len(siblings) > 1 else 0.5
    power_a100 = _rank_value(miso["power"], position)
    power_frac = max(0.05, (power_a100 - A100.idle_w) / (A100.power_limit_w - A100.idle_w))
    bw_ratio = math.sqrt(A100.mem_bw_gbps / gpu.mem_bw_gbps)
    throughput = float(table[job_type]["solo"])
    rx_kbps = min(12e6, throughput * (batch_size(job_type) or 1) * bytes_per_sample / 1024.0)
    return SoloProfile(
        job_type=job_type,
        throughput=throughput,
        power_w=power_frac * (gpu.power_limit_w - gpu.idle_w),
        sm_util_pct=min(99.0, _rank_value(miso["util_sm"], position)),
        mem_util_pct=min(95.0, _rank_value(miso["util_mem"], position) * bw_ratio),
        mem_used_mb=_rank_value(miso["memory"], position) * gpu.mem_total_mb / A100.mem_total_mb,
        pcie_rx_kbps=rx_kbps,
        pcie_tx_kbps=0.05 * rx_kbps + 200.0,
    )


def combine(gpu_model: str, profiles: list[SoloProfile], fractions: list[float]) -> dict[str, float]:
    """The GPU's noiseless metrics with ``profiles`` running at speed ``fractions`` of solo.

    >>> p = solo_profile("v100", "ResNet-18 (batch size 64)")
    >>> m = combine("v100", [p, p], [0.8, 0.8])
    >>> m["sm_util_pct"] > p.sm_util_pct and m["mem_used_mb"] == 2 * p.mem_used_mb
    True
    """
    gpu = GPUS[gpu_model]
    power = gpu.idle_w + min(gpu.power_limit_w - gpu.idle_w, sum(p.power_w * a for p, a in zip(profiles, fractions, strict=True)))
    sm_idle = 1.0
    mem_idle = 1.0
    for p, a in zip(profiles, fractions, strict=True):
        sm_idle *= 1.0 - min(1.0, p.sm_util_pct * a / 100.0)
        mem_idle *= 1.0 - min(1.0, p.mem_util_pct * a / 100.0)
    return {
        "power_w": power,
        "sm_util_pct": 100.0 * (1.0 - sm_idle),
        "mem_util_pct": 100.0 * (1.0 - mem_idle),
        "mem_used_mb": sum(p.mem_used_mb for p in profiles),
        "pcie_rx_kbps": sum(p.pcie_rx_kbps * a for p, a in zip(profiles, fractions, strict=True)),
        "pcie_tx_kbps": sum(p.pcie_tx_kbps * a for p, a in zip(profiles, fractions, strict=True)),
    }


def steady_temp_c(gpu_model: str, power_w: float, ambient_c: float = 30.0) -> float:
    """Steady-state die temperature for a power draw (linear thermal resistance)."""
    gpu = GPUS[gpu_model]
    return ambient_c + 50.0 * power_w / gpu.power_limit_w

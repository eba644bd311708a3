"""The worker's garbage collector (:mod:`streams.garbage`): tuned in a process of its own (a freeze lasts as long
as the process), timed by the clock the worker's /metrics page reads."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from streams import garbage

ROOT = Path(__file__).resolve().parents[2]


def tuned(threshold: int) -> dict[str, object]:
    code = (
        "import gc, json; from streams import garbage; before = gc.get_threshold(); "
        f"frozen = garbage.tune({threshold}); "
        "print(json.dumps(dict(frozen=frozen, count=gc.get_freeze_count(), before=before, after=gc.get_threshold())))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_tune_freezes_what_the_start_made_and_collects_the_young_generation_less_often() -> None:
    t = tuned(20_000)
    assert t["frozen"] == t["count"] and t["count"] > 1_000  # the modules imported by then, at least
    assert t["after"] == [20_000, *t["before"][1:]]  # the older generations' thresholds as they were


def test_tune_zero_leaves_the_collector_as_it_is() -> None:
    t = tuned(0)
    assert t["frozen"] == t["count"] == 0 and t["after"] == t["before"]


def test_the_clock_times_every_collection_and_the_metrics_page_shows_it(monkeypatch) -> None:
    from collections import Counter

    from streams.metrics import StreamMetrics

    clock = garbage.GcClock().install()
    try:
        assert clock.install() is clock and gc.callbacks.count(clock) == 1  # once
        gc.collect()
    finally:
        gc.callbacks.remove(clock)
    assert clock.collections[2] >= 1 and clock.seconds[2] > 0.0
    monkeypatch.setattr(garbage, "CLOCK", clock)  # the page reads the process's clock: this one, no longer moving
    page = StreamMetrics(Counter(), Counter()).render()[0].decode()
    samples = {
        (s.name, s.labels["generation"]): s.value
        for f in text_string_to_metric_families(page)
        for s in f.samples
        if s.name.startswith("aip_worker_gc_")
    }
    assert set(samples) == {(n, g) for n in ("aip_worker_gc_seconds_total", "aip_worker_gc_collections_total") for g in "012"}
    for g in range(3):
        assert samples[("aip_worker_gc_collections_total", str(g))] == clock.collections[g]
        assert samples[("aip_worker_gc_seconds_total", str(g))] == clock.seconds[g]

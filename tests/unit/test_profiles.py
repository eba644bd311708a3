"""Solo profiles shared through interference.profiles: shares per source, merged the same way by every worker."""

from __future__ import annotations

import itertools
import random

from events import SoloProfile, decode, encode
from streams.profiles import PROFILE_KEYS, Share, SoloProfiles, _combine


def _worker(sources: list[str], seed: int) -> SoloProfiles:
    rng = random.Random(seed)
    p = SoloProfiles()
    for i in range(30):
        src = sources[i % len(sources)]
        p.add("v100", "resnet", {"E": rng.uniform(100, 200), "S": rng.uniform(50, 90), "throughput": rng.uniform(5, 9)},
              source=src, ts=1.7e9 + i)  # fmt: skip
    return p


def test_workers_that_read_the_same_records_in_any_order_hold_the_same_profiles() -> None:
    a, b = _worker(["0", "1"], 1), _worker(["2", "3"], 2)
    records = [decode(SoloProfile, encode(w.record("v100", "resnet"))) for w in (a, b)]  # through the wire format
    views = []
    for order in itertools.permutations(records):
        view = SoloProfiles()
        for r in order:
            view.merge(r)
        views.append(view.get("v100", "resnet"))
    assert views[0] == views[1]
    a.merge(records[1])
    b.merge(records[0])
    assert a.get("v100", "resnet") == b.get("v100", "resnet") == views[0]
    assert a.windows("v100", "resnet") == b.windows("v100", "resnet") == 60


def test_the_merged_profile_is_the_count_weighted_mean_of_the_shares() -> None:
    p = SoloProfiles()
    for v in (100.0, 200.0, 300.0):
        p.add("e", "j", {"E": v}, source="0", ts=1.7e9)
    p.add("e", "j", {"E": 600.0, "throughput": 4.0}, source="1", ts=1.7e9)
    got = p.get("e", "j")
    assert got is not None and got["E"] == 300.0 and got["throughput"] == 4.0 and got["S"] is None


def test_for_one_source_the_share_with_more_windows_wins_and_an_older_one_changes_nothing() -> None:
    new, old = SoloProfiles(), SoloProfiles()
    for i in range(5):
        new.add("e", "j", {"E": 10.0 * i}, source="3", ts=1.7e9 + i)
        if i < 2:
            old.add("e", "j", {"E": 10.0 * i}, source="3", ts=1.7e9 + i)
    view = SoloProfiles()
    assert view.merge(new.record("e", "j"))
    assert not view.merge(old.record("e", "j"))  # a stale record read later (another worker's old share)
    assert view.get("e", "j") == new.get("e", "j") and view.windows("e", "j") == 5
    assert not view.merge(new.record("e", "j"))  # its own echo


def test_checkpoints_round_trip_and_the_single_worker_format_still_loads() -> None:
    p = _worker(["0", "1"], 3)
    assert SoloProfiles.from_dict(p.to_dict()).get("v100", "resnet") == p.get("v100", "resnet")
    legacy = SoloProfiles.from_dict({"v100\x1fresnet": {"E": [150.0, 2], "throughput": [10.0, 1]}})
    got = legacy.get("v100", "resnet")
    assert got is not None and got["E"] == 150.0 and got["throughput"] == 10.0 and legacy.windows("v100", "resnet") == 2


def test_only_own_updates_are_published() -> None:
    p = SoloProfiles()
    p.merge(_worker(["5"], 4).record("v100", "resnet"))
    assert p.take_dirty() == []
    p.add("v100", "bert", {"E": 1.0}, source="0", ts=1.7e9)
    assert p.take_dirty() == [("v100", "bert")] and p.take_dirty() == []


def _combined_share_by_share(shares: list[Share]) -> dict[str, float | None]:
    """The merge as one pass over the shares (what ``_combine`` did before it looped per key)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    only: dict[str, float] = {}
    for s in shares:
        for k, m in s.means.items():
            c = s.counts.get(k, 0)
            if c:
                only[k] = m if k not in counts else float("nan")
                sums[k] = sums.get(k, 0.0) + m * c
                counts[k] = counts.get(k, 0) + c
    return {k: None if not counts.get(k) else only[k] if only[k] == only[k] else sums[k] / counts[k] for k in PROFILE_KEYS}


def test_the_merge_gives_the_same_floats_as_a_pass_over_the_shares() -> None:
    rng = random.Random(5)
    for _ in range(500):
        shares = []
        for _ in range(rng.randint(1, 9)):
            keys = [k for k in PROFILE_KEYS if rng.random() < 0.8]
            counts = {k: rng.choice([0, 1, 2, 7, 1000]) for k in keys}
            shares.append(Share({k: rng.uniform(-1e3, 1e3) for k in keys}, counts, 3))
        assert repr(_combine(shares)) == repr(_combined_share_by_share(shares))

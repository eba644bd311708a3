"""The fuzz generator's verdicts agree with the wire contract, so the integration test can count exactly."""

from __future__ import annotations

from collections import Counter

from aip.faults.fuzz import HUGE, fuzz_cases
from events import JobEvent, MetricSample, RecordError, decode
from events.topics import LIFECYCLE, METRICS

CLS = {METRICS: MetricSample, LIFECYCLE: JobEvent}


def verdict(topic: str, value: bytes | None) -> bool:
    try:
        decode(CLS[topic], value)
        return True
    except RecordError:
        return False


def test_every_rejected_case_fails_decoding_and_every_other_case_decodes() -> None:
    cases, valid = fuzz_cases(1000, seed=5)
    wrong = [(c.topic, c.mutation) for c in cases if verdict(c.topic, c.value) != (c.expect != "reject")]
    assert wrong == []
    counts = Counter((c.topic, c.expect) for c in cases)
    assert counts[(METRICS, "reject")] + counts[(METRICS, "duplicate")] == 1000
    assert counts[(LIFECYCLE, "reject")] + counts[(LIFECYCLE, "anomaly")] == 1000
    assert counts[(METRICS, "accept")] + counts[(LIFECYCLE, "accept")] == len(valid)


def test_every_mutation_family_is_present() -> None:
    cases, _ = fuzz_cases(1000, seed=5)
    mutations = {c.mutation for c in cases}
    for name in (
        "power NaN",
        "power inf",
        "power negative",
        "sm_util over 100",
        "missing ts",
        "host huge",
        "invalid UTF-8",
        "ts far future",
        "ts far past",
        "kind unknown",
        "exact resend",
        "impossible order",
        "unknown field",
        "tombstone",
    ):
        assert name in mutations, name
    assert mutations >= HUGE


def test_valid_records_keep_their_order_and_duplicates_follow_the_original() -> None:
    cases, valid = fuzz_cases(300, seed=2)
    accepted = [c for c in cases if c.expect == "accept"]
    assert len(accepted) == len(valid)
    seen: set[bytes | None] = set()
    for c in cases:
        if c.expect == "duplicate":
            assert c.value in seen
        if c.expect == "accept":
            seen.add(c.value)


def test_the_same_seed_gives_the_same_cases() -> None:
    assert fuzz_cases(200, seed=9)[0] == fuzz_cases(200, seed=9)[0]

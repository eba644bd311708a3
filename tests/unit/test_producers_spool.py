"""The on-disk spool, the publisher over a fake producer, replay and pacing."""

from __future__ import annotations

import json
import threading

from conftest import wait_for
from records import sample

from config import Settings
from events import MetricSample, decode
from producers import replay
from producers.pacing import at_rate, paced
from producers.publisher import Publisher
from producers.spool import Spool


def test_spool_keeps_order_across_segments_and_survives_a_restart(tmp_path) -> None:
    s = Spool(tmp_path, max_records=100, segment_records=3)
    for i in range(10):
        s.append("t", None if i % 2 else b"k", b"%d" % i)
    got = s.peek(4)
    assert [v for *_, v in got] == [b"0", b"1", b"2", b"3"] and got[1][2] is None
    assert s.commit(got[-1][0]) == 4
    s.close()
    again = Spool(tmp_path, max_records=100, segment_records=3)
    values = [v for *_, v in again.peek(100)]
    assert values[-6:] == [b"%d" % i for i in range(4, 10)]  # order kept; a head segment may come again
    assert len(again) == len(values)


def test_full_spool_drops_the_oldest_and_counts_them(tmp_path) -> None:
    s = Spool(tmp_path, max_records=5, segment_records=2)
    for i in range(12):
        s.append("t", b"k", b"%d" % i)
    assert len(s) == 5 and s.dropped == 7
    assert [v for *_, v in s.peek(10)] == [b"%d" % i for i in range(7, 12)]
    assert len(list(tmp_path.glob("*.seg"))) <= 4


class FakeFuture:
    def __init__(self, ok: bool) -> None:
        self.is_done = True
        self._ok = ok
        self.exception = None if ok else ConnectionError("down")

    def succeeded(self) -> bool:
        return self._ok


class FlakyProducer:
    """Fails while ``down`` is set, records what it accepted otherwise."""

    def __init__(self, broker: dict) -> None:
        self.broker = broker

    def send_raw(self, topic, value, key=None):
        ok = not self.broker["down"].is_set()
        if ok:
            self.broker["log"].append((topic, key, value))
        return FakeFuture(ok)

    def flush(self, timeout_s=None):
        pass

    def close(self, timeout_s=None):
        pass


def test_publisher_spools_while_down_and_delivers_everything_in_order(tmp_path) -> None:
    broker = {"down": threading.Event(), "log": []}
    broker["down"].set()
    settings = Settings(spool_dir=str(tmp_path), spool_max_records=1000)
    pub = Publisher(settings, "t", producer_factory=lambda: FlakyProducer(broker), retry_s=0.01)
    for i in range(50):
        pub.publish("gpu.metrics", sample(seq=i))
    wait_for(lambda: pub.metrics.value("aip_producer_send_failures_total") >= 1, 5, what="a failed send")
    assert pub.pending == 50 and not broker["log"]
    broker["down"].clear()
    assert pub.close(timeout_s=10) == 0
    seqs = [decode(MetricSample, v).seq for t, _k, v in broker["log"]]
    assert seqs == list(range(50))
    assert {t for t, *_ in broker["log"]} == {"gpu.metrics"}
    assert pub.metrics.value("aip_producer_records_sent_total") == 50
    assert pub.metrics.value("aip_producer_records_spooled_total") == 50


def test_publisher_counts_drops_when_the_spool_is_full(tmp_path) -> None:
    broker = {"down": threading.Event(), "log": []}
    broker["down"].set()
    pub = Publisher(
        Settings(spool_dir=str(tmp_path), spool_max_records=10), "t", producer_factory=lambda: FlakyProducer(broker), retry_s=0.01
    )
    for i in range(25):
        pub.publish("gpu.metrics", sample(seq=i))
    assert pub.metrics.value("aip_producer_records_dropped_total") == 15
    broker["down"].clear()
    assert pub.close(timeout_s=10) == 0
    assert [decode(MetricSample, v).seq for *_, v in broker["log"]] == list(range(15, 25))


def test_second_publisher_on_the_same_spool_is_refused(tmp_path) -> None:
    import pytest

    from producers.publisher import PublisherError

    settings = Settings(spool_dir=str(tmp_path))
    broker = {"down": threading.Event(), "log": []}
    first = Publisher(settings, "same", producer_factory=lambda: FlakyProducer(broker))
    with pytest.raises(PublisherError, match="another producer"):
        Publisher(settings, "same", producer_factory=lambda: FlakyProducer(broker))
    first.close()


def test_replay_reads_tail_json_in_timestamp_order(tmp_path) -> None:
    from events import to_dict

    path = tmp_path / "rec.jsonl"
    lines = [{"_topic": "gpu.metrics", **to_dict(sample(seq=i, ts=1_700_000_000.0 + 10 - i))} for i in range(3)]
    lines.append({"_topic": "interference.alerts", "ts": 1.7e9})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    records, skipped = replay.load(path)
    assert [r.seq for _, r in records] == [2, 1, 0] and skipped == 2
    moved = replay.shifted(records, 100.0)
    assert moved[0][1].ts == records[0][1].ts + 100.0


def test_pacing_follows_event_time_at_the_speedup() -> None:
    now = [0.0]
    sleeps = []

    def sleep(s: float) -> None:
        sleeps.append(round(s, 6))
        now[0] += s

    items = [("t", sample(ts=1_700_000_000.0 + k)) for k in range(4)]
    list(paced(items, 2.0, clock=lambda: now[0], sleep=sleep))
    assert sleeps == [0.5, 0.5, 0.5]
    assert list(paced(items, 0.0, clock=lambda: 0.0, sleep=sleeps.append)) == items and len(sleeps) == 3


def test_a_rate_sleeps_in_bursts_of_min_sleep_and_an_event_wait_stops_it() -> None:
    now = [0.0]
    sleeps: list[float] = []

    def sleep(s: float) -> bool:
        sleeps.append(round(s, 6))
        now[0] += s
        return len(sleeps) == 2  # the second wait is interrupted (Event.wait returns True)

    # 10 per second, asleep only when over 0.25 s ahead: 0-2 at once, a sleep before 3, then before 6 the stop
    sent = list(at_rate(range(10), 10.0, min_sleep_s=0.25, clock=lambda: now[0], sleep=sleep))
    assert sleeps == [0.3, 0.3] and sent == [0, 1, 2, 3, 4, 5]
    assert list(at_rate(range(5), 0.0, sleep=sleeps.append)) == list(range(5)) and len(sleeps) == 2

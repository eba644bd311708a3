"""``interval_pct`` on Prediction and WhatIf: optional, two finite numbers, readable by old and new readers."""

from __future__ import annotations

import json

import pytest

from events import Prediction, RecordError, WhatIf
from events.codec import decode, encode


def _prediction(**kw):  # type: ignore[no-untyped-def]
    base = dict(ts=1e9, gpu_uuid="GPU-a", environment="v100", job_id="j", job_type="A", job_set=["A", "B"],
                mode="placement", interference_pct=12.0, model="ExtraTrees", category="all", expected_error_pct=3.0)  # fmt: skip
    base.update(kw)
    return Prediction(**base)


def test_round_trip_and_absent_means_unknown() -> None:
    p = _prediction(interval_pct=[4.0, 20.5], what_if=[WhatIf(job_type="C", newcomer_pct=9.0, existing_pct=3.0, interval_pct=[1.0, 17.0])])
    back = decode(Prediction, encode(p))
    assert back == p and back.interval_pct == [4.0, 20.5] and back.what_if[0].interval_pct == [1.0, 17.0]
    old = json.loads(encode(_prediction()))
    old.pop("interval_pct", None)  # what a producer from before the field sends
    assert decode(Prediction, json.dumps(old).encode()).interval_pct is None


def test_a_reader_that_does_not_know_the_field_still_reads_the_record() -> None:
    """Version-1 readers ignore keys they do not know; the same holds for any key added later."""
    payload = json.loads(encode(_prediction(interval_pct=[1.0, 2.0])))
    payload["some_later_field"] = [1, 2, 3]
    assert decode(Prediction, json.dumps(payload).encode()).interval_pct == [1.0, 2.0]


BAD = [[1.0], [1.0, 2.0, 3.0], ["a", 2.0], 5.0, [float("nan"), 2.0], [1.0, float("inf")], [-float("inf"), 0.0],
       ["1e400", 2.0], [5.0, 4.0], [0.0, -1e-9]]  # fmt: skip
BAD_IDS = ["one", "three", "string", "scalar", "nan", "inf", "-inf", "beyond-a-float", "lo>hi", "lo>hi-by-a-hair"]


@pytest.mark.parametrize("bad", BAD, ids=BAD_IDS)
@pytest.mark.parametrize("where", ["prediction", "what_if"])
def test_malformed_interval_is_refused(bad, where: str) -> None:  # type: ignore[no-untyped-def]
    payload = json.loads(encode(_prediction(what_if=[WhatIf(job_type="C", newcomer_pct=9.0, existing_pct=3.0)])))
    target = payload if where == "prediction" else payload["what_if"][0]
    target["interval_pct"] = bad
    text = json.dumps(payload).replace('"1e400"', "1e400")  # a JSON number no float holds
    # nan and inf go as the literals the stdlib writes (NaN, Infinity): not JSON, refused either way
    with pytest.raises(RecordError, match=r"interval_pct|not valid JSON"):
        decode(Prediction, text.encode())


@pytest.mark.parametrize("bad", [[float("nan"), 2.0], [1.0, float("inf")], [5.0, 4.0]], ids=["nan", "inf", "lo>hi"])
def test_a_malformed_interval_is_not_published(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RecordError, match="interval_pct"):
        encode(_prediction(interval_pct=bad))
    with pytest.raises(RecordError, match="interval_pct"):
        encode(_prediction(what_if=[WhatIf(job_type="C", newcomer_pct=9.0, existing_pct=3.0, interval_pct=bad)]))


def test_a_point_interval_is_valid() -> None:
    assert decode(Prediction, encode(_prediction(interval_pct=[7.0, 7.0]))).interval_pct == [7.0, 7.0]


def test_best_gpu_upper_risk_prefers_the_sure_gpu() -> None:
    """GPU-a: expected 30 but the interval reaches 90; GPU-b: expected 40, sure within 45."""
    from clients.scheduler import SchedulerClient

    client = SchedulerClient(clock=lambda: 1e9)
    for gpu, pct, hi in (("GPU-a", 30.0, 90.0), ("GPU-b", 40.0, 45.0), ("GPU-c", 35.0, None)):
        interval = None if hi is None else [pct - 10.0, hi]
        w = WhatIf(job_type="LM", newcomer_pct=pct, existing_pct=5.0, interval_pct=interval)
        assert client.update(_prediction(gpu_uuid=gpu, job_set=["A"], what_if=[w]))
    gpus = ["GPU-a", "GPU-b", "GPU-c"]
    assert client.best_gpu("LM", gpus) == "GPU-a"
    assert client.best_gpu("LM", gpus, risk="upper") == "GPU-c"  # no interval: costed at its expected 35 + 5
    assert client.best_gpu("LM", ["GPU-a", "GPU-b"], risk="upper") == "GPU-b"
    assert client.cost_pct("GPU-a", "LM", risk="upper") == 95.0 and client.cost_pct("GPU-a", "LM") == 35.0
    with pytest.raises(ValueError, match="risk"):
        client.best_gpu("LM", gpus, risk="worst")


def test_what_if_entries_are_checked_once_per_list_and_the_rest_of_each_prediction_always() -> None:
    entries = [WhatIf(job_type="C", newcomer_pct=9.0, existing_pct=3.0)]
    first, again = _prediction(what_if=entries), _prediction(what_if=entries, job_id="k")
    assert decode(Prediction, encode(again)) == again and decode(Prediction, encode(first)).what_if == entries
    with pytest.raises(RecordError, match="interference_pct"):  # the same entries, the prediction itself invalid
        encode(_prediction(what_if=entries, interference_pct=float("nan")))
    bad = [WhatIf(job_type="C", newcomer_pct=float("inf"), existing_pct=3.0)]
    for _ in range(2):  # a list that failed is never taken as checked
        with pytest.raises(RecordError, match="newcomer_pct"):
            encode(_prediction(what_if=bad))

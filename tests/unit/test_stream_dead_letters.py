"""Dead letters for what the stages fail on, through the faust agents' ``test_context()``: an exception while
handling one record costs that record alone (dead-lettered with its reason), and a record of a topic the worker
does not read is refused by name."""

from __future__ import annotations

import asyncio
from typing import Any

from records import sample
from test_stream_agents import decode_payload, make, settle
from test_streams import observations

from events import encode


def _letters(sent: list[tuple[str, Any]]) -> list[Any]:
    return [r for n, r in sent if n == "deadletter"]


def _put_inputs(streams: Any, values: list[bytes], topic: str, until: Any) -> None:
    """Put ``values`` to stage 1 as records of ``topic``; let it run until ``until()``."""
    real = streams.inputs.handle_input

    def handle(event: Any) -> Any:
        event.message.topic = topic
        return real(event)

    streams.inputs.handle_input = handle

    async def go() -> None:
        async with streams.agents[0].test_context() as agent:
            for value in values:
                await agent.put(value, key=b"GPU-A")
            await settle(until)

    asyncio.run(go())


def test_an_exception_in_stage_1_dead_letters_that_record_and_the_next_is_handled(tmp_path: Any, monkeypatch: Any) -> None:
    streams, sent = make(tmp_path)
    real = streams.stage1.on_metric
    bad = sample(ts=1_700_000_003.0, gpu_uuid="GPU-A", seq=3)

    handled: list[int] = []

    def on_metric(record: Any, *args: Any) -> Any:
        if record.seq == bad.seq:
            raise ZeroDivisionError("float division by zero")
        handled.append(record.seq)
        return real(record, *args)

    monkeypatch.setattr(streams.stage1, "on_metric", on_metric)
    values = [encode(sample(ts=1_700_000_000.0 + i, gpu_uuid="GPU-A", seq=i)) for i in range(6)]
    _put_inputs(streams, values, streams.topics.metrics, lambda: len(handled) == 5 and len(_letters(sent)) == 1)
    assert handled == [0, 1, 2, 4, 5]  # the records around it were handled
    letters = _letters(sent)
    assert [(d.error, d.stage, d.source_topic) for d in letters] == [
        ("stage 1 error: ZeroDivisionError: float division by zero", "stage1", "gpu.metrics")
    ]
    assert decode_payload(letters[0].payload_b64) == values[bad.seq]  # the record itself


def test_a_record_of_a_topic_the_worker_does_not_read_is_dead_lettered_by_name(tmp_path: Any) -> None:
    streams, sent = make(tmp_path)
    _put_inputs(streams, [encode(sample(ts=1_700_000_000.0))], "unit.gpu.elsewhere", lambda: len(_letters(sent)) == 1)
    letters = _letters(sent)
    assert [(d.error, d.stage) for d in letters] == [("unexpected topic unit.gpu.elsewhere", "stage1")]


def test_an_exception_in_stage_2_dead_letters_that_observation_and_the_next_is_learned(tmp_path: Any, monkeypatch: Any) -> None:
    streams, sent = make(tmp_path)
    obs = observations(5)
    real = streams.stage2.learn

    def learn(o: Any, *args: Any, **kw: Any) -> Any:
        if o.observation_id == obs[2].observation_id:
            raise KeyError("resnet")
        return real(o, *args, **kw)

    monkeypatch.setattr(streams.stage2, "learn", learn)

    async def go() -> None:
        async with streams.agents[1].test_context() as agent:
            for o in obs:
                await agent.put(encode(o), key=b"v100")
            await settle(lambda: streams.metrics.observations.get("v100") == 4 and len(_letters(sent)) == 1)

    asyncio.run(go())
    letters = _letters(sent)
    assert [(d.error, d.stage, d.source_topic) for d in letters] == [
        ("stage 2 error: KeyError: 'resnet'", "stage2", "interference.observations")
    ]
    assert streams.stage2.models["v100"].observations == 4  # the others learned

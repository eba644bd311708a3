"""The faust agents through ``agent.test_context()``: no broker, sends captured."""

from __future__ import annotations

import asyncio
from typing import Any

from records import job_event, sample
from test_streams import observations, scenario

from config import Settings
from events import Observation, encode, observation_batches, to_dict
from streams.app import create_app


async def settle(condition: Any, timeout_s: float = 30.0) -> None:
    """Let the agent run until ``condition()`` holds (its buffers flushed); fail after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the agent did not finish in time"
        await asyncio.sleep(0.01)


def make(tmp_path: Any) -> Any:
    streams = create_app(Settings(topic_prefix="unit.", window_s=10.0, lateness_s=2.0, state_dir=str(tmp_path)), web=False)
    sent: list[tuple[str, Any]] = []

    async def send(name: str, key: str | None, record: Any) -> None:
        sent.append((name, record))

    async def send_observation(key: bytes, value: bytes) -> None:
        sent.append(("observations", value))

    def publish_served(out: Any) -> None:  # predictions and alerts are handed over unawaited, not sent one by one
        sent.extend([("predictions", p) for p in out.predictions] + [("alerts", a) for a in out.alerts])

    streams.publisher.send = send  # type: ignore[method-assign]
    streams.publisher.served = publish_served  # type: ignore[method-assign]
    streams.observations.send = send_observation  # type: ignore[method-assign]
    streams.publisher.emit_observations = lambda obs: sent.extend(("observations", o) for o in obs)  # type: ignore[method-assign]

    def dead_letter_soon(key: bytes | None, value: bytes) -> None:  # a batch's invalid observation: buffered
        from events import DeadLetter, decode

        sent.append(("deadletter", decode(DeadLetter, value)))

    streams.out["deadletter"].send_soon = lambda key=None, value=b"", **_: dead_letter_soon(key, value)  # type: ignore[method-assign]
    return streams, sent


def test_stage2_agent_publishes_predictions_and_dead_letters(tmp_path: Any) -> None:
    streams, sent = make(tmp_path)
    stage2 = streams.agents[1]
    expected = 2 * (25 - 1)  # the first observation finds nothing learned, each later one is predicted in both modes

    async def go() -> None:
        async with stage2.test_context() as agent:
            for o in observations(25):
                await agent.put(encode(o), key=b"v100")
            await agent.put(b"not json", key=b"v100")
            await agent.put(encode(observations(1)[0]), key=b"v100")  # duplicate
            # the last record read, and its batch handled
            await settle(
                lambda: streams.stage2.counters["duplicates"] == 1 and [n for n, _ in sent].count("predictions") >= expected
            )

    asyncio.run(go())
    names = [n for n, _ in sent]
    assert names.count("predictions") == expected
    assert names.count("deadletter") == 1 and "leaderboard" in names
    dl = next(r for n, r in sent if n == "deadletter")
    assert dl.stage == "stage2" and "not valid JSON" in dl.error
    assert streams.stage2.counters["duplicates"] == 1


def _stage2_through_agent(streams: Any, values: list[bytes], until: Any) -> None:
    async def go() -> None:
        async with streams.agents[1].test_context() as agent:
            for value in values:
                await agent.put(value, key=b"v100")
            await settle(until)  # the last batch handled

    asyncio.run(go())


def test_stage2_learns_and_serves_a_batch_as_the_same_observations_one_by_one(tmp_path: Any) -> None:
    """ObservationBatch records (several observations per record) give stage 2 the same models, leaderboard and
    predictions as the same observations one per record; an invalid observation of a batch is dead-lettered alone."""
    obs = observations(40)
    singles, sent_singles = make(tmp_path / "singles")

    def learned_all(sent: list[tuple[str, Any]]) -> bool:  # the leaderboard after the last observation is out
        return any(n == "leaderboard" and r.observations == len(obs) for n, r in sent)

    _stage2_through_agent(singles, [encode(o) for o in obs], lambda: learned_all(sent_singles))

    batches = [value for _env, value, _n in observation_batches(obs, max_bytes=4096)]
    assert len(batches) > 3 and all(b'"observations":[' in b for b in batches)
    stray = encode(Observation(**{**to_dict(obs[0]), "environment": "a100", "co_solo": obs[0].co_solo}))
    head, tail = batches[0].split(b"[", 1)
    batches[0] = head + b"[" + stray + b"," + tail  # another environment's observation, inside a v100 batch
    batched, sent_batched = make(tmp_path / "batched")
    _stage2_through_agent(
        batched,
        batches,
        lambda: learned_all(sent_batched) and any(n == "deadletter" for n, _ in sent_batched),
    )

    def served(sent: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in to_dict(r).items() if k != "ts"} for n, r in sent if n == "predictions"]

    assert served(sent_batched) == served(sent_singles) and len(served(sent_singles)) > 0
    assert batched.stage2.models["v100"].observations == singles.stage2.models["v100"].observations == len(obs)

    def board(sent: list[tuple[str, Any]]) -> dict[str, Any]:  # the last leaderboard published, less its timings
        last = [r for n, r in sent if n == "leaderboard"][-1]
        return {k: v for k, v in to_dict(last).items() if k not in ("ts", "selection_seconds", "last_refit")}

    assert board(sent_batched) == board(sent_singles)
    assert batched.metrics.observations == singles.metrics.observations == {"v100": len(obs)}
    letters = [r for n, r in sent_batched if n == "deadletter"]
    assert [n for n, _ in sent_singles].count("deadletter") == 0 and len(letters) == 1
    assert letters[0].stage == "stage2" and "environment 'a100' is not the batch's environment 'v100'" in letters[0].error
    assert decode_payload(letters[0].payload_b64) == stray  # its own JSON, not the whole batch


def decode_payload(payload_b64: str) -> bytes:
    import base64

    return base64.b64decode(payload_b64)


def test_stage1_agent_emits_observations(tmp_path: Any) -> None:
    streams, sent = make(tmp_path)
    stage1 = streams.agents[0]
    seen: list[str] = []
    real = streams.inputs.handle_input

    def handle(event: Any) -> Any:
        # test_context delivers on its own channel: route by record shape as the topics would
        seen.append(event.message.topic)
        value = event.value
        event.message.topic = streams.topics.metrics if b"power_w" in value else streams.topics.lifecycle
        return real(event)

    streams.inputs.handle_input = handle  # type: ignore[method-assign]

    async def go() -> None:
        async with stage1.test_context() as agent:
            for e in scenario():
                await agent.put(encode(e), key=e.gpu_uuid.encode())
            await agent.put(
                encode(sample(ts=1_600_000_000.0, sm_util_pct=50.0)).replace(b'"sm_util_pct":50.0', b'"sm_util_pct":150.0')
            )
            await agent.put(
                encode(job_event("started", gpu_uuid="GPU-A", ts=1_700_000_001.0)).replace(b'"started"', b'"exploded"')
            )
            await settle(lambda: sum(n == "deadletter" for n, _ in sent) == 2)  # the last record read

    asyncio.run(go())
    obs = [v for n, v in sent if n == "observations"]
    dls = [r for n, r in sent if n == "deadletter"]
    assert len(obs) == streams.stage1.counters["observations"] > 0
    assert len(dls) == 2
    assert "sm_util_pct" in dls[0].error and "kind" in dls[1].error


def test_the_prediction_bound_setting_reaches_stage_2(tmp_path: Any) -> None:
    streams = create_app(Settings(topic_prefix="unit.", state_dir=str(tmp_path), prediction_max_pct=42.0), web=False)
    assert streams.stage2.max_pct == 42.0
    assert streams.stage2.models_for("v100").config.max_pct == 42.0


def test_the_stop_watchdog_ends_a_worker_still_there_and_nothing_once_cancelled() -> None:
    from streams.app import exit_within

    codes: list[int] = []
    exit_within(0.05, exit=codes.append).join(5)
    assert codes == [1]
    cancelled = exit_within(0.05, exit=codes.append)
    cancelled.cancel()
    cancelled.join(5)
    assert codes == [1]
    assert Settings.from_env({"AIP_WORKER_STOP_WITHIN_S": "7.5"}).worker_stop_within_s == 7.5

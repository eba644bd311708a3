"""The faust app: thin agents around :class:`Stage1` and :class:`Stage2`, HTTP views, metrics.

``create_app(settings)`` builds a fresh app (tests build one per test);
:func:`run_worker` runs it until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import faust

from config import Settings
from events import JobEvent, MetricSample, Observation, RecordError, Topics, decode, encode
from events.topics import LIFECYCLE, METRICS
from streams.deadletters import dead_letter
from streams.metrics import StreamMetrics, dead_letter_reason
from streams.stage1 import LateEvent, Stage1
from streams.stage2 import Stage2

log = logging.getLogger(__name__)


def app_id(settings: Settings) -> str:
    """The faust app id (consumer group, changelog topic names): one per topic prefix."""
    suffix = re.sub(r"[^A-Za-z0-9_-]", "-", settings.topic_prefix).strip("-")
    return f"{settings.client_id}-streams" + (f"-{suffix}" if suffix else "")


def broker_credentials(settings: Settings) -> Any:
    if not (settings.uses_tls or settings.uses_sasl):
        return None
    context = None
    if settings.uses_tls:
        context = ssl.create_default_context(cafile=settings.ssl_cafile or None)
        context.check_hostname = settings.ssl_check_hostname
        if settings.ssl_certfile:
            context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile or None)
    if settings.uses_sasl:
        return faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password,
            ssl_context=context,
            mechanism=settings.sasl_mechanism,
        )
    return faust.SSLCredentials(context)


def state_dir(settings: Settings) -> Path:
    """The worker's state directory (created): ``settings.state_dir`` or ~/.cache/aip/state."""
    path = Path(settings.state_dir).expanduser() if settings.state_dir else Path.home() / ".cache" / "aip" / "state"
    (path / "faust").mkdir(parents=True, exist_ok=True)
    return path


def app_config(settings: Settings, *, web: bool = True, web_port: int | None = None) -> dict[str, Any]:
    """faust settings for the broker at hand (see DESIGN.md: Tansu holds JoinGroup for the whole rebalance timeout)."""
    return dict(
        broker=[f"kafka://{s}" for s in settings.bootstrap_servers],
        broker_credentials=broker_credentials(settings),
        store="memory://",
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        producer_acks=1,
        broker_rebalance_timeout=settings.rebalance_timeout_s,
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        broker_max_poll_interval=30.0,
        broker_request_timeout=max(settings.request_timeout_s, 31.0),
        web_enabled=web,
        web_port=web_port if web_port is not None else settings.web_port,
        web_bind="127.0.0.1",
        web_in_thread=False,
        datadir=str(state_dir(settings) / "faust"),
        consumer_auto_offset_reset="earliest",
        key_serializer="raw",
        value_serializer="raw",
    )


class Streams:
    """One worker's app, processors and metrics (attributes for tests and views)."""

    def __init__(
        self, settings: Settings, *, web: bool = True, web_port: int | None = None, clock: Any = time.time, stage2: bool = True
    ) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.clock = clock
        self.app = faust.App(app_id(settings), **app_config(settings, web=web, web_port=web_port))
        app = self.app
        t = self.topics
        self.inputs = app.topic(t.metrics, t.lifecycle, key_serializer="raw", value_serializer="raw")
        self.observations = app.topic(t.observations, key_serializer="raw", value_serializer="raw")
        self.out = {
            name: app.topic(getattr(t, name), key_serializer="raw", value_serializer="raw")
            for name in ("predictions", "alerts", "leaderboard", "deadletter")
        }
        self.table = app.Table(
            "stage1-state",
            default=None,
            partitions=settings.partitions,
            use_partitioner=True,
            schema=faust.Schema(key_type=bytes, value_type=dict, key_serializer="raw", value_serializer="json"),
        )
        self.stage1 = Stage1(settings.window_s, settings.lateness_s, settings.lifecycle_hold_s, loader=self._load_gpu)
        self.stage2 = Stage2(settings.alert_threshold_pct, settings.alert_clear_pct, state_dir=state_dir(settings), clock=clock)
        self.metrics = StreamMetrics(
            self.stage1.counters, self.stage2.counters, leaderboards=lambda: self.stage2.leaderboards, highwater=self._highwater
        )
        self._refitting: set[str] = set()
        self._last_checkpoint = 0.0
        self._refit_futures: set[asyncio.Future[None]] = set()
        self._register(stage2)

    # ------------------------------------------------------------------ state
    def _load_gpu(self, gpu: str) -> Any:
        return self.table.get(gpu.encode())

    def checkpoint(self) -> None:
        """Write the state of GPUs whose windows closed to the changelog-backed table."""
        for gpu in self.stage1.dirty:
            self.table[gpu.encode()] = self.stage1.gpus[gpu].to_dict()
        self.stage1.dirty.clear()

    def maybe_checkpoint(self) -> None:
        now = time.monotonic()
        if self.stage1.dirty and now - self._last_checkpoint >= self.settings.checkpoint_interval_s:
            self._last_checkpoint = now
            self.checkpoint()

    def on_partitions_revoked(self, *_: Any, **__: Any) -> None:
        # Another worker may own these GPUs now; reload from the table on next sight.
        self.checkpoint()
        self.stage1.gpus.clear()

    def _highwater(self, topic: str, partition: int) -> int | None:
        from faust.types import TP

        try:
            return int(self.app.consumer.highwater(TP(self.topics.name(topic), partition)))
        except Exception:  # not assigned here, or the consumer is not running
            return None

    def _consumed(self, event: Any) -> None:
        m = event.message
        self.metrics.consumed_message(self.topics.base(m.topic), m.partition, m.offset)

    # ----------------------------------------------------------------- output
    async def send(self, name: str, key: str | None, record: Any) -> None:
        await self.out[name].send(key=None if key is None else key.encode(), value=encode(record))
        self.metrics.published[name] += 1

    def emit_observation(self, obs: Observation) -> None:
        """Buffer an observation for the producer.  Not awaited: an awaited faust send cost about
        1 ms per record here; faust flushes this buffer before it commits the input offsets,
        so delivery stays at least once."""
        self.observations.send_soon(key=obs.environment.encode(), value=encode(obs))

    async def send_dead_letter(self, event: Any, error: str, stage: str) -> None:
        m = event.message
        record = dead_letter(self.topics.base(m.topic), m.partition, m.offset, m.value, error, m.key, stage, now=self.clock())
        self.metrics.dead_letters[dead_letter_reason(error)] += 1
        await self.send("deadletter", record.key, record)

    # ----------------------------------------------------------------- agents
    def handle_input(self, event: Any) -> tuple[list[Observation], str | None]:
        """Stage 1 for one raw event: (observations, dead-letter reason or None)."""
        base = self.topics.base(event.message.topic)
        try:
            if base == METRICS:
                return self.stage1.on_metric(decode(MetricSample, event.value)), None
            if base == LIFECYCLE:
                return self.stage1.on_job(decode(JobEvent, event.value)), None
            return [], f"unexpected topic {event.message.topic}"
        except RecordError as exc:
            return [], f"invalid {base} record: {exc}"
        except LateEvent as exc:
            return [], str(exc)
        except Exception as exc:  # a bug on one record must not stop the worker
            log.exception("stage 1 failed on %s p%s@%s", event.message.topic, event.message.partition, event.message.offset)
            return [], f"stage 1 error: {type(exc).__name__}: {exc}"

    def _register(self, with_stage2: bool = True) -> None:
        app = self.app
        s = self.settings

        @app.agent(self.inputs, name="stage1")
        async def stage1(stream: Any) -> None:
            if s.stage1_batch > 1:
                async for batch in stream.take_events(s.stage1_batch, within=s.stage1_batch_wait_s):
                    await self.stage1_batch(batch)
            else:
                async for event in stream.events():
                    await self.stage1_event(event)

        async def stage2(stream: Any) -> None:
            async for batch in stream.take_events(200, within=0.02):
                await self.stage2_batch(batch)

        if with_stage2:
            stage2 = app.agent(self.observations, name="stage2")(stage2)

        @app.timer(60.0)
        async def save_models() -> None:
            self.stage2.save()

        @app.page("/predictions/{gpu_uuid}")
        async def predictions(web: Any, request: Any, gpu_uuid: str) -> Any:
            return web.json({"gpu_uuid": gpu_uuid, "jobs": self.stage2.latest.get(gpu_uuid, {})})

        @app.page("/leaderboard")
        async def leaderboard(web: Any, request: Any) -> Any:
            from events import to_dict

            return web.json({env: to_dict(b) for env, b in self.stage2.leaderboards.items()})

        @app.page("/metrics")
        async def metrics(web: Any, request: Any) -> Any:
            body, content_type = self.metrics.render()
            return web.bytes(body, content_type=content_type)

        app.on_partitions_revoked.connect(self.on_partitions_revoked)

        self.agents = (stage1, stage2)

    async def stage1_event(self, event: Any) -> None:
        """Stage 1 for one event (the default: cheaper per event than faust's take buffer here)."""
        obs, error = self.handle_input(event)
        self._consumed(event)
        if error is not None:
            await self.send_dead_letter(event, error, "stage1")
        elif obs:
            for o in obs:
                self.emit_observation(o)
            self.metrics.published["observations"] += len(obs)
            self.maybe_checkpoint()

    async def stage1_batch(self, batch: Iterable[Any]) -> None:
        observations: list[Observation] = []
        for event in batch:
            obs, error = self.handle_input(event)
            self._consumed(event)
            if error is not None:
                await self.send_dead_letter(event, error, "stage1")
            elif obs:
                observations.extend(obs)
        for o in observations:
            self.emit_observation(o)
        self.metrics.published["observations"] += len(observations)
        self.maybe_checkpoint()

    async def stage2_batch(self, batch: Iterable[Any]) -> None:
        boards = {}
        for event in batch:
            self._consumed(event)
            try:
                obs = decode(Observation, event.value)
                out = self.stage2.on_observation(obs)
                self.metrics.observations[obs.environment] += 1
            except RecordError as exc:
                await self.send_dead_letter(event, f"invalid interference.observations record: {exc}", "stage2")
                continue
            except Exception as exc:
                log.exception("stage 2 failed on p%s@%s", event.message.partition, event.message.offset)
                await self.send_dead_letter(event, f"stage 2 error: {type(exc).__name__}: {exc}", "stage2")
                continue
            for p in out.predictions:
                await self.send("predictions", p.gpu_uuid, p)
            for a in out.alerts:
                await self.send("alerts", a.gpu_uuid, a)
            if out.leaderboard is not None:
                boards[out.leaderboard.environment] = out.leaderboard
        for env, board in boards.items():
            await self.send("leaderboard", env, board)
        self.start_refits()

    def start_refits(self) -> None:
        """Run due refits in an executor; apply each on the event loop when it finishes."""
        for env, task in self.stage2.refits_due():
            if env in self._refitting:
                continue
            self._refitting.add(env)
            future = asyncio.ensure_future(self._refit(env, task))
            self._refit_futures.add(future)
            future.add_done_callback(self._refit_futures.discard)

    async def _refit(self, env: str, task: Any) -> None:
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(None, task)
            board = self.stage2.apply_refit(env, result)
            if board is not None:
                await self.send("leaderboard", env, board)
        except Exception:
            log.exception("refit of %s failed", env)
        finally:
            self._refitting.discard(env)


def create_app(settings: Settings, **kwargs: Any) -> Streams:
    return Streams(settings, **kwargs)


def run_worker(settings: Settings, *, loglevel: str = "warn", web_port: int | None = None) -> None:
    """Run one worker in this process until SIGINT or SIGTERM (faust's Worker stops cleanly on both)."""
    from faust.worker import Worker

    streams = create_app(settings, web_port=web_port)
    levels = {"crit": "critical", "warn": "warning"}
    worker = Worker(streams.app, loglevel=levels.get(loglevel, loglevel), quiet=True, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    finally:
        streams.stage2.save()

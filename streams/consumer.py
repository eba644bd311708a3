"""The worker's faust app: faust's Kafka transport with the fetch wait a setting (``fetch_max_wait_s``), whose
consumer leaves its group when it stops (``leave_group_on_stop``, static members too: :mod:`streams.membership`).

faust's aiokafka driver fixes ``fetch_max_wait_ms`` at 1,500 ms.  On Apache Kafka the wait only bounds how
long a fetch is held while fewer than ``fetch_min_bytes`` (1) are new, so a shorter one costs a few more
empty fetches per second when idle and nothing when busy.  Measured on the embedded broker (docs/BENCHMARKS.md,
"Host-batched samples"): stage 1 read the same host-batched fleet in 3.4-6.4 s with 1,500 ms and 1.7-1.9 s with
100 or 250 ms, with the same observations; consumers of host batches spent the difference idle in ``epoll``.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.tables import TableManager
from faust.transport.drivers import aiokafka as driver

from streams.membership import leave_on_close


class _ConsumerThread(driver.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = self.app.fetch_max_wait_ms  # read by aiokafka when it starts its fetcher
        return consumer

    async def on_start(self) -> None:
        await super().on_start()  # starts the aiokafka consumer, which creates its group coordinator
        coordinator = getattr(self._consumer, "_coordinator", None)
        if self.app.leave_group_on_stop and coordinator is not None:
            leave_on_close(coordinator)

    def group_member(self) -> dict[str, Any]:
        """What the consumer knows of its group membership (for the liveness log): member id, generation, instance."""
        coordinator = getattr(self._consumer, "_coordinator", None)
        if coordinator is None:
            return {}
        return {
            "member_id": coordinator.member_id,
            "generation": coordinator.generation,
            "group_instance_id": coordinator._group_instance_id,
        }


class _Consumer(driver.Consumer):
    def _new_consumer_thread(self) -> Any:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(driver.Transport):
    Consumer = _Consumer


class _TableManager(TableManager):  # type: ignore[misc]
    async def on_start(self) -> None:
        """faust's, without its first 1 s sleep (it lets tables defined late register; this app defines none, and
        its consumer subscribes only once the manager started: every worker start waited it)."""
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


class App(faust.App):
    """:class:`faust.App` whose consumers wait at most ``fetch_max_wait_s`` for new records and leave their group when
    they stop (``leave_group_on_stop``), and whose table manager starts at once."""

    def __init__(self, *args: Any, fetch_max_wait_s: float = 1.5, leave_group_on_stop: bool = True, **kwargs: Any) -> None:
        self.fetch_max_wait_ms = max(1, round(fetch_max_wait_s * 1000.0))
        self.leave_group_on_stop = leave_group_on_stop
        kwargs.setdefault("TableManager", _TableManager)
        super().__init__(*args, **kwargs)

    def group_member(self) -> dict[str, Any]:
        """The consumer's group membership as far as it knows (empty before it started)."""
        thread = getattr(self.consumer, "_thread", None)
        member = getattr(thread, "group_member", None)
        return member() if member is not None else {}

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)

    async def maybe_start_producer(self) -> Any:
        """The started producer at once.  faust's is a ``stampede`` (callers share one future): three event-loop turns
        per call, and faust's producer buffer calls it for every record it sends.  With a task holding the loop 50 ms
        a turn, a buffered record waited 9.5 s at the median, 0.11 s with this (docs/BENCHMARKS.md, "Fleet", eleventh
        session)."""
        producer = self.producer
        if producer.started and not self.in_transaction:
            return producer
        return await super().maybe_start_producer()

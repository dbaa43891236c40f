"""Fresh metadata and a new rebalance, after this worker led one without a subscribed topic's partitions.

The group's leader plans every member's partitions from its own consumer's cluster
metadata. aiokafka drops a topic from that metadata when an update answers it with an
error (``LEADER_NOT_AVAILABLE`` while a restarted broker loads its logs), and keeps
nothing when an update fails (the broker away): a worker that joined during an outage,
or whose last update came mid-restart, may lead a rebalance with no partition of the
input topic to give. It then assigns nothing to anybody, the group is stable, and
aiokafka asks for metadata again only after ``metadata_max_age_ms`` (5 minutes), its
own retry after a failed update being the same wait. Every worker would serve nothing
for those minutes.

So when the assignor meets a subscribed topic without partitions it calls
:meth:`MetadataRefresh.missing`: this asks for the metadata at once and again with a
growing backoff until every such topic has its partitions, then makes the consumer
rejoin its group, so the next leader plans with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from pipeline.cancelling import cancel_and_wait
from pipeline.kafka import internals

log = logging.getLogger(__name__)

FIRST_BACKOFF = 0.1  # seconds before the second metadata request
MAX_BACKOFF = 5.0


class MetadataRefresh:
    """Asks for the metadata of topics the leader lacked until they come, then rejoins the group."""

    def __init__(self, *, first_backoff: float = FIRST_BACKOFF, max_backoff: float = MAX_BACKOFF) -> None:
        self._first_backoff = first_backoff
        self._max_backoff = max_backoff
        self._consumer: AIOKafkaConsumer | None = None
        self._wanted: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def attach(self, consumer: AIOKafkaConsumer) -> None:
        """The group consumer whose metadata is refreshed (before it joins the group)."""
        self._consumer = consumer

    @property
    def pending(self) -> frozenset[str]:
        """The topics waited for now (none once their metadata came and the rejoin was asked)."""
        return frozenset(self._wanted)

    def missing(self, topics: frozenset[str]) -> None:
        """The assignor planned without the partitions of ``topics``: refresh, then rejoin (returns at once)."""
        if not topics or self._consumer is None:
            return
        new = topics - self._wanted
        self._wanted |= topics
        if new:
            log.warning(
                "this worker led a rebalance without the partitions of %s in its metadata (they were "
                "assigned to nobody): asking for the metadata, then a new rebalance",
                ", ".join(sorted(new)),
            )
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._refresh(self._consumer), name="metadata refresh")

    async def close(self) -> None:
        """Stop asking (the worker stops)."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _refresh(self, consumer: AIOKafkaConsumer) -> None:
        backoff = self._first_backoff
        while True:
            with contextlib.suppress(KafkaError):
                await internals.force_metadata_update(consumer)
            unknown = {topic for topic in self._wanted if not consumer.partitions_for_topic(topic)}
            if not unknown:
                break
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._max_backoff)
        log.info(
            "metadata of %s received: rejoining the group so that its partitions are assigned",
            ", ".join(sorted(self._wanted)),
        )
        self._wanted.clear()
        internals.request_rejoin(consumer)

"""The worker's one transactional producer, and a new one in its place (Kafka Streams' StreamsProducer).

A producer that was fenced, or that an error left unusable, is never used again. The worker
asks for a new one (:meth:`WorkerProducer.lost`) and handles no record until it has started
(:meth:`WorkerProducer.replace`): starting a producer under the worker's transactional id
aborts what the last one left open and fences it. A new producer that cannot start yet (the
broker away) is tried again, :data:`PRODUCER_RETRY_S` later, by the next cycle. Fences that
come again and again mean another process runs under this transactional id
(:class:`~pipeline.worker.identity.FenceCount`): :meth:`lost` then gives the error the worker
stops with.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka.errors import KafkaError

from pipeline.errors import ProducerFencedError
from pipeline.kafka.transactional import TransactionalProducer
from pipeline.state.transaction import Transaction
from pipeline.worker.identity import FenceCount
from pipeline.worker.io import WorkerIO
from pipeline.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

PRODUCER_RETRY_S = 1.0  # between attempts to start a new producer


class WorkerProducer:
    """Starts the worker's producer, and a new one when the last was fenced or became unusable."""

    def __init__(self, settings: WorkerSettings, io: WorkerIO, transactional_id: str) -> None:
        self.settings = settings
        self.io = io
        self.transactional_id = transactional_id
        self.wanted = False  # a new producer must start before records are handled again
        self._fences = FenceCount(transactional_id)

    async def start(self) -> TransactionalProducer:
        """A started producer with the worker's transactional id (starting it aborts what an earlier one with
        the id left open, and fences it)."""
        producer = TransactionalProducer(
            self.io.producer(self.settings, self.transactional_id),
            self.transactional_id,
            send_offsets=self.io.send_offsets,
        )
        try:
            await producer.start()
        except BaseException:
            await producer.stop()
            raise
        return producer

    def lost(self, *, fenced: bool) -> ProducerFencedError | None:
        """The producer cannot be used again: a new one is wanted. ``fenced``: another producer took the id;
        the error to stop the worker with when that happened too often in a row."""
        stop = self._fences.fenced() if fenced else None
        self.wanted = True
        return stop

    async def replace(self, txn: Transaction) -> bool:
        """Start a new producer in place of ``txn``'s, if one is wanted; False while it cannot start yet."""
        if not self.wanted:
            return True
        await txn.producer.stop()
        try:
            txn.producer = await self.start()
        except (KafkaError, ProducerFencedError) as exc:
            log.warning("a new producer cannot start yet (%r); trying again", exc)
            await asyncio.sleep(PRODUCER_RETRY_S)
            return False
        self.wanted = False
        log.info("a new producer started with transactional id %s", self.transactional_id)
        return True

"""Where the ingress writes webhooks: a small protocol and its Kafka implementation.

The HTTP handlers only know :class:`Sink` (a partition count, ``send`` and ``ready``), so
unit tests swap in a fake that crosses nothing. :class:`KafkaSink` is an idempotent
``acks=all`` producer whose every await against the broker is bounded by a timeout; a
producer whose sender task has died (aiokafka stops it on fatal sequence errors) is
replaced, so one bad moment never leaves every later request hanging.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError, RecordTooLargeError

from pipeline.errors import BodyError, BrokerUnavailableError, ConfigError
from pipeline.kafka import internals
from pipeline.kafka.admin import require_topic

log = logging.getLogger(__name__)

#: Room for record headers on top of the largest body (the producer's request size limit).
HEADER_ALLOWANCE = 256 * 1024


class RecordTooLargeForBrokerError(BodyError):
    """The record is larger than the producer or broker accepts."""

    reason = "too-large"


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    """One input-topic record as the contract gives it."""

    key: bytes
    value: bytes
    headers: Sequence[tuple[str, bytes]]
    partition: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Produced:
    """Where the broker stored a record."""

    partition: int
    offset: int


class Sink(Protocol):
    """What the HTTP handlers need from the broker side."""

    @property
    def partitions(self) -> int:
        """The input topic's partition count (keys are placed with murmur2 over it)."""
        ...

    async def send(self, record: OutgoingRecord) -> Produced:
        """Write ``record`` and return once the broker acknowledged it.

        Raises BrokerUnavailableError when the broker cannot take it (retry later) and
        RecordTooLargeForBrokerError when it never will. Callers bound it with a timeout.
        """
        ...

    async def ready(self) -> bool:
        """Whether the broker answered recently (cheap, cached)."""
        ...


class KafkaSink:
    """An idempotent producer to the input topic, with bounded waits and self-repair."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        timeout: float = 5.0,
        max_record_bytes: int = 1024 * 1024,
        ready_ttl: float = 2.0,
        client_id: str = "pipeline-ingress",
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.timeout = timeout
        self.max_request_size = max_record_bytes + HEADER_ALLOWANCE
        self.ready_ttl = ready_ttl
        self.client_id = client_id
        self._producer: AIOKafkaProducer | None = None
        self._partitions = 0
        self._last_ok = float("-inf")  # monotonic time of the last broker answer
        self._ready_lock = asyncio.Lock()
        self._restart: asyncio.Task[None] | None = None

    @property
    def partitions(self) -> int:
        """The input topic's partition count, learned at :meth:`start`."""
        return self._partitions

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=self.client_id,
            enable_idempotence=True,
            acks="all",
            linger_ms=0,
            max_request_size=self.max_request_size,
            request_timeout_ms=30_000,
            retry_backoff_ms=100,
            metadata_max_age_ms=30_000,
        )

    async def start(self, *, timeout: float = 30.0) -> None:
        """Connect, and learn the input topic's partition count (ConfigError when it is missing)."""
        # asked first: the producer's metadata cannot tell a missing topic from one being created
        await require_topic(self.bootstrap, self.topic, timeout=min(timeout, 10.0))
        producer = self._new_producer()
        try:
            await asyncio.wait_for(producer.start(), timeout)
        except (TimeoutError, KafkaError, OSError) as exc:
            await _close(producer, self.timeout)
            detail = str(exc) or type(exc).__name__
            raise BrokerUnavailableError(f"cannot reach Kafka at {self.bootstrap}: {detail}") from None
        try:
            self._partitions = await self._topic_partitions(producer, timeout)
        except BaseException:
            await _close(producer, self.timeout)
            raise
        self._producer = producer
        self._last_ok = time.monotonic()
        log.info("ingress producer started: topic %s has %s partitions", self.topic, self._partitions)

    async def _topic_partitions(self, producer: AIOKafkaProducer, timeout: float) -> int:
        client: Any = producer.client
        client.add_topic(self.topic)
        deadline = time.monotonic() + min(timeout, 10.0)
        while True:
            try:
                await asyncio.wait_for(client.force_metadata_update(), self.timeout)
            except TimeoutError:
                raise BrokerUnavailableError(f"Kafka at {self.bootstrap} sent no metadata in time") from None
            parts = client.cluster.partitions_for_topic(self.topic)
            if parts:
                return len(parts)
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"input topic {self.topic} does not exist: run 'pipeline topics create' first"
                )
            await asyncio.sleep(0.2)

    async def stop(self) -> None:
        """Flush what is pending (bounded by the timeout) and close."""
        if self._restart is not None:
            self._restart.cancel()
            await asyncio.gather(self._restart, return_exceptions=True)
            self._restart = None
        producer, self._producer = self._producer, None
        if producer is not None:
            await _close(producer, self.timeout)
            log.info("ingress producer stopped")

    async def send(self, record: OutgoingRecord) -> Produced:
        """See :meth:`Sink.send`."""
        producer = self._producer
        if producer is None:
            raise BrokerUnavailableError("the ingress producer is not running")
        try:
            future = await producer.send(
                self.topic,
                record.value,
                key=record.key,
                partition=record.partition,
                timestamp_ms=record.timestamp_ms,
                headers=list(record.headers),
            )
            # The record's own future (aiokafka resolves each record's separately and skips a
            # cancelled one), so a request that times out cancels nothing shared: no shield.
            metadata = await future
        except (MessageSizeTooLargeError, RecordTooLargeError) as exc:
            raise RecordTooLargeForBrokerError(f"the record is too large for Kafka: {exc}") from None
        except KafkaError as exc:
            self.check_health()
            raise BrokerUnavailableError(f"Kafka did not take the record: {exc!r}") from None
        except asyncio.CancelledError:
            self.check_health()
            raise
        self._last_ok = time.monotonic()
        return Produced(partition=int(metadata.partition), offset=int(metadata.offset))

    async def ready(self) -> bool:
        """See :meth:`Sink.ready`: an ack or metadata answer within ``ready_ttl`` seconds."""
        if self._producer is None or self._sender_dead(self._producer):
            self.check_health()
            return False
        if time.monotonic() - self._last_ok < self.ready_ttl:
            return True
        async with self._ready_lock:
            if time.monotonic() - self._last_ok < self.ready_ttl:
                return True
            producer = self._producer
            if producer is None:
                return False
            try:
                updated = await asyncio.wait_for(
                    producer.client.force_metadata_update(), min(self.timeout, 2.0)
                )
            except (TimeoutError, KafkaError, OSError):
                return False
            if updated:
                self._last_ok = time.monotonic()
            return bool(updated)

    def check_health(self) -> None:
        """Replace the producer in the background when its sender task has died."""
        producer = self._producer
        if producer is None or not self._sender_dead(producer):
            return
        if self._restart is None or self._restart.done():
            log.error("ingress producer's sender stopped; starting a new producer")
            self._restart = asyncio.get_running_loop().create_task(self._replace(producer))

    @staticmethod
    def _sender_dead(producer: AIOKafkaProducer) -> bool:
        return internals.sender_dead(producer)

    async def _replace(self, old: AIOKafkaProducer) -> None:
        new = self._new_producer()
        try:
            await asyncio.wait_for(new.start(), self.timeout)
        except (TimeoutError, KafkaError, OSError) as exc:
            log.warning("could not start a new ingress producer yet: %r", exc)
            await _close(new, self.timeout)
            return
        self._producer = new
        self._last_ok = time.monotonic()
        await _close(old, self.timeout)
        log.info("ingress producer replaced")


async def _close(producer: AIOKafkaProducer, timeout: float) -> None:
    try:
        await asyncio.wait_for(producer.stop(), timeout)
    except (TimeoutError, KafkaError, OSError) as exc:
        log.warning("ingress producer did not stop cleanly: %r", exc)

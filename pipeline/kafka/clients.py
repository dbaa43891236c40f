"""The Kafka clients of the restore service and of the operator tools, with their settings."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

from pipeline.errors import BrokerUnavailableError

RESTORE_CLIENT_ID = "pipeline-restore"
STANDBY_CLIENT_ID = "pipeline-standby"


RESTORE_PARTITION_BYTES = 16 * 1024 * 1024  # the most a restore or standby fetch takes of one partition


def restore_partition_bytes(fetch_bytes: int) -> int:
    """What one changelog partition may take of a restore fetch of ``fetch_bytes``."""
    return min(fetch_bytes, RESTORE_PARTITION_BYTES)


def restore_consumer(
    bootstrap: str, *, fetch_bytes: int, client_id: str = RESTORE_CLIENT_ID
) -> AIOKafkaConsumer:
    """A group-less read_committed consumer for replaying changelogs (``client_id`` names it to the
    broker: a restore's, or the standbys')."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=restore_partition_bytes(fetch_bytes),
        fetch_max_bytes=fetch_bytes,
    )


async def started_reader(bootstrap: str, *, from_beginning: bool = True) -> AIOKafkaConsumer:
    """A started group-less read_committed consumer for the tools (tail, inspect, dlq); assign it yourself.

    Raises :class:`BrokerUnavailableError` when the broker cannot be reached.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
    )
    try:
        await consumer.start()
    except KafkaError as exc:
        await consumer.stop()
        raise BrokerUnavailableError(f"cannot reach Kafka at {bootstrap}: {exc}") from None
    await asyncio.sleep(0)  # let aiokafka's coordinator task start, or stop() raises CancelledError
    return consumer


async def started_producer(bootstrap: str) -> AIOKafkaProducer:
    """A started idempotent ``acks=all`` producer for the tools (produce, dlq replay).

    Raises :class:`BrokerUnavailableError` when the broker cannot be reached.
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=10
    )
    try:
        await producer.start()
    except KafkaError as exc:
        await producer.stop()
        raise BrokerUnavailableError(f"cannot reach Kafka at {bootstrap}: {exc}") from None
    return producer

"""Every Kafka client the worker makes, with its settings, in one place."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import KafkaError

from pipeline.errors import BrokerUnavailableError
from pipeline.kafka import internals
from pipeline.kafka.settings import MAX_MESSAGE_BYTES
from pipeline.worker.settings import WorkerSettings

#: How long aiokafka waits before it asks again to add a partition to a transaction while the
#: previous transaction's markers are still being written (CONCURRENT_TRANSACTIONS). Its own
#: 20 ms is the largest part of a commit's tail when partitions commit as soon as they are caught
#: up; the markers of a local commit take a few ms.
CONCURRENT_TXN_RETRY_S = 0.005


def worker_consumer(settings: WorkerSettings, *, assignor: Any = None) -> AIOKafkaConsumer:
    """The worker's group consumer: read_committed, no auto-commit (offsets go into transactions);
    ``assignor`` is its partition assignor (aiokafka's round-robin when None)."""
    strategy = (assignor,) if assignor is not None else (RoundRobinPartitionAssignor,)
    return AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap,
        group_id=settings.group,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_poll_records=settings.fetch_records,
        fetch_max_bytes=settings.fetch_max_bytes,
        max_partition_fetch_bytes=settings.max_partition_fetch_bytes,
        check_crcs=settings.check_crcs,
        session_timeout_ms=settings.session_timeout_ms,
        group_instance_id=settings.instance_id,
        heartbeat_interval_ms=max(settings.session_timeout_ms // 5, 300),
        client_id=f"pipeline-worker-{settings.group}",
        partition_assignment_strategy=strategy,
    )


def worker_transactional_id(settings: WorkerSettings, app: str) -> str:
    """The transactional id of one worker instance: stable across its restarts, so that its next start
    aborts what its last one left open, and unique among live workers (its static member id, or this
    host's name and the worker's own state dir, which no two live workers on one host share)."""
    instance = settings.instance_id
    if instance is None:
        where = f"{socket.gethostname()}:{settings.state_dir.resolve()}"
        instance = hashlib.sha256(where.encode()).hexdigest()[:16]
    group = settings.for_topology(app).group
    return f"{app}-{group}-worker-{instance}"


def legacy_transactional_id(app: str, group: str, topic: str, partition: int) -> str:
    """The transactional id workers before eos-v2 gave each partition's producer: a worker taking the
    partition over fences it (a rolling upgrade), so an older worker's open transaction is aborted."""
    return f"{app}-{group}-{topic}-{partition}"


def transactional_producer(settings: WorkerSettings, transactional_id: str) -> AIOKafkaProducer:
    """The worker's one producer; starting it fences any older producer with the same id."""
    internals.shorten_concurrent_transactions_wait(CONCURRENT_TXN_RETRY_S)
    return AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap,
        transactional_id=transactional_id,
        acks="all",
        enable_idempotence=True,
        max_batch_size=MAX_MESSAGE_BYTES,
        max_request_size=MAX_MESSAGE_BYTES,
        linger_ms=settings.linger_ms,
        transaction_timeout_ms=int(settings.transaction_timeout * 1000),
        client_id=transactional_id,
    )


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

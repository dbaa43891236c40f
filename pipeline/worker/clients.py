"""The worker's own Kafka clients, with their settings: its group consumer and its one transactional
producer, and the transactional ids they go by."""

from __future__ import annotations

import hashlib
import socket
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

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
    if settings.instance_id is not None:  # a twin under the same id is then named, not "UnknownError()"
        internals.know_fenced_instance_id()
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
    internals.know_invalid_record()  # a keyless record on a compacted topic is named, not "UnknownError()"
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

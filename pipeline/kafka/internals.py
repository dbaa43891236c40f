"""The one door to aiokafka's private parts: every use of a name aiokafka does not publish.

Each of these relies on how aiokafka 0.14 works inside, and each has a test in
``tests/unit/kafka/test_internals.py`` that fails if that changes (the project pins
aiokafka below 0.15). Nothing else in ``pipeline/`` touches a private aiokafka name;
ruff's private-member rule keeps it that way.

- :func:`shorten_concurrent_transactions_wait`: the module-level wait of aiokafka's
  sender before it asks again to add a partition to a transaction.
- :func:`sender_failure`: why a producer's background sender stopped (a producer whose
  sender stopped can send nothing more: aiokafka's transaction state machine then
  answers ``begin`` and ``abort`` with ``AssertionError``, which :data:`DEAD_PRODUCER_ERRORS`
  names for the callers that must catch it).
- :func:`abort_would_be_local`: whether aiokafka forgot what its open transaction
  holds (it does after an authorization error) and would "abort" it without telling
  the broker, which would then commit those records with the next transaction.
- :func:`stop_consumer`: stop a consumer whose fetcher lets a ``CancelledError`` out.
- :func:`request_rejoin`: make the group consumer rejoin its group at once.
- :func:`read_committed_before_start`: make a consumer faust's driver made read committed records only.
- :func:`generation_current`: ask the group coordinator whether this consumer is
  still a member of its current generation (a Heartbeat of its own), before a
  producer start that would fence whoever the group assigns the partition to now.
- :func:`fetch_raw`: one raw fetch of a partition through a consumer's connections,
  the records left undecoded (the restore's fast path).
- :func:`batch_builder`: a record batch capped at a topic's own size limit.
- :func:`admin_request` and :func:`cluster_ids`: requests aiokafka's admin client has no
  call for, among them Metadata v12 (:mod:`pipeline.kafka.requests`) for the cluster id and
  the topic ids, which aiokafka's own request (v5 at most) does not carry.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import IllegalOperation, KafkaError, NotLeaderForPartitionError, for_code
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.producer.transaction_manager import TransactionState
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.group import HeartbeatRequest
from aiokafka.record.memory_records import MemoryRecords

from pipeline.kafka.requests import MetadataRequest

READ_COMMITTED = 1
#: What a transactional producer's calls raise once its sender has died: the transaction manager's state
#: machine asserts its transitions (``AssertionError``), and a send outside a transaction is refused
#: (``IllegalOperation``). Catch these only around a producer call, meaning "this producer is done".
DEAD_PRODUCER_ERRORS: tuple[type[Exception], ...] = (AssertionError, IllegalOperation)
FETCH_WAIT_MS = 200


def shorten_concurrent_transactions_wait(seconds: float) -> None:
    """Set how long aiokafka's sender waits before it asks again to add a partition to a
    transaction while the previous transaction's markers are still being written
    (CONCURRENT_TRANSACTIONS): ``aiokafka.producer.sender.BACKOFF_OVERRIDE``, 20 ms by default."""
    aiokafka_sender.BACKOFF_OVERRIDE = seconds


def sender_task(producer: AIOKafkaProducer) -> asyncio.Task[Any] | None:
    """The producer's background sender task (None before start)."""
    sender: Any = getattr(producer, "_sender", None)
    task = getattr(sender, "sender_task", None)
    return task if isinstance(task, asyncio.Task) else None


def sender_failure(producer: AIOKafkaProducer) -> BaseException | None:
    """What the producer's sender died of, or None while it runs (or stopped cleanly)."""
    task = sender_task(producer)
    if task is None or not task.done() or task.cancelled():
        return None
    return task.exception()


def sender_dead(producer: AIOKafkaProducer) -> bool:
    """Whether the producer's sender task has ended (the producer can send nothing more)."""
    task = sender_task(producer)
    return task is not None and task.done()


def abort_would_be_local(producer: AIOKafkaProducer) -> bool:
    """Whether aiokafka would end its open transaction without an EndTxn to the broker.

    After an abortable error (an authorization failure on a partition or the group),
    aiokafka's transaction manager clears the partitions and the group it added, then
    treats the transaction as empty: ``abort_transaction`` completes locally and the
    broker's transaction stays open with the records already sent, which the next
    commit of the same producer would commit. Such a producer must be replaced
    (starting a new one with the transactional id aborts the broker's transaction).
    """
    manager: Any = getattr(producer, "_txn_manager", None)
    if manager is None:
        return False
    return bool(manager.state == TransactionState.ABORTABLE_ERROR and manager.is_empty_transaction())


async def stop_consumer(consumer: AIOKafkaConsumer) -> None:
    """Stop ``consumer``, even when aiokafka's fetcher raises ``CancelledError`` out of ``stop()``.

    aiokafka's ``Fetcher.close`` cancels its pending fetch tasks and awaits them; one that
    is sleeping its retry backoff after a failed fetch (the broker is away) lets that
    ``CancelledError`` out, and ``consumer.stop()`` raises it although nobody cancelled the
    caller. The consumer is closed by then; only a cancellation of the caller itself goes on.
    """
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise


def read_committed_before_start(consumer: AIOKafkaConsumer) -> bool:
    """Make a consumer made by someone else (faust's driver) read committed records only; it must not be
    started yet (its fetcher takes the isolation level at start). False when aiokafka has no such field."""
    if getattr(consumer, "_isolation_level", None) is None:
        return False
    consumer._isolation_level = "read_committed"
    return True


def request_rejoin(consumer: AIOKafkaConsumer) -> None:
    """Make the group consumer rejoin its group (a new generation: every member's
    partitions are revoked and assigned again), as Kafka Streams does on a fenced task."""
    coordinator: Any = getattr(consumer, "_coordinator", None)
    if coordinator is not None:
        coordinator.request_rejoin()


async def generation_current(consumer: AIOKafkaConsumer) -> bool | None:
    """Whether the group coordinator still counts ``consumer`` a member of its current generation.

    A Heartbeat with the coordinator's own generation and member id: True when it is
    answered without error; False when the member is unknown, the generation is over
    or a rebalance is under way (the consumer is then asked to rejoin); None when the
    coordinator is unknown or the request fails (nothing confirmed). A worker that was
    dropped from its group while the broker was away learns it here, before a producer
    start of its would fence the partition's new assignee.
    """
    coordinator: Any = getattr(consumer, "_coordinator", None)
    if coordinator is None or coordinator.coordinator_id is None:
        return None
    request = HeartbeatRequest(coordinator.group_id, coordinator.generation, coordinator.member_id)
    try:
        response = await coordinator._send_req(request)
    except KafkaError:
        return None
    if response.error_code != 0:
        coordinator.request_rejoin()
        return False
    return True


@dataclass(frozen=True, slots=True)
class RawFetch:
    """One partition's answer to a raw fetch."""

    records: MemoryRecords | None  # None: nothing at this position
    aborted: list[tuple[int, int]]  # (producer id, first offset) of aborted transactions, oldest first
    error: type[Exception] | None  # the partition's error class, if any


async def fetch_raw(
    consumer: AIOKafkaConsumer, tp: TopicPartition, position: int, *, fetch_bytes: int, partition_bytes: int
) -> RawFetch:
    """Fetch ``tp`` from ``position`` (read_committed) through ``consumer``'s own connections.

    The consumer is never assigned ``tp``: its fetcher stays idle, and the record
    batches come back as bytes for aiokafka's C reader, not as ``ConsumerRecord`` objects.
    """
    client: Any = consumer._client
    leader = client.cluster.leader_for_partition(tp)
    if leader is None or leader == -1:
        await client.add_topic(tp.topic)
        leader = client.cluster.leader_for_partition(tp)
        if leader is None or leader == -1:
            raise NotLeaderForPartitionError(f"no leader for {tp}")
    request = FetchRequest(
        FETCH_WAIT_MS,
        1,
        fetch_bytes,
        READ_COMMITTED,
        [(tp.topic, [(tp.partition, position, partition_bytes)])],
    )
    response = await client.send(leader, request)
    for _topic, partitions in response.topics:
        for partition, error_code, _highwater, *data in partitions:
            if partition != tp.partition:
                continue
            if error_code != 0:
                return RawFetch(None, [], for_code(error_code))
            # v4-v10: [lso, (log_start,) aborted, records]; v11: [lso, log_start, aborted, replica, records]
            aborted = data[2] if response.API_VERSION >= 11 else data[-2]
            return RawFetch(MemoryRecords(data[-1]), sorted(aborted or [], key=lambda pair: pair[1]), None)
    return RawFetch(None, [], None)


async def force_metadata_update(consumer: AIOKafkaConsumer) -> None:
    """Refresh the consumer's cluster metadata (after a fetch failed: the leader may have moved)."""
    client: Any = consumer._client
    await client.force_metadata_update()


# -- Metadata v12: the cluster id and topic ids -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterIds:
    """The cluster's id and the id of each topic asked for that exists (a topic deleted and created
    again under its name has a new id)."""

    cluster: str
    topics: dict[str, str]


async def cluster_ids(admin: Any, topics: list[str]) -> ClusterIds:
    """Ask the broker, over an open admin client, for the cluster id and the ids of ``topics``."""
    response: Any = await admin_request(admin, MetadataRequest(topics))
    found = {name: str(topic_id) for error, name, topic_id, *_ in response.topics if error == 0}
    return ClusterIds(str(response.cluster_id or ""), found)


async def admin_request(admin: Any, request: Any) -> Any:
    """Send a request aiokafka's admin client has no call for, as its own calls send theirs."""
    return await admin._send_request(request)


def batch_builder(size: int) -> BatchBuilder:
    """An empty transactional record batch of at most ``size`` bytes (``producer.create_batch()``
    has only the producer's one ``max_batch_size``; a topic's ``max.message.bytes`` may be smaller)."""
    return BatchBuilder(size, 0, is_transactional=True, key_serializer=None, value_serializer=None)

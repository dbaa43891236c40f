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
- :func:`log_end`: a partition's log end (its high watermark) through a read_committed
  consumer's connections, which aiokafka's ``end_offsets`` gives only as the last stable
  offset: a new owner restores until the transactions open there have ended.
- :func:`batch_builder`: a record batch capped at a topic's own size limit.
- :func:`admin_request` and :func:`cluster_ids`: requests aiokafka's admin client has no
  call for, among them Metadata v12 (:mod:`pipeline.kafka.requests`) for the cluster id and
  the topic ids, which aiokafka's own request (v5 at most) does not carry.
- :func:`group_metadata` and :func:`send_offsets_with_group_metadata` (eos-v2, KIP-447): a
  transaction's offsets sent as TxnOffsetCommit v3 with the consumer's generation, member id
  and group instance id, through one producer's own sender (aiokafka sends v0, which the
  group coordinator cannot check); a refusal leaves the transaction abortable on the broker.
- :func:`group_request` and :func:`group_coordinator_moved`: a request of our own to a
  consumer's group coordinator (OffsetFetch v7 with ``require_stable``:
  :mod:`pipeline.kafka.stable_offsets`).
- :func:`kafka_client`: the ``AIOKafkaClient`` under a consumer or an admin client (fencing a
  transactional id without a producer: :mod:`pipeline.kafka.fencing`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.client import CoordinationType
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    GroupLoadInProgressError,
    IllegalOperation,
    InvalidProducerEpoch,
    KafkaError,
    NotLeaderForPartitionError,
    ProducerFenced,
    TransactionalIdAuthorizationFailed,
    UnknownTopicOrPartitionError,
    for_code,
)
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.producer.transaction_manager import TransactionState
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.group import HeartbeatRequest
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.util import commit_structure_validate

from pipeline.errors import GroupGenerationFencedError, PipelineError
from pipeline.kafka.requests import (
    COORDINATOR_MOVED,
    GROUP_FENCED,
    PRODUCER_FENCED,
    GroupMetadata,
    MetadataRequest,
    TxnOffsetCommitRequest,
)

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
    leader = await _leader(client, tp)
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


LATEST = -1
READ_UNCOMMITTED = 0
METADATA_TRIES = 3


async def _leader(client: Any, tp: TopicPartition) -> int:
    """``tp``'s leader in ``client``'s metadata, asked for when unknown: the topic is tracked from now on, and
    a metadata update already under way (begun without it) is followed by one more."""
    for _ in range(METADATA_TRIES):
        leader = client.cluster.leader_for_partition(tp)
        if leader is not None and leader != -1:
            return int(leader)
        if tp.topic in client._topics:
            await client.force_metadata_update()
        else:
            await client.add_topic(tp.topic)
    raise NotLeaderForPartitionError(f"no leader for {tp}")


async def log_end(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int:
    """``tp``'s high watermark (ListOffsets, latest, read_uncommitted) through ``consumer``'s connections:
    records of transactions still open count, unlike in the consumer's own ``end_offsets``."""
    client: Any = consumer._client
    leader = await _leader(client, tp)
    response = await client.send(
        leader, OffsetRequest(-1, READ_UNCOMMITTED, [(tp.topic, [(tp.partition, LATEST)])])
    )
    for _topic, partitions in response.topics:
        for partition, error_code, _timestamp, offset, *_ in partitions:
            if partition == tp.partition:
                if error_code != 0:
                    raise for_code(error_code)(f"list offsets of {tp}")
                return int(offset)
    raise NotLeaderForPartitionError(f"no offset for {tp} in the answer")


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


# -- eos-v2 (KIP-447): a transaction's offsets with the group's generation --------------------------


def group_metadata(consumer: AIOKafkaConsumer) -> GroupMetadata:
    """The group of a started group consumer, and the generation, member id and group instance id its
    coordinator holds now. Before the consumer joined, and once the coordinator forgot its membership,
    the generation is -1 and the member id empty (:func:`send_offsets_with_group_metadata` refuses those)."""
    coordinator = _group_coordinator(consumer)
    return GroupMetadata(
        coordinator.group_id, coordinator.generation, coordinator.member_id, coordinator._group_instance_id
    )


def _group_coordinator(consumer: AIOKafkaConsumer) -> Any:
    coordinator: Any = getattr(consumer, "_coordinator", None)
    if getattr(coordinator, "generation", None) is None:
        raise PipelineError("the consumer has no group coordinator (no group id, or not started)")
    return coordinator


class _GroupOffsets(dict[TopicPartition, Any]):
    """Offsets queued in aiokafka's transaction manager, with the group metadata to commit them with."""

    def __init__(self, offsets: dict[TopicPartition, Any], metadata: GroupMetadata) -> None:
        super().__init__(offsets)
        self.metadata = metadata


async def send_offsets_with_group_metadata(
    producer: AIOKafkaProducer, offsets: Mapping[TopicPartition, int], metadata: GroupMetadata
) -> None:
    """Add ``offsets`` (the next offset to read, per partition) to ``producer``'s open transaction, sent as
    TxnOffsetCommit v3 with ``metadata``'s generation, member id and group instance id (KIP-447).

    ``producer.send_offsets_to_transaction`` stays aiokafka's (v0), and other producers are untouched: only
    this producer's sender learns v3, for offsets sent through here. The answers:

    - the group coordinator refuses them for the group metadata (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
      FENCED_INSTANCE_ID), or ``metadata`` has no generation: :class:`GroupGenerationFencedError`; also
      GROUP_AUTHORIZATION_FAILED: ``GroupAuthorizationFailedError``. The transaction is then in
      ABORTABLE_ERROR, holding what it held: ``commit_transaction`` raises the same error, a send raises
      ``IllegalOperation``, and ``abort_transaction`` aborts it on the broker (the producer stays usable);
    - INVALID_PRODUCER_EPOCH or PRODUCER_FENCED: ``ProducerFenced`` (the sender dies, as for aiokafka's own);
    - the coordinator moved, loading or timed out: the sender asks again until it is answered.
    """
    manager: Any = producer._txn_manager
    if manager is None or manager.transactional_id is None:
        raise IllegalOperation("You need to configure transaction_id to use transactions")
    if not manager.is_in_transaction():
        raise IllegalOperation("Not in the middle of a transaction")
    if metadata.generation_id < 0 or not metadata.member_id:
        fenced = GroupGenerationFencedError(
            f"no offsets committed for group {metadata.group_id}: the consumer is in no generation "
            f"(generation {metadata.generation_id}, member id {metadata.member_id!r}); it must rejoin"
        )
        _fail_abortable(manager, fenced)
        raise fenced
    sender: Any = producer._sender
    if not isinstance(vars(sender).get("_do_txn_offset_commit"), _GroupOffsetCommit):
        sender._do_txn_offset_commit = _GroupOffsetCommit(sender, sender._do_txn_offset_commit)
    queued = _GroupOffsets(commit_structure_validate(dict(offsets)), metadata)
    await asyncio.shield(manager.add_offsets_to_txn(queued, metadata.group_id))


def _fail_abortable(manager: Any, exc: Exception) -> None:
    """Java's ``TransactionManager.abortableError``: the transaction goes to ABORTABLE_ERROR, its pending
    offsets and its end fail with ``exc``, and what it holds is kept, so that ``abort_transaction`` ends it on
    the broker (aiokafka's ``error_transaction`` forgets it: see :func:`abort_would_be_local`). An abort under
    way goes on."""
    if manager.state in (TransactionState.IN_TRANSACTION, TransactionState.COMMITTING_TRANSACTION):
        manager._transition_to(TransactionState.ABORTABLE_ERROR)
        waiter = manager._transaction_waiter
        if not waiter.done():
            waiter.set_exception(exc)
            waiter.exception()  # marked read: an abort replaces the waiter without reading it
    for _group, _offsets, future in manager._pending_txn_offsets:
        if not future.done():
            future.set_exception(exc)
    manager._pending_txn_offsets.clear()


class _GroupOffsetCommit:
    """One sender's ``_do_txn_offset_commit``: offsets queued with group metadata go as TxnOffsetCommit
    v3, any others as aiokafka sends them."""

    def __init__(self, sender: Any, plain: Callable[[Any, str], Awaitable[Any]]) -> None:
        self._sender = sender
        self._plain = plain

    async def __call__(self, offsets: Any, group_id: str) -> Any:
        if not isinstance(offsets, _GroupOffsets):
            return await self._plain(offsets, group_id)
        if not offsets:
            return None
        try:  # to the group's coordinator, as aiokafka's own
            node_id = await self._sender._find_coordinator(CoordinationType.GROUP, group_id)
        except GroupAuthorizationFailedError as exc:
            _fail_abortable(self._sender._txn_manager, exc)
            return None
        return await _TxnOffsetCommitV3Handler(self._sender, offsets, group_id).do(node_id)


class _TxnOffsetCommitV3Handler(aiokafka_sender.TxnOffsetCommitHandler):  # type: ignore[misc]  # untyped
    """aiokafka's handler, sending v3 and reading its answer as Java's ``TxnOffsetCommitHandler`` does."""

    def create_request(self) -> TxnOffsetCommitRequest:
        manager = self._sender._txn_manager
        offsets = {tp: (value.offset, value.metadata) for tp, value in self._offsets.items()}
        return TxnOffsetCommitRequest(
            manager.transactional_id,
            manager.producer_id,
            manager.producer_epoch,
            self._offsets.metadata,
            offsets,
        )

    def handle_response(self, resp: Any) -> float | None:
        """None when done (committed, or the transaction failed as abortable); else the backoff before
        the sender sends the offsets not yet committed again."""
        manager = self._sender._txn_manager
        for topic, partitions, _tags in resp.topics:
            for partition, code, _ in partitions:
                tp = TopicPartition(topic, partition)
                if code == 0:
                    manager.offset_committed(tp, self._offsets[tp].offset, self._group_id)
                elif code in GROUP_FENCED:
                    metadata: GroupMetadata = self._offsets.metadata
                    refused = GroupGenerationFencedError(
                        f"the coordinator of group {self._group_id} refused the transaction's offsets (error {code}): "
                        f"generation {metadata.generation_id}, member {metadata.member_id} is not the current one"
                    )
                    _fail_abortable(manager, refused)
                    return None
                elif code == GroupAuthorizationFailedError.errno:
                    _fail_abortable(manager, GroupAuthorizationFailedError(self._group_id))
                    return None
                elif code in COORDINATOR_MOVED or code in (
                    GroupLoadInProgressError.errno,
                    UnknownTopicOrPartitionError.errno,
                ):
                    if code in COORDINATOR_MOVED:
                        self._sender._coordinator_dead(CoordinationType.GROUP)
                    return float(self._default_backoff)
                elif code in (InvalidProducerEpoch.errno, PRODUCER_FENCED):
                    raise ProducerFenced
                elif code == TransactionalIdAuthorizationFailed.errno:
                    raise TransactionalIdAuthorizationFailed(manager.transactional_id)
                else:
                    raise for_code(code)()
        return None


# -- the group coordinator and the client of any aiokafka client ------------------------------------


async def group_request(consumer: AIOKafkaConsumer, request: Any) -> Any:
    """Send ``request`` to the consumer's group coordinator (found first, as the consumer's own requests
    are); a failure to send marks the coordinator unknown, and so does :func:`group_coordinator_moved`."""
    coordinator = _group_coordinator(consumer)
    await coordinator.ensure_coordinator_known()
    return await coordinator._send_req(request)


def group_coordinator_moved(consumer: AIOKafkaConsumer) -> None:
    """The coordinator answered that the group is not its own (or not yet): find it again."""
    _group_coordinator(consumer).coordinator_dead()


def kafka_client(client: AIOKafkaClient | AIOKafkaProducer | AIOKafkaConsumer | Any) -> AIOKafkaClient:
    """The ``AIOKafkaClient`` (connections, coordinators) of a producer, a consumer or an admin client."""
    if isinstance(client, AIOKafkaClient):
        return client
    if isinstance(client, AIOKafkaProducer):
        return client.client
    found = getattr(client, "_client", None)
    if not isinstance(found, AIOKafkaClient):
        raise PipelineError(f"{type(client).__name__} has no Kafka client")
    return found

"""eos-v2 (KIP-447): a transaction's offsets sent as TxnOffsetCommit v3 with the group's generation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.client import CoordinationType
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    GroupLoadInProgressError,
    IllegalOperation,
    InvalidProducerEpoch,
    ProducerFenced,
    TransactionalIdAuthorizationFailed,
    UnknownTopicOrPartitionError,
    for_code,
)
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.producer.transaction_manager import TransactionState
from aiokafka.util import commit_structure_validate

from pipeline.errors import GroupGenerationFencedError
from pipeline.kafka.requests import (
    COORDINATOR_MOVED,
    GROUP_FENCED,
    PRODUCER_FENCED,
    GroupMetadata,
    TxnOffsetCommitRequest,
)


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

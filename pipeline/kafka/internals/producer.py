"""aiokafka's producer inside: its sender, its transaction manager's state, a batch of a given size."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka import errors as aiokafka_errors
from aiokafka.errors import BrokerResponseError, IllegalOperation
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.producer.transaction_manager import TransactionState

#: What a transactional producer's calls raise once its sender has died: the transaction manager's state
#: machine asserts its transitions (``AssertionError``), and a send outside a transaction is refused
#: (``IllegalOperation``). Catch these only around a producer call, meaning "this producer is done".
DEAD_PRODUCER_ERRORS: tuple[type[Exception], ...] = (AssertionError, IllegalOperation)


class InvalidRecordError(BrokerResponseError):  # type: ignore[misc]  # aiokafka.errors is untyped
    """INVALID_RECORD (KIP-467), which aiokafka 0.14 does not know: the broker refused a record it
    validates, most often one without a key on a compacted topic. It refuses that record every time."""

    errno = 87
    message = "INVALID_RECORD"
    description = "the broker refused a record as invalid (a record without a key on a compacted topic?)"

    def __repr__(self) -> str:
        return f"InvalidRecordError({self.description!r})"


def know_invalid_record() -> None:
    """Teach aiokafka's error table INVALID_RECORD: its sender fails a batch the broker refused with a
    code it does not know with ``UnknownError()``, which names neither the record nor the cause."""
    aiokafka_errors.kafka_errors.setdefault(InvalidRecordError.errno, InvalidRecordError)


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


def batch_builder(size: int) -> BatchBuilder:
    """An empty transactional record batch of at most ``size`` bytes (``producer.create_batch()``
    has only the producer's one ``max_batch_size``; a topic's ``max.message.bytes`` may be smaller)."""
    return BatchBuilder(size, 0, is_transactional=True, key_serializer=None, value_serializer=None)

"""The worker's transactional producer, with aiokafka's failure modes turned into three answers.

aiokafka reports the same condition in several shapes: a fence is a ``ProducerFenced``
from a send's future, from ``commit_transaction`` or from ``abort_transaction``; once its
background sender has died of one, ``begin`` and ``abort`` raise ``AssertionError`` and
``send_batch`` raises ``IllegalOperation``. After an authorization error, its "abort"
never reaches the broker. Every call here answers in one of three ways instead:

- :class:`~pipeline.errors.ProducerFencedError`: another producer took the
  transactional id (a newer owner, or the broker aborted a transaction that stayed
  open past its timeout): stop using this producer, never start another here until
  the group assigns the partition again;
- :class:`~pipeline.errors.ProducerUnusableError`: the producer cannot continue (its
  sender died of something else, or it would not really abort): close it and start
  a new one, which aborts whatever the broker still holds open;
- any other ``KafkaError``: the broker refused this transaction (a record it will not
  take, a timeout, the broker down); abort it and try again. After the broker refused
  a batch outright, the producer's sequence numbers for that partition no longer line
  up with the broker's (aiokafka counts the refused batch; the broker never wrote it):
  every later batch there would be refused as out of order, so :attr:`needs_replacing`
  says to start a new producer (a new epoch starts the sequences again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import IllegalOperation, KafkaError, ProducerFenced

from pipeline.errors import ProducerFencedError, ProducerUnusableError
from pipeline.kafka import internals
from pipeline.kafka.requests import GroupMetadata

log = logging.getLogger(__name__)

#: How offsets reach the transaction (TxnOffsetCommit v3 with the group's metadata, by default).
SendOffsets = Callable[[AIOKafkaProducer, Mapping[TopicPartition, int], GroupMetadata], Awaitable[None]]


class TransactionalProducer:
    """A started-once transactional producer (see the module docstring)."""

    def __init__(
        self, producer: AIOKafkaProducer, name: str, *, send_offsets: SendOffsets | None = None
    ) -> None:
        self._producer = producer
        self.name = name
        self._send_offsets = send_offsets or internals.send_offsets_with_group_metadata
        self.fenced = False
        self.needs_replacing = False  # a batch was refused outright: see the module docstring

    @property
    def client(self) -> AIOKafkaProducer:
        """The aiokafka producer underneath."""
        return self._producer

    async def start(self) -> None:
        """InitProducerId: fences any older producer with this transactional id and aborts its transaction."""
        try:
            await self._producer.start()
        except ProducerFenced as exc:  # a newer one started meanwhile
            raise self._fence(exc) from exc

    async def stop(self) -> None:
        """Stop the producer, whatever state it is in."""
        try:
            await self._producer.stop()
        except (KafkaError, *internals.DEAD_PRODUCER_ERRORS, OSError) as exc:  # a producer gone fatal
            log.warning("%s: producer did not stop cleanly: %r", self.name, exc)

    def batch(self, size: int) -> Any:
        """An empty batch of at most ``size`` bytes."""
        return internals.batch_builder(size)

    async def begin(self) -> None:
        try:
            await self._producer.begin_transaction()
        except ProducerFenced as exc:
            raise self._fence(exc) from exc
        except internals.DEAD_PRODUCER_ERRORS as exc:
            raise self._dead(exc) from exc

    async def send_batch(self, batch: Any, topic: str, partition: int) -> asyncio.Future[Any]:
        """Hand ``batch`` to the sender; the future fails as the broker answers (see :meth:`outcome`)."""
        try:
            future: asyncio.Future[Any] = await self._producer.send_batch(batch, topic, partition=partition)
        except IllegalOperation as exc:  # "not in transaction": the sender died and failed the transaction
            raise self._dead(exc) from exc
        return future

    def outcome(self, error: BaseException) -> BaseException:
        """The error to raise for a failed send: a fence becomes :class:`ProducerFencedError`."""
        if isinstance(error, ProducerFenced):
            return self._fence(error)
        if isinstance(error, KafkaError) and not error.retriable:
            self.needs_replacing = True
        return error

    async def send_offsets(self, offsets: Mapping[TopicPartition, int], group: GroupMetadata) -> None:
        """The consumer offsets into the open transaction, with the group's generation and member id
        (TxnOffsetCommit v3): a worker the group has moved on from is refused with
        :class:`~pipeline.errors.GroupGenerationFencedError`, and the transaction can then only abort."""
        await self._settle(self._send_offsets(self._producer, offsets, group))

    async def commit(self) -> None:
        await self._settle(self._producer.commit_transaction())

    async def _settle(self, call: Awaitable[None]) -> None:
        """Await a call that ends in the broker's answer about the transaction (offsets, commit)."""
        try:
            await call
        except ProducerFenced as exc:
            raise self._fence(exc) from exc
        except internals.DEAD_PRODUCER_ERRORS as exc:
            raise self._dead(exc) from exc
        except KafkaError as exc:
            self._check_abortable(exc)
            raise

    async def abort(self) -> None:
        """Abort the open transaction; raises when only a new producer can (fenced, or unusable)."""
        if internals.abort_would_be_local(self._producer):
            raise ProducerUnusableError(
                f"{self.name}: aiokafka forgot what the transaction holds (after an authorization error) "
                "and would not abort it on the broker; replacing the producer aborts it"
            )
        try:
            await self._producer.abort_transaction()
        except ProducerFenced as exc:
            raise self._fence(exc) from exc
        except (*internals.DEAD_PRODUCER_ERRORS, KafkaError) as exc:
            raise self._dead(exc) from exc

    # -- what a failure means ------------------------------------------------------------
    def _fence(self, exc: BaseException) -> ProducerFencedError:
        self.fenced = True
        return ProducerFencedError(f"{self.name}: fenced by a newer producer ({exc})")

    def _dead(self, exc: BaseException) -> ProducerFencedError | ProducerUnusableError:
        """A call the producer's state machine refused: fenced if its sender died of a fence."""
        cause = internals.sender_failure(self._producer)
        if self.fenced or isinstance(cause, ProducerFenced):
            return self._fence(cause or exc)
        return ProducerUnusableError(f"{self.name}: the producer cannot continue ({cause or exc!r})")

    def _check_abortable(self, exc: KafkaError) -> None:
        """A refused commit or offsets: raise :class:`ProducerUnusableError` if the abort to come would be local."""
        if internals.abort_would_be_local(self._producer):
            raise ProducerUnusableError(
                f"{self.name}: {exc!r}; the transaction must be aborted by a new producer"
            ) from exc

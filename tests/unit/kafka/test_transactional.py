"""Every shape in which aiokafka reports a fence or a dead producer comes out as one of two errors."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    IllegalOperation,
    InvalidTimestampError,
    KafkaTimeoutError,
    ProducerFenced,
    RequestTimedOutError,
)
from aiokafka.producer.transaction_manager import TransactionState

from pipeline.errors import ProducerFencedError, ProducerUnusableError
from pipeline.kafka.requests import GroupMetadata
from pipeline.kafka.transactional import TransactionalProducer


class Stub:
    """The calls TransactionalProducer makes, each raising what it is told to."""

    def __init__(self) -> None:
        self.raises: dict[str, BaseException] = {}
        self.calls: list[str] = []
        self._sender: Any = None
        self._txn_manager: Any = None

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.raises:
            raise self.raises[name]

    async def start(self) -> None:
        self._call("start")

    async def stop(self) -> None:
        self._call("stop")

    async def begin_transaction(self) -> None:
        self._call("begin")

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> Any:
        self._call("send")
        return asyncio.get_running_loop().create_future()

    async def send_offsets_to_transaction(self, offsets: Any, group: str) -> None:
        self._call("offsets")

    async def commit_transaction(self) -> None:
        self._call("commit")

    async def abort_transaction(self) -> None:
        self._call("abort")

    def sender_died_of(self, error: BaseException) -> None:
        async def die() -> None:
            raise error

        task = asyncio.ensure_future(die())
        self._sender = SimpleNamespace(sender_task=task)


async def _offsets(stub: Any, offsets: Any, group: GroupMetadata) -> None:
    """The offsets as the stub takes them (the real producer sends TxnOffsetCommit v3 with ``group``)."""
    await stub.send_offsets_to_transaction(offsets, group.group_id)


def _wrapped(stub: Stub) -> TransactionalProducer:
    return TransactionalProducer(stub, "worker", send_offsets=_offsets)


@pytest.mark.parametrize("call", ["begin", "offsets", "commit", "abort"])
async def test_a_fence_at_any_call_is_producer_fenced(call: str) -> None:
    """ProducerFenced from begin, offsets, commit or abort is ProducerFencedError, and the producer is fenced."""
    stub = Stub()
    stub.raises[call] = ProducerFenced()
    producer = _wrapped(stub)
    calls = {
        "begin": producer.begin,
        "offsets": lambda: producer.send_offsets({}, GroupMetadata("g", 1, "m", None)),
        "commit": producer.commit,
        "abort": producer.abort,
    }
    with pytest.raises(ProducerFencedError):
        await calls[call]()
    assert producer.fenced


async def test_a_fence_from_a_sends_future_is_producer_fenced() -> None:
    """A send refused with ProducerFenced (aiokafka turns InvalidProducerEpoch into it) is ProducerFencedError."""
    producer = _wrapped(Stub())
    assert isinstance(producer.outcome(ProducerFenced()), ProducerFencedError)
    assert producer.fenced


@pytest.mark.parametrize("call", ["begin", "abort"])
async def test_the_state_machine_assertion_after_a_fence_is_still_a_fence(call: str) -> None:
    """Once the sender died of a fence, aiokafka asserts on begin and abort: that is still ProducerFencedError."""
    stub = Stub()
    stub.sender_died_of(ProducerFenced())
    await asyncio.sleep(0)
    stub.raises[call] = AssertionError("Invalid state transition TransactionState.FATAL_ERROR")
    producer = _wrapped(stub)
    with pytest.raises(ProducerFencedError):
        await (producer.begin() if call == "begin" else producer.abort())


async def test_a_send_refused_after_the_sender_died_of_something_else_is_unusable() -> None:
    """IllegalOperation from send_batch (the transaction failed with the sender) is ProducerUnusableError."""
    stub = Stub()
    stub.sender_died_of(KafkaTimeoutError())
    await asyncio.sleep(0)
    stub.raises["send"] = IllegalOperation("Can't send messages while not in transaction")
    with pytest.raises(ProducerUnusableError):
        await _wrapped(stub).send_batch(object(), "t", 0)


async def test_an_abort_aiokafka_would_keep_to_itself_is_refused_and_never_attempted() -> None:
    """After an authorization error aiokafka would "abort" locally: the wrapper says to replace the producer."""
    stub = Stub()
    stub._txn_manager = SimpleNamespace(state=None, is_empty_transaction=lambda: True)
    stub._txn_manager.state = TransactionState.ABORTABLE_ERROR
    with pytest.raises(ProducerUnusableError):
        await _wrapped(stub).abort()
    assert "abort" not in stub.calls


async def test_a_refused_commit_whose_abort_would_be_local_is_unusable() -> None:
    """A commit refused for an authorization error, with aiokafka's partitions forgotten, is ProducerUnusableError."""
    stub = Stub()
    stub.raises["commit"] = GroupAuthorizationFailedError("g")
    stub._txn_manager = SimpleNamespace(
        state=TransactionState.ABORTABLE_ERROR, is_empty_transaction=lambda: True
    )
    with pytest.raises(ProducerUnusableError):
        await _wrapped(stub).commit()


async def test_a_refused_commit_otherwise_is_the_brokers_error() -> None:
    """Any other refusal is raised as it is: the transaction is aborted and redone."""
    stub = Stub()
    stub.raises["commit"] = KafkaTimeoutError()
    with pytest.raises(KafkaTimeoutError):
        await _wrapped(stub).commit()


def test_a_batch_refused_outright_asks_for_a_new_producer_and_a_retriable_one_does_not() -> None:
    """After a non-retriable send refusal the sequence numbers no longer line up: needs_replacing."""
    producer = _wrapped(Stub())
    assert producer.outcome(RequestTimedOutError()) is not None
    assert not producer.needs_replacing
    error = InvalidTimestampError()
    assert producer.outcome(error) is error
    assert producer.needs_replacing

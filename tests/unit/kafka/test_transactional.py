"""Every shape in which aiokafka reports a fence or a dead producer comes out as one of two errors."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    IllegalOperation,
    InvalidTimestampError,
    KafkaConnectionError,
    KafkaTimeoutError,
    ProducerFenced,
    RequestTimedOutError,
)
from aiokafka.producer.transaction_manager import TransactionState

from pipeline.errors import ProducerFencedError, ProducerUnusableError
from pipeline.kafka import internals
from pipeline.kafka.requests import GroupMetadata
from pipeline.kafka.transactional import TransactionalProducer


class Stub:
    """The calls TransactionalProducer makes, each raising what it is told to."""

    def __init__(self) -> None:
        self.raises: dict[str, BaseException] = {}
        self.calls: list[str] = []
        self._sender: Any = None
        self._txn_manager: Any = None
        self.sent: list[tuple[Any, str, int]] = []
        self.future: asyncio.Future[Any] | None = None

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
        self.sent.append((batch, topic, partition))
        self.future = asyncio.get_running_loop().create_future()
        return self.future

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


GROUP = GroupMetadata("g", 4, "member-1", None)
OFFSETS = {TopicPartition("in", 0): 12}
INVALID_STATE = (
    "Invalid state transition TransactionState.FATAL_ERROR -> TransactionState.ABORTING_TRANSACTION"
)


def _fenced_message(fence: BaseException) -> str:
    return f"worker: fenced by a newer producer ({fence})"


def _call(producer: TransactionalProducer, call: str) -> Any:
    """The wrapper's call by the stub's name for it."""
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "start": producer.start,
        "begin": producer.begin,
        "offsets": lambda: producer.send_offsets(OFFSETS, GROUP),
        "commit": producer.commit,
        "abort": producer.abort,
        "send": lambda: producer.send_batch(object(), "out", 1),
    }
    return calls[call]()


async def test_each_call_goes_to_the_producer_and_a_send_returns_its_future() -> None:
    """start, begin, send_batch (the batch, topic and partition given), offsets, commit and abort reach aiokafka;
    nothing failing leaves the producer neither fenced nor to be replaced."""
    stub = Stub()
    producer = _wrapped(stub)
    assert producer.client is stub
    assert (producer.name, producer.fenced, producer.needs_replacing) == ("worker", False, False)
    batch = object()
    await producer.start()
    await producer.begin()
    future = await producer.send_batch(batch, "out", 3)
    await producer.send_offsets(OFFSETS, GROUP)
    await producer.commit()
    await producer.abort()
    assert stub.calls == ["start", "begin", "send", "offsets", "commit", "abort"]
    assert stub.sent == [(batch, "out", 3)]
    assert future is stub.future
    assert (producer.fenced, producer.needs_replacing) == (False, False)


async def test_the_offsets_go_as_txn_offset_commit_v3_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``send_offsets``, the offsets go through internals.send_offsets_with_group_metadata, with the
    producer, the offsets and the group's metadata."""
    sent: list[tuple[Any, Any, GroupMetadata]] = []

    async def send_offsets(producer: Any, offsets: Any, group: GroupMetadata) -> None:
        sent.append((producer, offsets, group))

    monkeypatch.setattr(internals, "send_offsets_with_group_metadata", send_offsets)
    stub = Stub()
    await TransactionalProducer(stub, "worker").send_offsets(OFFSETS, GROUP)
    assert sent == [(stub, OFFSETS, GROUP)]


async def test_the_given_offsets_sender_gets_the_producer_the_offsets_and_the_group() -> None:
    """A ``send_offsets`` given is called with the aiokafka producer, the offsets and the group metadata."""
    sent: list[tuple[Any, Any, GroupMetadata]] = []

    async def send_offsets(producer: Any, offsets: Any, group: GroupMetadata) -> None:
        sent.append((producer, offsets, group))

    stub = Stub()
    await TransactionalProducer(stub, "worker", send_offsets=send_offsets).send_offsets(OFFSETS, GROUP)
    assert sent == [(stub, OFFSETS, GROUP)]


def test_a_batch_is_built_at_the_size_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """``batch(size)`` is internals.batch_builder(size): a topic's own size limit, not the producer's."""
    monkeypatch.setattr(internals, "batch_builder", lambda size: ("batch", size))
    assert _wrapped(Stub()).batch(4096) == ("batch", 4096)


@pytest.mark.parametrize("call", ["start", "begin", "offsets", "commit", "abort"])
async def test_a_fence_names_the_producer_and_the_fence_and_is_chained_to_it(call: str) -> None:
    """ProducerFenced from any call: "<name>: fenced by a newer producer (<the fence>)", raised from it."""
    stub = Stub()
    fence = ProducerFenced("epoch 7 is newer")
    stub.raises[call] = fence
    producer = _wrapped(stub)
    with pytest.raises(ProducerFencedError) as raised:
        await _call(producer, call)
    assert (
        str(raised.value)
        == _fenced_message(fence)
        == "worker: fenced by a newer producer (ProducerFenced: epoch 7 is newer)"
    )
    assert raised.value.__cause__ is fence
    assert producer.fenced is True


async def test_a_fence_at_start_is_producer_fenced() -> None:
    """A newer producer started while this one initialised: ProducerFencedError, and the producer is fenced."""
    stub = Stub()
    stub.raises["start"] = ProducerFenced()
    producer = _wrapped(stub)
    with pytest.raises(ProducerFencedError):
        await producer.start()
    assert producer.fenced is True


def test_a_fence_from_a_sends_future_names_the_fence_and_does_not_ask_for_replacing() -> None:
    """outcome(ProducerFenced): ProducerFencedError naming the fence; a fence is not a refused batch."""
    producer = _wrapped(Stub())
    fence = ProducerFenced("epoch 7 is newer")
    error = producer.outcome(fence)
    assert isinstance(error, ProducerFencedError)
    assert str(error) == _fenced_message(fence)
    assert (producer.fenced, producer.needs_replacing) == (True, False)


def test_a_send_failing_with_something_not_from_kafka_is_returned_as_it_is() -> None:
    """A non-Kafka failure of a send (a cancelled future) is the error itself: neither fenced nor to be replaced."""
    producer = _wrapped(Stub())
    error = asyncio.CancelledError()
    assert producer.outcome(error) is error
    assert (producer.fenced, producer.needs_replacing) == (False, False)
    refused = InvalidTimestampError()
    assert producer.outcome(refused) is refused
    assert producer.needs_replacing is True


@pytest.mark.parametrize("call", ["begin", "abort", "commit", "offsets"])
async def test_a_state_machine_refusal_after_the_sender_died_of_a_fence_names_that_fence(call: str) -> None:
    """aiokafka's AssertionError after its sender died of a fence: ProducerFencedError naming the sender's fence
    (what happened), not the assertion (aiokafka's symptom of it)."""
    stub = Stub()
    fence = ProducerFenced("the sender's fence")
    stub.sender_died_of(fence)
    await asyncio.sleep(0)
    assertion = AssertionError(INVALID_STATE)
    stub.raises[call] = assertion
    producer = _wrapped(stub)
    with pytest.raises(ProducerFencedError) as raised:
        await _call(producer, call)
    assert str(raised.value) == _fenced_message(fence)
    assert raised.value.__cause__ is assertion
    assert producer.fenced is True


@pytest.mark.parametrize("call", ["begin", "abort", "commit", "offsets", "send"])
async def test_a_state_machine_refusal_once_fenced_is_still_a_fence(call: str) -> None:
    """Fenced before (by a commit) with the sender still running: a later AssertionError is a fence too, naming it."""
    stub = Stub()
    stub.raises["commit"] = ProducerFenced()
    producer = _wrapped(stub)
    with pytest.raises(ProducerFencedError):
        await producer.commit()
    refusal = IllegalOperation("not in transaction") if call == "send" else AssertionError(INVALID_STATE)
    stub.raises = {call: refusal}
    with pytest.raises(ProducerFencedError) as raised:
        await _call(producer, call)
    assert str(raised.value) == _fenced_message(refusal)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ("begin", AssertionError(INVALID_STATE)),
        ("commit", AssertionError(INVALID_STATE)),
        ("offsets", IllegalOperation("not in transaction")),
        ("send", IllegalOperation("Can't send messages while not in transaction")),
        ("abort", AssertionError(INVALID_STATE)),
        ("abort", KafkaConnectionError("Connection at kafka:9092 closed")),
    ],
)
async def test_a_producer_whose_sender_died_of_something_else_cannot_continue_and_says_of_what(
    call: str, error: Exception
) -> None:
    """The sender died of a timeout: every refusal is ProducerUnusableError naming the sender's error, not fenced."""
    stub = Stub()
    stub.sender_died_of(KafkaTimeoutError())
    await asyncio.sleep(0)
    stub.raises[call] = error
    producer = _wrapped(stub)
    with pytest.raises(ProducerUnusableError) as raised:
        await _call(producer, call)
    assert str(raised.value) == "worker: the producer cannot continue (KafkaTimeoutError())"
    assert raised.value.__cause__ is error
    assert producer.fenced is False


@pytest.mark.parametrize(
    "error",
    [AssertionError(INVALID_STATE), KafkaConnectionError("Connection at kafka:9092 closed")],
)
async def test_an_abort_refused_with_the_sender_running_cannot_continue_and_says_why(
    error: Exception,
) -> None:
    """abort() refused (a state-machine assertion, or the broker gone mid-abort) while the sender runs:
    ProducerUnusableError naming that refusal; a new producer aborts the transaction instead."""
    stub = Stub()
    stub.raises["abort"] = error
    producer = _wrapped(stub)
    with pytest.raises(ProducerUnusableError) as raised:
        await producer.abort()
    assert str(raised.value) == f"worker: the producer cannot continue ({error!r})"
    assert producer.fenced is False


async def test_an_abort_refused_after_the_sender_died_of_a_fence_is_that_fence() -> None:
    """abort() refused with a KafkaError after the sender died of a fence: ProducerFencedError naming the fence."""
    stub = Stub()
    fence = ProducerFenced("the sender's fence")
    stub.sender_died_of(fence)
    await asyncio.sleep(0)
    stub.raises["abort"] = KafkaConnectionError("closed")
    producer = _wrapped(stub)
    with pytest.raises(ProducerFencedError) as raised:
        await producer.abort()
    assert str(raised.value) == _fenced_message(fence)


def _forgetful(stub: Stub) -> None:
    """aiokafka's transaction manager after an authorization error: abortable, its partitions forgotten."""
    stub._txn_manager = SimpleNamespace(
        state=TransactionState.ABORTABLE_ERROR, is_empty_transaction=lambda: True
    )


async def test_an_abort_that_would_stay_local_says_so_and_that_replacing_the_producer_aborts() -> None:
    """The refusal of a local "abort" explains itself: what aiokafka forgot, and what to do instead."""
    stub = Stub()
    _forgetful(stub)
    with pytest.raises(ProducerUnusableError) as raised:
        await _wrapped(stub).abort()
    assert str(raised.value) == (
        "worker: aiokafka forgot what the transaction holds (after an authorization error) "
        "and would not abort it on the broker; replacing the producer aborts it"
    )


@pytest.mark.parametrize("call", ["commit", "offsets"])
async def test_a_refusal_whose_abort_would_stay_local_names_the_refusal_and_is_chained_to_it(
    call: str,
) -> None:
    """A commit or offsets refused (authorization) with aiokafka's partitions forgotten: ProducerUnusableError
    naming the refusal, raised from it."""
    stub = Stub()
    refusal = GroupAuthorizationFailedError("g")
    stub.raises[call] = refusal
    _forgetful(stub)
    with pytest.raises(ProducerUnusableError) as raised:
        await _call(_wrapped(stub), call)
    assert str(raised.value) == f"worker: {refusal!r}; the transaction must be aborted by a new producer"
    assert raised.value.__cause__ is refusal


@pytest.mark.parametrize("call", ["commit", "offsets"])
async def test_a_refusal_whose_abort_reaches_the_broker_is_raised_as_it_is(call: str) -> None:
    """A commit or offsets refused while aiokafka still knows what the transaction holds: the broker's error
    itself (the caller aborts and redoes), the producer neither fenced nor to be replaced."""
    stub = Stub()
    refusal = GroupAuthorizationFailedError("g")
    stub.raises[call] = refusal
    producer = _wrapped(stub)
    with pytest.raises(GroupAuthorizationFailedError) as raised:
        await _call(producer, call)
    assert raised.value is refusal
    assert (producer.fenced, producer.needs_replacing) == (False, False)


@pytest.mark.parametrize(
    "error", [KafkaTimeoutError(), AssertionError(INVALID_STATE), IllegalOperation("x"), OSError("closed")]
)
async def test_a_stop_that_fails_is_logged_not_raised(error: Exception) -> None:
    """stop() of a producer gone fatal (a KafkaError, aiokafka's dead-producer errors, a socket error) returns."""
    stub = Stub()
    stub.raises["stop"] = error
    await _wrapped(stub).stop()
    assert stub.calls == ["stop"]


async def test_a_stop_that_fails_for_a_bug_is_raised() -> None:
    """Anything else out of stop() is not swallowed."""
    stub = Stub()
    stub.raises["stop"] = ValueError("a bug")
    with pytest.raises(ValueError, match="a bug"):
        await _wrapped(stub).stop()


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ("begin", AssertionError(INVALID_STATE)),
        ("send", IllegalOperation("Can't send messages while not in transaction")),
        ("offsets", IllegalOperation("not in transaction")),
        ("commit", AssertionError(INVALID_STATE)),
    ],
)
async def test_a_state_machine_refusal_with_the_sender_running_names_the_refusal(
    call: str, error: Exception
) -> None:
    """No sender failure to name: ProducerUnusableError names aiokafka's refusal itself."""
    stub = Stub()
    stub.raises[call] = error
    producer = _wrapped(stub)
    with pytest.raises(ProducerUnusableError) as raised:
        await _call(producer, call)
    assert str(raised.value) == f"worker: the producer cannot continue ({error!r})"
    assert producer.fenced is False

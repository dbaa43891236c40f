"""fence_transactional_id: InitProducerId for an id, to its coordinator, asked again while the old transaction ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaClient
from aiokafka.client import ConnectionGroup, CoordinationType
from aiokafka.errors import (
    ConcurrentTransactions,
    IncompatibleBrokerVersion,
    InvalidTxnState,
    KafkaConnectionError,
    NotCoordinatorForGroupError,
    TransactionalIdAuthorizationFailed,
)
from aiokafka.protocol.transaction import InitProducerIdRequest

from pipeline.errors import BrokerUnavailableError
from pipeline.kafka.fencing import (
    FENCE_TIMEOUT_S,
    FENCE_TXN_TIMEOUT_MS,
    MAX_BACKOFF_S,
    fence_transactional_id,
)

#: an answer that never comes (the coordinator hangs): the send waits, in steps of 5 s, until it is cancelled
HANG = object()


class Coordinators:
    """Stands in for an AIOKafkaClient's lookup and send: each InitProducerId gets the next answer."""

    def __init__(self, *answers: int | Exception | object) -> None:
        self.answers = list(answers)
        self.lookups: list[tuple[int, str]] = []
        self.sent: list[tuple[int, Any, Any]] = []

    async def coordinator_lookup(self, kind: int, key: str) -> int:
        self.lookups.append((kind, key))
        return len(self.lookups)  # the coordinator "moves" on each lookup

    async def send(self, node_id: int, request: Any, *, group: Any) -> Any:
        self.sent.append((node_id, request, group))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        while answer is HANG:
            await asyncio.sleep(5)
        if isinstance(answer, Exception):
            raise answer
        return SimpleNamespace(error_code=answer, producer_id=1000 if answer == 0 else -1, producer_epoch=5)


@pytest.fixture
async def client() -> AsyncIterator[AIOKafkaClient]:
    """A real, never started AIOKafkaClient whose lookup and send the test gives."""
    kafka = AIOKafkaClient(bootstrap_servers="127.0.0.1:1")
    yield kafka
    await kafka.close()


def _use(kafka: AIOKafkaClient, coordinators: Coordinators) -> None:
    kafka.coordinator_lookup = coordinators.coordinator_lookup
    kafka.send = coordinators.send


async def test_the_id_is_initialised_at_its_transaction_coordinator(client: AIOKafkaClient) -> None:
    """FindCoordinator(transaction, id), then InitProducerId for the id over the coordination connections."""
    coordinators = Coordinators(0)
    _use(client, coordinators)
    assert await fence_transactional_id(client, "app-group-raw-3") == (1000, 5)
    assert coordinators.lookups == [(CoordinationType.TRANSACTION, "app-group-raw-3")]
    node, request, group = coordinators.sent[0]
    assert (node, group) == (1, ConnectionGroup.COORDINATION)
    assert isinstance(request, InitProducerIdRequest)
    assert request.prepare({22: (0, 5)}).transactional_id == "app-group-raw-3"


async def test_it_is_asked_again_while_the_old_transaction_is_aborted_and_after_the_coordinator_moved(
    client: AIOKafkaClient,
) -> None:
    """CONCURRENT_TRANSACTIONS (the aborted transaction's markers being written), NOT_COORDINATOR and a lost
    connection are asked again, each time of the coordinator looked up again."""
    coordinators = Coordinators(
        ConcurrentTransactions.errno, NotCoordinatorForGroupError.errno, KafkaConnectionError("gone"), 0
    )
    _use(client, coordinators)
    assert await fence_transactional_id(client, "t", backoff_s=0.001) == (1000, 5)
    assert [node for node, _request, _group in coordinators.sent] == [1, 2, 3, 4]


async def test_a_refusal_is_raised(client: AIOKafkaClient) -> None:
    """TRANSACTIONAL_ID_AUTHORIZATION_FAILED, and any answer asking again would not change, are raised at once."""
    _use(client, Coordinators(TransactionalIdAuthorizationFailed.errno))
    with pytest.raises(TransactionalIdAuthorizationFailed):
        await fence_transactional_id(client, "t")
    _use(client, Coordinators(InvalidTxnState.errno))
    with pytest.raises(InvalidTxnState):
        await fence_transactional_id(client, "t")


async def test_an_id_that_cannot_be_fenced_in_time_is_broker_unavailable(client: AIOKafkaClient) -> None:
    """Still CONCURRENT_TRANSACTIONS at the deadline: BrokerUnavailableError naming the id."""
    _use(client, Coordinators(ConcurrentTransactions.errno))
    with pytest.raises(BrokerUnavailableError, match="could not fence transactional id t within"):
        await fence_transactional_id(client, "t", timeout_s=0.05, backoff_s=0.01)


class VirtualTime:
    """The running loop's clock stands still but for sleeps: ``asyncio.sleep`` returns at once (after one turn of
    the loop) and moves the loop's time by its delay, so deadlines and timeouts come exactly as late as they would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        loop = asyncio.get_running_loop()
        start, real_sleep = loop.time(), asyncio.sleep
        self.offset = 0.0
        self.sleeps: list[float] = []

        async def sleep(delay: float) -> None:
            self.sleeps.append(delay)
            assert len(self.sleeps) < 10_000, "waits that never reach the deadline"
            self.offset += delay
            await real_sleep(0)

        monkeypatch.setattr(loop, "time", lambda: start + self.offset)
        monkeypatch.setattr(asyncio, "sleep", sleep)


async def test_the_id_is_initialised_with_a_60_second_transaction_timeout(client: AIOKafkaClient) -> None:
    """InitProducerId registers FENCE_TXN_TIMEOUT_MS (60 s) with the id, as a producer with the default would."""
    coordinators = Coordinators(0)
    _use(client, coordinators)
    await fence_transactional_id(client, "t")
    _node, request, _group = coordinators.sent[0]
    assert request.prepare({22: (0, 5)}).transaction_timeout_ms == FENCE_TXN_TIMEOUT_MS == 60_000


async def test_the_wait_between_attempts_doubles_from_the_backoff_up_to_half_a_second(
    client: AIOKafkaClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONCURRENT_TRANSACTIONS for good, 2 s to fence: waits of 10, 20, 40, 80, 160, 320 ms then 500 ms, and no wait
    that would end past the deadline: BrokerUnavailableError naming the id, the time and the last answer."""
    clock = VirtualTime(monkeypatch)
    coordinators = Coordinators(ConcurrentTransactions.errno)
    _use(client, coordinators)
    with pytest.raises(BrokerUnavailableError) as raised:
        await fence_transactional_id(client, "app-g-in-0", timeout_s=2.0)
    assert clock.sleeps == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5])
    assert len(coordinators.sent) == 9
    assert (
        str(raised.value)
        == "could not fence transactional id app-g-in-0 within 2 s (last: 'ConcurrentTransactions')"
    )


async def test_by_default_an_id_is_asked_for_60_seconds(
    client: AIOKafkaClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The defaults: FENCE_TIMEOUT_S (60 s), the first wait 10 ms, at most MAX_BACKOFF_S (0.5 s)."""
    clock = VirtualTime(monkeypatch)
    _use(client, Coordinators(ConcurrentTransactions.errno))
    with pytest.raises(BrokerUnavailableError, match=r"within 60 s"):
        await fence_transactional_id(client, "t")
    assert (FENCE_TIMEOUT_S, MAX_BACKOFF_S) == (60.0, 0.5)
    assert clock.sleeps[:7] == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5])
    assert len(clock.sleeps) == 6 + 118  # 0.63 s, then 0.5 s waits while each still ends before 60 s
    assert sum(clock.sleeps) == pytest.approx(59.63)


async def test_a_coordinator_that_never_answers_is_given_up_at_the_deadline(
    client: AIOKafkaClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An InitProducerId never answered is cut at the deadline: BrokerUnavailableError with no answer to name."""
    VirtualTime(monkeypatch)
    _use(client, Coordinators(HANG))
    async with asyncio.timeout(100):  # (virtual seconds) a fence not cut at its deadline fails here instead
        with pytest.raises(BrokerUnavailableError) as raised:
            await fence_transactional_id(client, "t", timeout_s=10.0)
    assert str(raised.value) == "could not fence transactional id t within 10 s (last: None)"


async def test_a_connection_lost_until_the_deadline_is_named_as_the_last_error(
    client: AIOKafkaClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retriable KafkaError on every attempt: asked again while a wait still ends before the deadline (a wait
    ending exactly at it is not begun), then named in the error."""
    clock = VirtualTime(monkeypatch)
    coordinators = Coordinators(KafkaConnectionError("gone"))
    _use(client, coordinators)
    with pytest.raises(BrokerUnavailableError) as raised:
        await fence_transactional_id(client, "t", timeout_s=0.75, backoff_s=0.25)
    assert (
        str(raised.value)
        == "could not fence transactional id t within 0.75 s (last: KafkaConnectionError('gone'))"
    )
    assert clock.sleeps == [0.25]  # at 0.25 s, a wait of 0.5 s would end at the deadline
    assert len(coordinators.sent) == 2


async def test_a_kafka_error_asking_again_would_not_change_is_raised_at_once(client: AIOKafkaClient) -> None:
    """A non-retriable KafkaError from the request itself is raised after the one attempt."""
    coordinators = Coordinators(IncompatibleBrokerVersion("no InitProducerId"))
    _use(client, coordinators)
    with pytest.raises(IncompatibleBrokerVersion, match="no InitProducerId"):
        await fence_transactional_id(client, "t")
    assert len(coordinators.sent) == 1


async def test_a_refusal_names_the_id_and_the_request(client: AIOKafkaClient) -> None:
    """TRANSACTIONAL_ID_AUTHORIZATION_FAILED names the id; another refusal names InitProducerId and the id."""
    _use(client, Coordinators(TransactionalIdAuthorizationFailed.errno))
    with pytest.raises(TransactionalIdAuthorizationFailed) as denied:
        await fence_transactional_id(client, "app-g-in-0")
    assert str(denied.value) == "[Error 53] TransactionalIdAuthorizationFailed: app-g-in-0"
    _use(client, Coordinators(InvalidTxnState.errno))
    with pytest.raises(InvalidTxnState) as refused:
        await fence_transactional_id(client, "app-g-in-0")
    assert str(refused.value) == "[Error 48] InvalidTxnState: InitProducerId for app-g-in-0"


async def test_a_coordinator_loading_its_state_is_asked_again(client: AIOKafkaClient) -> None:
    """COORDINATOR_LOAD_IN_PROGRESS (14), COORDINATOR_NOT_AVAILABLE (15) and REQUEST_TIMED_OUT (7) are asked again."""
    coordinators = Coordinators(14, 15, 7, 0)
    _use(client, coordinators)
    assert await fence_transactional_id(client, "t", backoff_s=0.001) == (1000, 5)
    assert len(coordinators.sent) == 4

"""fence_transactional_id: InitProducerId for an id, to its coordinator, asked again while the old transaction ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaClient
from aiokafka.client import ConnectionGroup, CoordinationType
from aiokafka.errors import (
    ConcurrentTransactions,
    InvalidTxnState,
    KafkaConnectionError,
    NotCoordinatorForGroupError,
    TransactionalIdAuthorizationFailed,
)
from aiokafka.protocol.transaction import InitProducerIdRequest

from pipeline.errors import BrokerUnavailableError
from pipeline.kafka.fencing import fence_transactional_id


class Coordinators:
    """Stands in for an AIOKafkaClient's lookup and send: each InitProducerId gets the next answer."""

    def __init__(self, *answers: int | Exception) -> None:
        self.answers = list(answers)
        self.lookups: list[tuple[int, str]] = []
        self.sent: list[tuple[int, Any, Any]] = []

    async def coordinator_lookup(self, kind: int, key: str) -> int:
        self.lookups.append((kind, key))
        return len(self.lookups)  # the coordinator "moves" on each lookup

    async def send(self, node_id: int, request: Any, *, group: Any) -> Any:
        self.sent.append((node_id, request, group))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
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

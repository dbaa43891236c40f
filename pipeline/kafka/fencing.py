"""Fence a transactional id without keeping a producer for it (a rolling upgrade to eos-v2).

A worker on one producer per process (eos-v2) takes over partitions that older workers served
with one transactional producer each, under the id ``<app>-<group>-<topic>-<partition>``. Such a
producer, alive somewhere as a zombie, could still commit a transaction over the partition's
outputs. :func:`fence_transactional_id` does what starting a producer with that id would do,
and then nothing more: InitProducerId, which bumps the id's epoch (every older producer with it is
fenced) and aborts its open transaction, whose records a read_committed reader then never sees.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.client import ConnectionGroup, CoordinationType
from aiokafka.errors import (
    ConcurrentTransactions,
    GroupLoadInProgressError,
    KafkaError,
    TransactionalIdAuthorizationFailed,
    for_code,
)
from aiokafka.protocol.transaction import InitProducerIdRequest

from pipeline.errors import BrokerUnavailableError
from pipeline.kafka import internals
from pipeline.kafka.requests import COORDINATOR_MOVED

#: The transaction timeout registered with the fenced id (a producer that starts with the id later sets its own).
FENCE_TXN_TIMEOUT_MS = 60_000
FENCE_TIMEOUT_S = 60.0
MAX_BACKOFF_S = 0.5
#: the answers to ask again for, after a backoff: the aborted transaction's markers are still being
#: written (CONCURRENT_TRANSACTIONS), the coordinator loads its state (COORDINATOR_LOAD_IN_PROGRESS)
_WAIT = {ConcurrentTransactions.errno, GroupLoadInProgressError.errno}


async def fence_transactional_id(
    client: AIOKafkaClient | AIOKafkaProducer | AIOKafkaConsumer | Any,
    transactional_id: str,
    *,
    timeout_s: float = FENCE_TIMEOUT_S,
    backoff_s: float = 0.01,
) -> tuple[int, int]:
    """Fence every producer with ``transactional_id`` and abort its open transaction; (producer id, epoch).

    ``client`` is any started aiokafka client (a producer, a consumer, an admin client, or their
    ``AIOKafkaClient``); nothing is kept open. FindCoordinator for the id, then InitProducerId, asked
    again, the wait doubling from ``backoff_s`` up to 0.5 s, while the coordinator moves, loads, or
    writes the aborted transaction's markers (CONCURRENT_TRANSACTIONS). When it returns, the old
    transaction is aborted and its markers written, and the old producer's next request with that id is
    refused as fenced. Raises :class:`BrokerUnavailableError` when that is not done within ``timeout_s``,
    and ``TransactionalIdAuthorizationFailed`` (or another KafkaError the broker will keep answering).
    """
    kafka = internals.kafka_client(client)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: object = None
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                answer: Any = await _init_producer_id(kafka, transactional_id)
        except KafkaError as exc:
            if not exc.retriable:
                raise
            last = exc
        except TimeoutError:
            pass
        else:
            code = answer.error_code
            if code == 0:
                return int(answer.producer_id), int(answer.producer_epoch)
            if code == TransactionalIdAuthorizationFailed.errno:
                raise TransactionalIdAuthorizationFailed(transactional_id)
            if code not in _WAIT and code not in COORDINATOR_MOVED:
                raise for_code(code)(f"InitProducerId for {transactional_id}")
            last = for_code(code).__name__
        if loop.time() + backoff_s >= deadline:
            raise BrokerUnavailableError(
                f"could not fence transactional id {transactional_id} within {timeout_s:g} s (last: {last!r})"
            )
        await asyncio.sleep(backoff_s)
        backoff_s = min(backoff_s * 2, MAX_BACKOFF_S)


async def _init_producer_id(kafka: AIOKafkaClient, transactional_id: str) -> Any:
    """InitProducerId for ``transactional_id``, to its transaction coordinator (looked up each time: after a
    NOT_COORDINATOR answer it may have moved)."""
    node_id = await kafka.coordinator_lookup(CoordinationType.TRANSACTION, transactional_id)
    request = InitProducerIdRequest(transactional_id, FENCE_TXN_TIMEOUT_MS)
    return await kafka.send(node_id, request, group=ConnectionGroup.COORDINATION)

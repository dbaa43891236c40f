"""What pipeline/kafka/internals.py relies on inside aiokafka 0.14: each test fails when aiokafka changes it."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from io import BytesIO
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.cluster import ClusterMetadata
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    LeaderNotAvailableError,
    ProducerFenced,
    RequestTimedOutError,
    UnknownMemberIdError,
)
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.producer.transaction_manager import TransactionState
from aiokafka.protocol.group import HeartbeatRequest
from aiokafka.protocol.metadata import MetadataResponse_v1

from pipeline.kafka import internals
from pipeline.kafka.requests import MetadataResponseV12

TP = TopicPartition("t", 0)


def _transactional() -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", transactional_id="pinned")


async def test_the_concurrent_transactions_wait_is_aiokafkas_module_constant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``BACKOFF_OVERRIDE`` is still the sender's module-level wait, and setting it sets it."""
    monkeypatch.setattr(aiokafka_sender, "BACKOFF_OVERRIDE", 0.02)
    internals.shorten_concurrent_transactions_wait(0.005)
    assert aiokafka_sender.BACKOFF_OVERRIDE == 0.005


async def test_an_abort_after_an_authorization_error_would_never_reach_the_broker() -> None:
    """aiokafka's transaction manager forgets its partitions on an abortable error, so its abort is local."""
    producer = _transactional()
    try:
        manager = producer._txn_manager
        manager.set_pid_and_epoch(7, 0)
        manager.begin_transaction()
        manager.maybe_add_partition_to_txn(TP)
        manager.partition_added(TP)
        assert not internals.abort_would_be_local(producer)  # records sent: a real abort
        manager.error_transaction(GroupAuthorizationFailedError("g"))
        assert manager.state is TransactionState.ABORTABLE_ERROR
        assert manager.is_empty_transaction()  # what makes aiokafka skip the EndTxn
        assert internals.abort_would_be_local(producer)
    finally:
        await producer.stop()


async def test_a_producer_never_started_has_no_sender_failure() -> None:
    """The sender task is ``producer._sender.sender_task``; before start it is None, and so is the failure."""
    producer = _transactional()
    try:
        assert hasattr(producer._sender, "sender_task")
        assert internals.sender_failure(producer) is None
        assert not internals.sender_dead(producer)
    finally:
        await producer.stop()


async def test_a_sender_that_died_reports_what_it_died_of() -> None:
    """A finished sender task's exception is the producer's failure (a fence, typically)."""

    async def die() -> None:
        raise ProducerFenced

    task = asyncio.ensure_future(die())
    await asyncio.gather(task, return_exceptions=True)
    producer: Any = SimpleNamespace(_sender=SimpleNamespace(sender_task=task))
    assert isinstance(internals.sender_failure(producer), ProducerFenced)
    assert internals.sender_dead(producer)


def test_the_group_coordinator_can_be_asked_to_rejoin() -> None:
    """``request_rejoin`` is the coordinator's own way to start a new generation."""
    assert callable(GroupCoordinator.request_rejoin)
    asked: list[bool] = []
    consumer: Any = SimpleNamespace(_coordinator=SimpleNamespace(request_rejoin=lambda: asked.append(True)))
    internals.request_rejoin(consumer)
    assert asked == [True]


def test_aiokafkas_fetcher_close_awaits_its_cancelled_fetches_unguarded() -> None:
    """The reason for ``stop_consumer``: Fetcher.close awaits each cancelled fetch task, whose backoff sleep
    lets CancelledError out (fixed upstream, this test fails and the guard can go)."""
    source = inspect.getsource(Fetcher.close)
    assert "x.cancel()" in source
    assert "await x" in source


async def test_stop_consumer_swallows_a_cancellation_it_did_not_ask_for() -> None:
    """A CancelledError out of ``consumer.stop()`` is not the caller's: the stop returns."""

    class Stopping:
        async def stop(self) -> None:
            raise asyncio.CancelledError

    await internals.stop_consumer(Stopping())


async def test_stop_consumer_lets_a_real_cancellation_through() -> None:
    """When the caller itself is being cancelled, the CancelledError goes on."""
    entered = asyncio.Event()

    class Slow:
        async def stop(self) -> None:
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.ensure_future(internals.stop_consumer(Slow()))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_cluster_ids_reads_the_metadata_v12_answer() -> None:
    """The cluster id and the ids of the topics that exist, from a Metadata v12 answer sent over the admin client."""
    topic_id = uuid.uuid4()
    response = MetadataResponseV12(
        0,
        [(0, "h", 9092, None, {})],
        "the-cluster",
        0,
        [
            (0, "a", topic_id, False, [(0, 0, 0, 0, [0], [0], [], {})], 0, {}),
            (3, "b", uuid.UUID(int=0), False, [], 0, {}),
        ],
        {},
    )
    decoded = MetadataResponseV12.decode(BytesIO(response.encode()))

    class Admin:
        async def _send_request(self, _request: Any) -> Any:
            return decoded

    ids = asyncio.run(internals.cluster_ids(Admin(), ["a", "b"]))
    assert ids.cluster == "the-cluster"
    assert ids.topics == {"a": str(topic_id)}  # a missing topic has no id


def test_a_batch_never_grows_past_its_size() -> None:
    """``batch_builder(size)`` refuses the record that would take it past ``size`` (the topic's limit)."""
    batch = internals.batch_builder(2048)
    appended = 0
    while batch.append(key=b"k", value=b"v" * 100, timestamp=1, headers=[]) is not None:
        appended += 1
    assert 10 < appended < 20
    batch.close()
    assert len(batch._builder.build()) <= 2048


async def test_the_group_consumer_has_a_coordinator_once_started_and_none_before() -> None:
    """``_coordinator`` is the attribute request_rejoin reaches (None until the consumer starts)."""
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", group_id="g")
    try:
        assert hasattr(consumer, "_coordinator")
        internals.request_rejoin(consumer)  # no coordinator yet: nothing happens
    finally:
        await consumer.stop()


async def test_a_consumer_made_elsewhere_reads_committed_records_once_set_before_start() -> None:
    """``_isolation_level`` is what the fetcher reads at start, and setting it before start sets it."""
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
    assert consumer._isolation_level == "read_uncommitted"
    assert internals.read_committed_before_start(consumer)
    assert consumer._isolation_level == "read_committed"
    assert "isolation_level" in inspect.signature(Fetcher).parameters


async def test_a_dead_producers_begin_raises_what_dead_producer_errors_names() -> None:
    """Once the transaction manager is in FATAL_ERROR (its sender died), ``begin_transaction`` asserts."""
    producer = _transactional()
    try:
        manager = producer._txn_manager
        manager.set_pid_and_epoch(7, 0)
        manager._transition_to(TransactionState.FATAL_ERROR)
        with pytest.raises(internals.DEAD_PRODUCER_ERRORS):
            manager.begin_transaction()
    finally:
        await producer.stop()


async def test_generation_current_asks_the_coordinator_with_its_own_generation() -> None:
    """A Heartbeat with the coordinator's group, generation and member id: no error is True; an error is False and asks
    for a rejoin; no coordinator known, or a failed request, is None."""
    sent: list[Any] = []
    rejoined: list[bool] = []
    answer: list[Any] = [SimpleNamespace(error_code=0)]

    async def send_req(request: Any) -> Any:
        sent.append(request)
        if isinstance(answer[0], Exception):
            raise answer[0]
        return answer[0]

    coordinator = SimpleNamespace(
        coordinator_id=0,
        group_id="g",
        generation=7,
        member_id="m-1",
        _send_req=send_req,
        request_rejoin=lambda: rejoined.append(True),
    )
    consumer: Any = SimpleNamespace(_coordinator=coordinator)
    assert await internals.generation_current(consumer) is True
    assert isinstance(sent[0], HeartbeatRequest)
    assert (sent[0]._group, sent[0]._generation_id, sent[0]._member_id) == ("g", 7, "m-1")
    answer[0] = SimpleNamespace(error_code=UnknownMemberIdError.errno)
    assert await internals.generation_current(consumer) is False
    assert rejoined == [True]
    answer[0] = RequestTimedOutError()
    assert await internals.generation_current(consumer) is None
    coordinator.coordinator_id = None
    assert await internals.generation_current(consumer) is None
    assert await internals.generation_current(SimpleNamespace(_coordinator=None)) is None


def test_aiokafkas_coordinator_has_what_generation_current_reads() -> None:
    """The coordinator's fields and its request helper are where generation_current looks (aiokafka 0.14)."""
    source = inspect.getsource(GroupCoordinator)
    for name in (
        "self.generation",
        "self.member_id",
        "self.coordinator_id",
        "async def _send_req(self, request)",
    ):
        assert name in source, name
    assert (
        inspect.getsource(GroupCoordinator._do_heartbeat).count(
            "HeartbeatRequest(self.group_id, self.generation, self.member_id)"
        )
        == 1
    )


async def test_force_metadata_update_reaches_the_consumers_client() -> None:
    """``_client.force_metadata_update`` is what the metadata refresh after an unplanned topic awaits."""
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", group_id="g")
    try:
        assert callable(consumer._client.force_metadata_update)
    finally:
        await consumer.stop()


def test_aiokafka_drops_a_topic_its_metadata_answer_gives_an_error_for() -> None:
    """Why a leader can lack its input's partitions: an answer with LEADER_NOT_AVAILABLE (a broker loading its
    logs after a restart) removes the topic from the cluster metadata, and its partitions are unknown."""
    cluster = ClusterMetadata()
    broker = [(0, "b", 9092, None)]
    known = MetadataResponse_v1(broker, 0, [(0, "raw", False, [(0, 0, 0, [0], [0])])])
    cluster.update_metadata(known)
    assert cluster.partitions_for_topic("raw") == {0}
    cluster.update_metadata(
        MetadataResponse_v1(broker, 0, [(LeaderNotAvailableError.errno, "raw", False, [])])
    )
    assert cluster.partitions_for_topic("raw") is None

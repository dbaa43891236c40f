"""What pipeline/kafka/internals/ relies on inside aiokafka 0.14: each test fails when aiokafka changes it."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from io import BytesIO
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import CoordinationType
from aiokafka.cluster import ClusterMetadata
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    LeaderNotAvailableError,
    NotCoordinatorForGroupError,
    ProducerFenced,
    RequestTimedOutError,
    UnknownMemberIdError,
)
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.producer.transaction_manager import TransactionManager, TransactionResult, TransactionState
from aiokafka.protocol.group import HeartbeatRequest
from aiokafka.protocol.metadata import MetadataResponse_v1
from aiokafka.structs import OffsetAndMetadata

from pipeline.errors import GroupGenerationFencedError, PipelineError
from pipeline.kafka import internals
from pipeline.kafka.internals import group_offsets
from pipeline.kafka.requests import GroupMetadata, MetadataResponseV12

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


# -- eos-v2: TxnOffsetCommit v3 through one producer's sender ---------------------------------------

GROUP = GroupMetadata("g", 4, "member-1", None)


def _in_transaction(producer: AIOKafkaProducer) -> Any:
    """The producer's transaction manager with a transaction open that holds a partition and the group."""
    manager = producer._txn_manager
    manager.set_pid_and_epoch(7, 2)
    manager.begin_transaction()
    manager.maybe_add_partition_to_txn(TP)
    manager.partition_added(TP)
    manager.consumer_group_added(GROUP.group_id)
    return manager


async def _queued(producer: AIOKafkaProducer, offsets: dict[TopicPartition, int]) -> asyncio.Task[None]:
    """send_offsets_with_group_metadata started: its offsets queued in the transaction manager."""
    task = asyncio.ensure_future(internals.send_offsets_with_group_metadata(producer, offsets, GROUP))
    await asyncio.sleep(0)
    return task


def _v3_answer(*codes: int) -> Any:
    """A TxnOffsetCommit v3 answer for partitions 0.. of topic t, with these error codes."""
    return SimpleNamespace(topics=[("t", [(p, code, {}) for p, code in enumerate(codes)], {})])


def _handler(producer: AIOKafkaProducer) -> Any:
    """The v3 handler the hook would build for the offsets now queued."""
    offsets, group_id = producer._txn_manager.offsets_to_commit()
    return group_offsets._TxnOffsetCommitV3Handler(producer._sender, offsets, group_id)


async def test_the_hook_is_this_producers_own_and_aiokafkas_sender_looks_it_up_on_the_instance() -> None:
    """Only the producer offsets were sent through learns v3; aiokafka's sender calls ``self._do_txn_offset_commit``
    (an instance attribute shadows the method), and another producer's sender keeps aiokafka's."""
    assert "self._do_txn_offset_commit(offsets, group_id)" in inspect.getsource(
        aiokafka_sender.Sender._maybe_do_transactional_request
    )
    producer, other = _transactional(), _transactional()
    try:
        _in_transaction(producer)
        task = await _queued(producer, {TP: 5})
        assert isinstance(vars(producer._sender)["_do_txn_offset_commit"], group_offsets._GroupOffsetCommit)
        assert "_do_txn_offset_commit" not in vars(other._sender)
        task.cancel()
    finally:
        await producer.stop()
        await other.stop()


async def test_the_v3_request_carries_the_producer_and_the_group_metadata() -> None:
    """The request is built from the transaction manager's id and epoch and the queued offsets' group metadata."""
    producer = _transactional()
    try:
        _in_transaction(producer)
        task = await _queued(producer, {TP: 5, TopicPartition("t", 1): 6})
        struct = _handler(producer).create_request().prepare({28: (0, 5)})
        assert (struct.API_VERSION, struct.transactional_id, struct.producer_id, struct.producer_epoch) == (
            3,
            "pinned",
            7,
            2,
        )
        assert (struct.group_id, struct.generation_id, struct.member_id) == ("g", 4, "member-1")
        assert struct.topics == [("t", [(0, 5, -1, "", {}), (1, 6, -1, "", {})], {})]
        task.cancel()
    finally:
        await producer.stop()


async def test_offsets_the_coordinator_takes_complete_the_call() -> None:
    """An answer without errors marks each offset committed; the caller's await returns."""
    producer = _transactional()
    try:
        manager = _in_transaction(producer)
        task = await _queued(producer, {TP: 5})
        assert _handler(producer).handle_response(_v3_answer(0)) is None
        await task
        assert manager.state is TransactionState.IN_TRANSACTION
    finally:
        await producer.stop()


@pytest.mark.parametrize(
    "code", [22, 25, 82], ids=["illegal-generation", "unknown-member", "fenced-instance"]
)
async def test_offsets_refused_for_the_generation_leave_a_transaction_that_aborts_on_the_broker(
    code: int,
) -> None:
    """A refusal for the group metadata fails the call and the commit with GroupGenerationFencedError; the
    transaction keeps its partitions and group, so abort_transaction sends an EndTxn (it is not local)."""
    producer = _transactional()
    try:
        manager = _in_transaction(producer)
        task = await _queued(producer, {TP: 5})
        assert _handler(producer).handle_response(_v3_answer(code)) is None
        with pytest.raises(GroupGenerationFencedError, match=f"error {code}"):
            await task
        assert manager.state is TransactionState.ABORTABLE_ERROR
        assert not internals.abort_would_be_local(producer)
        with pytest.raises(GroupGenerationFencedError):
            await producer.commit_transaction()
        assert not manager.is_in_transaction()  # what makes send and send_batch raise IllegalOperation
        manager.aborting_transaction()  # what abort_transaction does first: allowed from ABORTABLE_ERROR
        assert manager.needs_transaction_commit() == TransactionResult.ABORT
        assert not manager.is_empty_transaction()  # aiokafka's sender sends EndTxn(ABORT) for it
    finally:
        await producer.stop()


async def test_a_consumer_in_no_generation_commits_nothing() -> None:
    """Group metadata without a generation (not joined, or forgotten by the coordinator) would be taken as a
    plain v0 commit by the coordinator: refused before it is sent, the transaction left abortable."""
    producer = _transactional()
    try:
        manager = _in_transaction(producer)
        with pytest.raises(GroupGenerationFencedError, match="in no generation"):
            await internals.send_offsets_with_group_metadata(
                producer, {TP: 5}, GroupMetadata("g", -1, "", None)
            )
        assert manager.state is TransactionState.ABORTABLE_ERROR
        assert manager.offsets_to_commit() is None
    finally:
        await producer.stop()


async def test_a_coordinator_elsewhere_is_found_again_and_a_fence_kills_the_sender() -> None:
    """NOT_COORDINATOR: the group coordinator is forgotten and the offsets sent again after the backoff;
    INVALID_PRODUCER_EPOCH and PRODUCER_FENCED raise ProducerFenced (the sender dies of it, as for aiokafka's own)."""
    producer = _transactional()
    try:
        _in_transaction(producer)
        task = await _queued(producer, {TP: 5})
        producer._sender._coordinators[CoordinationType.GROUP] = 0
        assert _handler(producer).handle_response(_v3_answer(NotCoordinatorForGroupError.errno)) == 0.1
        assert CoordinationType.GROUP not in producer._sender._coordinators
        assert _handler(producer).handle_response(_v3_answer(14)) == 0.1  # loading: again
        for code in (47, 90):
            with pytest.raises(ProducerFenced):
                _handler(producer).handle_response(_v3_answer(code))
        task.cancel()
    finally:
        await producer.stop()


async def test_offsets_sent_plainly_still_go_as_aiokafkas_v0() -> None:
    """Offsets queued by ``send_offsets_to_transaction`` on a hooked producer go through aiokafka's own method."""
    producer = _transactional()
    try:
        _in_transaction(producer)
        hooked = await _queued(producer, {TP: 5})
        plain: list[Any] = []

        async def aiokafkas(offsets: Any, group_id: str) -> None:
            plain.append((dict(offsets), group_id))

        hook = group_offsets._GroupOffsetCommit(producer._sender, aiokafkas)
        await hook({TP: OffsetAndMetadata(3, "")}, "g")
        assert plain == [({TP: OffsetAndMetadata(3, "")}, "g")]
        hooked.cancel()
    finally:
        await producer.stop()


def test_what_the_hook_relies_on_in_aiokafkas_transaction_manager_and_handler() -> None:
    """The manager queues the offsets object itself (the hook finds its group metadata on it), keeps its waiter
    and pending offsets where _fail_abortable reaches them, and the handler takes (sender, offsets, group id)."""
    assert list(inspect.signature(aiokafka_sender.TxnOffsetCommitHandler).parameters) == [
        "sender",
        "offsets",
        "group_id",
    ]
    source = inspect.getsource(TransactionManager)
    for name in (
        "self._pending_txn_offsets.append((group_id, offsets, fut))",
        "self._transaction_waiter = create_future()",
        "def _transition_to(self, target)",
        "self._transaction_waiter.result()",
    ):
        assert name in source, name
    assert "CoordinationType.GROUP, group_id" in inspect.getsource(
        aiokafka_sender.Sender._do_txn_offset_commit
    )


def test_group_metadata_reads_the_coordinators_generation_member_and_instance() -> None:
    """The group metadata is the coordinator's fields now; a consumer without a group coordinator has none."""
    assert "self._group_instance_id = group_instance_id" in inspect.getsource(GroupCoordinator.__init__)
    coordinator = SimpleNamespace(group_id="g", generation=9, member_id="m-1", _group_instance_id="i-1")
    consumer: Any = SimpleNamespace(_coordinator=coordinator)
    assert internals.group_metadata(consumer) == GroupMetadata("g", 9, "m-1", "i-1")
    with pytest.raises(PipelineError, match="no group coordinator"):
        internals.group_metadata(SimpleNamespace(_coordinator=None))


async def test_kafka_client_is_the_client_under_a_producer_a_consumer_or_an_admin() -> None:
    """A producer's ``client``, a consumer's and an admin client's ``_client``; an AIOKafkaClient itself."""
    producer = _transactional()
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
    admin = AIOKafkaAdminClient(bootstrap_servers="127.0.0.1:1")
    try:
        assert internals.kafka_client(producer) is producer.client
        assert internals.kafka_client(consumer) is consumer._client
        assert internals.kafka_client(admin) is admin._client
        assert internals.kafka_client(producer.client) is producer.client
        with pytest.raises(PipelineError):
            internals.kafka_client(object())
    finally:
        await producer.stop()
        await consumer.stop()
        await admin.close()


async def test_group_request_finds_the_coordinator_then_sends_through_it() -> None:
    """A group request waits for the coordinator to be known, then goes through the coordinator's ``_send_req``."""
    calls: list[str] = []

    async def ensure() -> None:
        calls.append("ensure")

    async def send_req(request: Any) -> str:
        calls.append(f"send {request}")
        return "answer"

    coordinator = SimpleNamespace(generation=1, ensure_coordinator_known=ensure, _send_req=send_req)
    coordinator.coordinator_dead = lambda: calls.append("dead")
    consumer: Any = SimpleNamespace(_coordinator=coordinator)
    assert await internals.group_request(consumer, "req") == "answer"
    internals.group_coordinator_moved(consumer)
    assert calls == ["ensure", "send req", "dead"]
    assert callable(GroupCoordinator.ensure_coordinator_known)
    assert callable(GroupCoordinator.coordinator_dead)


def test_aiokafka_knows_no_fenced_instance_id_until_told_and_wraps_the_groups_errors_by_repr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """aiokafka 0.14 maps code 82 to UnknownError; once told it maps it to FencedInstanceIdError; its JoinGroup
    and SyncGroup handlers wrap an unexpected error as ``KafkaError(repr(err))`` and its heartbeat names it with
    ``!r``, which is what fenced_instance reads."""
    import aiokafka.consumer.group_coordinator as coordinator_module  # noqa: PLC0415
    import aiokafka.errors as aiokafka_errors  # noqa: PLC0415

    monkeypatch.setattr(aiokafka_errors, "kafka_errors", dict(aiokafka_errors.kafka_errors))
    assert aiokafka_errors.for_code(82) is aiokafka_errors.UnknownError
    internals.know_fenced_instance_id()
    assert aiokafka_errors.for_code(82) is internals.FencedInstanceIdError
    source = inspect.getsource(coordinator_module)
    assert source.count("raise Errors.KafkaError(repr(err))") == 2
    assert "Unexpected exception in heartbeat task: {error_type()!r}" in source


def test_aiokafka_knows_no_invalid_record_until_told_and_its_sender_fails_a_batch_with_the_codes_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """aiokafka 0.14 maps code 87 to UnknownError; once told, to InvalidRecordError, not retriable, which its
    sender raises for a refused batch as ``error()`` (what the worker's bisection then isolates)."""
    import aiokafka.errors as aiokafka_errors  # noqa: PLC0415
    from aiokafka.producer import sender as sender_module  # noqa: PLC0415

    monkeypatch.setattr(aiokafka_errors, "kafka_errors", dict(aiokafka_errors.kafka_errors))
    assert aiokafka_errors.for_code(87) is aiokafka_errors.UnknownError
    internals.know_invalid_record()
    assert aiokafka_errors.for_code(87) is internals.InvalidRecordError
    assert not internals.InvalidRecordError.retriable
    assert "compacted topic" in repr(internals.InvalidRecordError())
    source = inspect.getsource(sender_module)
    assert "error = Errors.for_code(error_code)" in source
    assert "exc = error()" in source

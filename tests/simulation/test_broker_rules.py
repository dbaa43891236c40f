"""The broker model's rules for one producer per worker (eos-v2, KIP-447), each a short scenario: a transaction's
offsets are fenced by the group's generation, a stable read waits for a pending transaction, and the transaction
coordinator aborts a transaction that outlived its timeout. Requests go through the wire layer as the clients'
structs, encoded and decoded as on the wire."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from io import BytesIO
from random import Random
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import ProducerFenced
from aiokafka.protocol.commit import OffsetFetchRequest as AiokafkaOffsetFetch
from aiokafka.protocol.transaction import TxnOffsetCommitRequest as AiokafkaTxnOffsetCommit

from pipeline.errors import GroupGenerationFencedError
from pipeline.kafka import internals
from pipeline.kafka.fencing import fence_transactional_id
from pipeline.kafka.requests import (
    GroupMetadata,
    OffsetFetchRequest,
    TxnOffsetCommitRequest,
    read_offset_fetch,
)
from pipeline.kafka.stable_offsets import committed_stable
from tests.simulation import broker as b
from tests.simulation import codes, logs, wire
from tests.simulation.loop import SimLoop, virtual_time

GROUP, TXN = "group", "worker-1"
TP = TopicPartition("raw", 0)


class Model:
    """A broker model on its own loop, with a transactional id initialised and a group to join."""

    def __init__(self) -> None:
        self.loop = SimLoop(max_time=1000.0, max_steps=200_000)  # type: ignore[abstract]
        self.trace: list[str] = []
        self.broker = b.Broker(self.loop, Random(7), self.trace.append)
        self.broker.start()

    def run(self, scenario: Callable[[Model], Awaitable[None]]) -> None:
        self.loop.run_until_complete(scenario(self))

    def run_clients(self, scenario: Callable[[Model], Awaitable[None]], seed: int = 3) -> wire.Network:
        """Run ``scenario`` with aiokafka's clients connected to the model (virtual time, the simulated
        network); the network, whose ``errors`` are the model's own failures."""
        network = wire.Network(self.broker, Random(seed))
        asyncio.set_event_loop(self.loop)
        try:
            with virtual_time(self.loop), wire.installed(network):
                self.run(scenario)
        finally:
            asyncio.set_event_loop(None)
        return network

    async def send(self, request: Any) -> Any:
        """``request`` as a client sends it: prepared at the versions the model serves, off the wire and back."""
        struct = request.prepare(wire.VERSIONS)
        struct = type(struct).decode(BytesIO(struct.encode()))
        response = await wire.handle(self.broker, struct, "client")
        return type(response).decode(BytesIO(response.encode()))

    async def join(self, *members: str) -> dict[str, int]:
        """``members`` (member ids the model gave, and "" for each new one) join one generation: the new ones
        first (the group waits for its known members to rejoin), then the known ones; each one's generation."""
        args = ("client", None, 10_000, 10_000, "consumer", [("range", b"")])
        new = [
            (await self.broker.coordinator.join(GROUP, "", *args))["member_id"]
            for member in members
            if not member
        ]
        joins = [
            self.broker.coordinator.join(GROUP, member, *args) for member in [*new, *filter(None, members)]
        ]
        answers = await asyncio.gather(*joins)
        assert all(answer["error"] == codes.NONE for answer in answers), answers
        return {answer["member_id"]: int(answer["generation"]) for answer in answers}

    def begin(self, timeout_ms: int = 60_000) -> tuple[int, int]:
        """A transaction of TXN holding the group's offsets (InitProducerId, AddOffsetsToTxn): (producer id, epoch)."""
        error, pid, epoch = self.broker.transactions.init_producer_id(TXN, timeout_ms)
        assert error == codes.NONE
        assert self.broker.transactions.add_offsets(TXN, pid, epoch, GROUP) == codes.NONE
        return pid, epoch

    async def commit_offsets(
        self, producer: tuple[int, int], offset: int, member: GroupMetadata | None
    ) -> int:
        """TxnOffsetCommit of ``offset`` for TP: v3 with ``member``, or aiokafka's v0 when None; the error code."""
        pid, epoch = producer
        if member is None:
            answer = await self.send(
                AiokafkaTxnOffsetCommit(TXN, GROUP, pid, epoch, [(TP.topic, [(0, offset, "")])])
            )
            return int(answer.errors[0][1][0][1])
        answer = await self.send(TxnOffsetCommitRequest(TXN, pid, epoch, member, {TP: (offset, "")}))
        return int(answer.topics[0][1][0][1])

    async def stable(self) -> tuple[dict[TopicPartition, int | None], list[TopicPartition]]:
        """An OffsetFetch v7 require_stable of TP: (committed, asked again)."""
        answer = read_offset_fetch(
            await self.send(OffsetFetchRequest(GROUP, [TP], require_stable=True)), [TP]
        )
        return answer.committed, answer.again

    async def plain(self) -> int:
        """aiokafka's own OffsetFetch (v3): TP's committed offset, -1 for none."""
        answer = await self.send(AiokafkaOffsetFetch(GROUP, [(TP.topic, [TP.partition])]))
        return int(answer.topics[0][1][0][1])

    async def end(self, producer: tuple[int, int], *, commit: bool) -> int:
        """EndTxn, and a moment for the markers to be written."""
        error = self.broker.transactions.end_txn(TXN, *producer, commit)
        await asyncio.sleep(0.1)
        return error


def test_offsets_of_a_generation_a_rebalance_ended_are_refused() -> None:
    """A member's offsets carrying the generation before a rebalance are refused ILLEGAL_GENERATION, and nothing is
    pending; the same member with the new generation commits."""

    async def scenario(model: Model) -> None:
        first = next(iter(await model.join("")))
        generations = await model.join(first, "")
        assert generations[first] == 2
        producer = model.begin()
        stale = GroupMetadata(GROUP, 1, first, None)
        assert await model.commit_offsets(producer, 5, stale) == codes.ILLEGAL_GENERATION
        assert model.broker.group(GROUP).pending_offsets == {}
        assert await model.commit_offsets(producer, 5, GroupMetadata(GROUP, 2, first, None)) == codes.NONE
        assert await model.end(producer, commit=True) == codes.NONE
        assert await model.plain() == 5

    Model().run(scenario)


def test_offsets_of_a_member_the_group_does_not_have_are_refused() -> None:
    """UNKNOWN_MEMBER_ID for a member id the group does not have (a member whose session expired), even with the
    current generation; ILLEGAL_GENERATION for a generation of a group that never existed."""

    async def scenario(model: Model) -> None:
        producer = model.begin()
        assert (
            await model.commit_offsets(producer, 5, GroupMetadata(GROUP, 1, "gone", None))
            == codes.ILLEGAL_GENERATION
        )
        await model.join("")
        assert (
            await model.commit_offsets(producer, 5, GroupMetadata(GROUP, 1, "gone", None))
            == codes.UNKNOWN_MEMBER_ID
        )

    Model().run(scenario)


def test_a_static_member_replaced_under_its_instance_id_is_fenced() -> None:
    """Offsets carrying a group instance id whose member is now another member id: FENCED_INSTANCE_ID."""

    async def scenario(model: Model) -> None:
        member = next(iter(await model.join("")))
        model.broker.group(GROUP).members[member].instance_id = "instance-1"
        producer = model.begin()
        zombie = GroupMetadata(GROUP, 1, "an-older-member-id", "instance-1")
        assert await model.commit_offsets(producer, 5, zombie) == codes.FENCED_INSTANCE_ID
        assert (
            await model.commit_offsets(producer, 5, GroupMetadata(GROUP, 1, member, "instance-1"))
            == codes.NONE
        )

    Model().run(scenario)


def test_offsets_that_name_no_member_are_taken_as_before() -> None:
    """aiokafka's v0, which names no member, is taken while the group has members (the workers before eos-v2)."""

    async def scenario(model: Model) -> None:
        await model.join("")
        producer = model.begin()
        assert await model.commit_offsets(producer, 4, None) == codes.NONE
        assert await model.end(producer, commit=True) == codes.NONE
        assert await model.plain() == 4

    Model().run(scenario)


def test_a_stable_read_is_refused_while_a_transaction_holds_the_offsets_then_gets_its_outcome() -> None:
    """From TxnOffsetCommit to the markers, require_stable answers UNSTABLE_OFFSET_COMMIT (a plain read the old
    offset); after the commit's markers the new offset, after an abort's the old one."""

    async def scenario(model: Model) -> None:
        producer = model.begin()
        assert await model.commit_offsets(producer, 3, None) == codes.NONE
        assert await model.stable() == ({}, [TP])
        assert await model.plain() == -1
        assert await model.end(producer, commit=True) == codes.NONE
        assert await model.stable() == ({TP: 3}, [])

        producer = model.begin()
        assert await model.commit_offsets(producer, 9, None) == codes.NONE
        assert await model.stable() == ({}, [TP])
        assert await model.end(producer, commit=False) == codes.NONE
        assert await model.stable() == ({TP: 3}, [])

    Model().run(scenario)


def test_the_markers_not_yet_written_still_hold_the_offsets() -> None:
    """Between EndTxn and its markers (PrepareCommit) the offsets are still pending: the stable read waits."""

    async def scenario(model: Model) -> None:
        producer = model.begin()
        await model.commit_offsets(producer, 3, None)
        model.broker.transactions.marker_delay = (0.5, 0.5)
        assert model.broker.transactions.end_txn(TXN, *producer, True) == codes.NONE
        assert await model.stable() == ({}, [TP])
        await asyncio.sleep(0.6)
        assert await model.stable() == ({TP: 3}, [])

    Model().run(scenario)


def test_the_coordinator_aborts_a_transaction_that_outlived_its_timeout() -> None:
    """A transaction open past its timeout is aborted at the coordinator's next scan (every 10 s): its offsets are
    dropped (the stable read answers the old offset) and its producer's epoch is bumped (its EndTxn is fenced)."""

    async def scenario(model: Model) -> None:
        producer = model.begin(timeout_ms=2_000)
        assert await model.commit_offsets(producer, 3, None) == codes.NONE
        await asyncio.sleep(5)
        assert await model.stable() == ({}, [TP])  # past its timeout, not yet found by the scan
        await asyncio.sleep(6)
        assert await model.stable() == ({TP: None}, [])
        assert model.broker.transactions.end_txn(TXN, *producer, True) == codes.INVALID_PRODUCER_EPOCH
        assert any("timed out, aborted" in line for line in model.trace)

    Model().run(scenario)


def test_the_pipelines_eos_v2_calls_work_through_aiokafkas_clients_on_the_model() -> None:
    """What the worker will call, through aiokafka's real producer and consumer on the simulated network: offsets
    with the group metadata commit, a stale generation's are refused and the transaction aborts, the stable read
    gets the committed offset, and fencing a transactional id fences its producer."""
    model = Model()
    model.broker.create_topic(TP.topic, 1, logs.TopicConfig())
    bootstrap = f"{wire.HOST}:{wire.PORT}"

    async def scenario(model: Model) -> None:
        consumer = AIOKafkaConsumer(
            TP.topic, bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False
        )
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=TXN)
        old = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="app-group-raw-0")
        await consumer.start()
        await producer.start()
        await old.start()
        try:
            while not consumer.assignment():
                await consumer.getmany(timeout_ms=100)
            current = internals.group_metadata(consumer)
            async with producer.transaction():
                await internals.send_offsets_with_group_metadata(producer, {TP: 2}, current)
            assert await committed_stable(consumer, [TP]) == {TP: 2}

            stale = GroupMetadata(GROUP, current.generation_id - 1, current.member_id, None)
            await producer.begin_transaction()
            with pytest.raises(GroupGenerationFencedError):
                await internals.send_offsets_with_group_metadata(producer, {TP: 5}, stale)
            await producer.abort_transaction()
            assert await committed_stable(consumer, [TP]) == {TP: 2}

            await old.begin_transaction()
            await old.send_and_wait(TP.topic, b"held", partition=0)
            await fence_transactional_id(producer, "app-group-raw-0")
            with pytest.raises(ProducerFenced):
                await old.commit_transaction()
        finally:
            await old.stop()
            await producer.stop()
            await consumer.stop()

    assert not model.run_clients(scenario).errors


def test_a_static_member_joining_under_a_known_instance_id_replaces_the_member_that_had_it() -> None:
    """KIP-345: a JoinGroup under an instance id with no member id gets an id at once (no MEMBER_ID_REQUIRED) and
    replaces the member the group knew by it; that member's JoinGroup and SyncGroup are then answered
    FENCED_INSTANCE_ID, its heartbeat (no instance id: aiokafka's v1) UNKNOWN_MEMBER_ID."""

    async def scenario(model: Model) -> None:
        args = ("client", None, 10_000, 10_000, "consumer", [("range", b"")])
        first = await model.broker.coordinator.join(GROUP, "", *args, instance_id="w0")
        assert first["error"] == codes.NONE
        old = first["member_id"]
        assert old.startswith("w0-")
        joining = asyncio.ensure_future(model.broker.coordinator.join(GROUP, "", *args, instance_id="w0"))
        second = await joining
        new = second["member_id"]
        assert (second["error"], new != old) == (codes.NONE, True)
        assert list(model.broker.group(GROUP).members) == [new]
        assert (await model.broker.coordinator.join(GROUP, old, *args, instance_id="w0"))[
            "error"
        ] == codes.FENCED_INSTANCE_ID
        synced = await model.broker.coordinator.sync(GROUP, second["generation"], old, [], instance_id="w0")
        assert synced["error"] == codes.FENCED_INSTANCE_ID
        assert model.broker.coordinator.heartbeat(GROUP, second["generation"], old) == codes.UNKNOWN_MEMBER_ID
        assert (
            await model.broker.coordinator.sync(
                GROUP, second["generation"], new, [(new, b"a")], instance_id="w0"
            )
        ) == {
            "error": codes.NONE,
            "assignment": b"a",
        }
        assert model.broker.coordinator.heartbeat(GROUP, second["generation"], new, "w0") == codes.NONE

    Model().run(scenario)


def test_a_corrupt_fault_refuses_one_produce_of_its_transactional_id_and_never_two_within_five_seconds() -> (
    None
):
    """An injected corrupt fault answers the next produce of its transactional id CORRUPT_MESSAGE, once; another
    injected within 5 s of it is spent without a refusal (the redo of the refused records is taken), one later refuses."""

    async def scenario(model: Model) -> None:
        pid, _ = model.begin()
        assert model.broker._corrupt(pid) == codes.NONE  # nothing injected
        model.broker.inject("corrupt", "produce", TXN)
        assert model.broker._corrupt(pid) == codes.CORRUPT_MESSAGE
        assert model.broker._corrupt(pid) == codes.NONE
        model.broker.inject("corrupt", "produce", TXN)
        await asyncio.sleep(b.CORRUPT_APART_S - 1)
        assert model.broker._corrupt(pid) == codes.NONE
        assert model.broker.injected == []
        await asyncio.sleep(2)
        model.broker.inject("corrupt", "produce", TXN)
        assert model.broker._corrupt(pid) == codes.CORRUPT_MESSAGE

    Model().run(scenario)


def test_a_lost_commit_takes_the_commit_loses_its_reply_and_fences_the_id_before_the_retry() -> None:
    """The lost-commit fault: the EndTxn completes the commit (its offsets land), its reply is to be lost, and
    another producer takes the transactional id once the markers are written, so the retry is answered fenced."""

    async def scenario(model: Model) -> None:
        producer = model.begin()
        assert await model.commit_offsets(producer, 3, None) == codes.NONE
        model.broker.inject("lost-commit", "end-txn-lost", TXN)
        assert await model.end(producer, commit=True) == codes.NONE
        assert model.broker.lose_reply
        assert await model.stable() == ({TP: 3}, [])
        assert model.broker.transactions.end_txn(TXN, *producer, True) == codes.INVALID_PRODUCER_EPOCH
        assert model.broker.injected == []

    Model().run(scenario)

"""What a worker asks of its outside world as it starts and runs: each client built from its own settings, the
topic layout of its bootstrap servers and topology (again when a limit refuses a record), its transactional id."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from pathlib import Path
from typing import Any

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocol
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError

from pipeline import topology as topology_module
from pipeline.errors import BrokerUnavailableError, PipelineError
from pipeline.headers import ORIGINAL_TIMESTAMP_HEADER
from pipeline.kafka.topic_layout import TopicLayout
from pipeline.state.store import PartitionStore
from pipeline.worker.clients import worker_transactional_id
from pipeline.worker.health import STOPPED
from pipeline.worker.loop import Worker
from tests.unit.worker.test_assignor import Cluster
from tests.unit.worker.test_loop import eventually

from .fakes import (
    ROOT,
    T0,
    TOPICS,
    TOPOLOGY,
    FakeConsumer,
    body,
    fake_io,
    keys_for,
    layout,
    record,
    records,
    settings,
    tp,
)

TP0 = tp(0)


_eventually = functools.partial(eventually, timeout=5.0)  # a start under load takes longer


async def test_a_worker_builds_every_client_from_its_settings_and_reads_the_layout_again_after_a_refusal(
    tmp_path: Path,
) -> None:
    """The layout of its bootstrap servers and topology at start, and again when the broker refuses a record for
    its size; the consumer, the producer (under the worker's transactional id) and the changelog reader made with
    the worker's settings, its group resolved to the app's name."""
    io, clients = fake_io(consumer=FakeConsumer(assign={TP0}, logs={}))
    limits: dict[str, str] = {}
    asked: dict[str, list[Any]] = {"layout": [], "consumer": [], "producer": [], "reader": []}

    async def topic_layout(bootstrap: str, topology: Any) -> Any:
        asked["layout"].append((bootstrap, topology))
        return layout(limits)

    def consumer(given: Any, **_kwargs: Any) -> FakeConsumer:
        asked["consumer"].append(given)
        return clients.consumer

    def producer(given: Any, transactional_id: str) -> Any:
        asked["producer"].append((given, transactional_id))
        return clients.producers(given, transactional_id)

    def reader(given: Any) -> Any:
        asked["reader"].append(given)
        return clients.reader

    io = dataclasses.replace(
        io, layout=topic_layout, consumer=consumer, producer=producer, changelog_reader=reader
    )
    given = settings(tmp_path, bootstrap="kafka-1:9092", commit_policy="caught-up", commit_interval=4.0)
    worker = Worker(given, TOPOLOGY, io=io)
    await worker.start()
    task = asyncio.create_task(worker.run())
    try:
        await _eventually(lambda: (t := worker.tasks.get(TP0)) is not None and t.serving, what="partition 0")
        expected_id = worker_transactional_id(given, TOPOLOGY.app)
        assert worker.transactional_id == expected_id
        assert worker.settings.group == TOPOLOGY.app
        assert asked["layout"] == [("kafka-1:9092", TOPOLOGY)]
        assert asked["consumer"] == [worker.settings]
        assert asked["producer"] == [(worker.settings, expected_id)]
        assert asked["reader"]
        assert all(s == worker.settings for s in asked["reader"])
        limits[TOPICS.commands] = "5000"
        made = clients.producers.latest()
        made.fail_commit_if = lambda sent: next(
            (MessageSizeTooLargeError() for s in sent if s.topic == TOPICS.commands and len(s.value) > 5000),
            None,
        )
        key = keys_for(0, 1)[0]
        clients.consumer.logs[TP0].append(record(0, key, value=body(key, pad=6000)))
        await _eventually(
            lambda: clients.producers.latest().committed_offset() == 1, what="the record committed"
        )
        assert asked["layout"] == [("kafka-1:9092", TOPOLOGY)] * 2
    finally:
        worker.stop()
        await asyncio.wait_for(task, 5)
    assert clients.producers.latest().stopped
    assert clients.consumer.stopped
    assert clients.reader.started >= 1
    assert clients.reader.stopped == clients.reader.started
    assert worker.health() == STOPPED


async def test_a_worker_not_started_says_so() -> None:
    """run() before start(): the worker is not started."""
    worker = Worker(settings(Path("unused")), TOPOLOGY, io=fake_io()[0])
    with pytest.raises(PipelineError) as raised:
        await worker.run()
    assert str(raised.value) == "the worker is not started"


def test_a_worker_not_started_describes_no_standbys() -> None:
    """Before start() there is no standby to describe (what /partitions shows is empty), and asking does not fail."""
    worker = Worker(settings(Path("unused")), TOPOLOGY, io=fake_io()[0])
    assert worker.standby_states() == {}


async def test_a_topology_with_effects_has_its_worker_consume_the_effects_topic_too(tmp_path: Path) -> None:
    """A topology with effects: the worker subscribes to its input topic and to its effects topic."""
    shop = topology_module.load(ROOT / "topologies" / "stripe-fulfilment.toml")
    topics = shop.topics
    names = [
        topics.input,
        topics.commands,
        topics.audit,
        topics.dlq,
        topics.changelog,
        topics.effects,
        topics.effects_changelog,
        *shop.command_topics(),
    ]

    async def shop_layout(_bootstrap: str, _topology: Any) -> TopicLayout:
        return TopicLayout(
            dict.fromkeys(names, 6), dict.fromkeys(names, 4 * 1024 * 1024), {}, "fake-cluster", {}
        )

    io, clients = fake_io()
    worker = Worker(
        settings(tmp_path, topology=ROOT / "topologies" / "stripe-fulfilment.toml"),
        shop,
        io=dataclasses.replace(io, layout=shop_layout),
    )
    await worker.start()
    worker.stop()
    await asyncio.wait_for(worker.run(), 5)
    assert clients.consumer.topics == [topics.input, topics.effects]


async def test_a_worker_whose_layout_cannot_be_read_fails_with_that_error_and_frees_its_state_dir(
    tmp_path: Path,
) -> None:
    """The broker away as the worker reads its topics: start() raises that error (nothing else was started to
    stop), and the state dir is free for the next start."""
    io, _clients = fake_io(consumer=FakeConsumer(assign=set()))

    async def away(_bootstrap: str, _topology: Any) -> TopicLayout:
        raise KafkaConnectionError("no broker")

    failing = Worker(settings(tmp_path), TOPOLOGY, io=dataclasses.replace(io, layout=away))
    with pytest.raises(KafkaConnectionError):
        await failing.start()
    again = Worker(settings(tmp_path), TOPOLOGY, io=io)
    await again.start()
    again.stop()
    await asyncio.wait_for(again.run(), 5)


async def test_records_are_dated_against_the_workers_own_clock(tmp_path: Path) -> None:
    """The worker's clock (its io's ``wall``) two hours behind the records, the skew bound one hour: each record
    counts as dated too far ahead of it."""
    io, clients = fake_io(consumer=FakeConsumer(assign={TP0}, logs={TP0: records(0, 0, keys_for(0, 2))}))
    io = dataclasses.replace(io, wall=lambda: T0 / 1000 - 7200)
    worker = Worker(settings(tmp_path, max_clock_skew=3600.0, commit_policy="caught-up"), TOPOLOGY, io=io)
    await worker.start()
    task = asyncio.create_task(worker.run())
    try:
        await _eventually(lambda: clients.producers.latest().committed_offset() == 2, what="both committed")
        assert worker.metrics.registry.get_sample_value("pipeline_clock_skewed_records_total") == 2
    finally:
        worker.stop()
        await asyncio.wait_for(task, 5)


async def test_commands_dated_outside_what_their_topic_takes_are_stamped_with_the_workers_clock(
    tmp_path: Path,
) -> None:
    """The commands topic takes timestamps within an hour of the broker's clock: the worker's clock ten days past
    the records, each command is stamped with that clock, its own time kept in the original-timestamp header."""
    now = T0 + 10 * 86_400_000
    counts = layout()

    async def bounded(_bootstrap: str, _topology: Any) -> TopicLayout:
        return dataclasses.replace(counts, timestamps={TOPICS.commands: (3_600_000, 3_600_000)})

    io, clients = fake_io(consumer=FakeConsumer(assign={TP0}, logs={TP0: records(0, 0, keys_for(0, 2))}))
    io = dataclasses.replace(io, layout=bounded, wall=lambda: now / 1000)
    worker = Worker(settings(tmp_path, commit_policy="caught-up"), TOPOLOGY, io=io)
    await worker.start()
    task = asyncio.create_task(worker.run())
    try:
        await _eventually(lambda: clients.producers.latest().committed_offset() == 2, what="both committed")
        commands = clients.producers.latest().committed_to(TOPICS.commands)
        assert [c.timestamp for c in commands] == [now, now]
        assert [dict(c.headers)[ORIGINAL_TIMESTAMP_HEADER] for c in commands] == [
            str(T0).encode(),
            str(T0 + 1).encode(),
        ]
    finally:
        worker.stop()
        await asyncio.wait_for(task, 5)


async def test_a_consumer_that_cannot_reach_the_broker_is_the_broker_unavailable_naming_where(
    tmp_path: Path,
) -> None:
    """The group consumer cannot start: start() raises BrokerUnavailableError naming the bootstrap servers."""
    consumer = FakeConsumer(assign=set())

    async def away() -> None:
        raise KafkaConnectionError("no broker")

    consumer.start = away  # type: ignore[method-assign]
    io, _clients = fake_io(consumer=consumer)
    worker = Worker(settings(tmp_path, bootstrap="kafka-1:9092"), TOPOLOGY, io=io)
    with pytest.raises(BrokerUnavailableError) as raised:
        await worker.start()
    assert str(raised.value).startswith("cannot reach Kafka at kafka-1:9092: ")


async def test_the_served_stores_are_opened_through_the_workers_io(tmp_path: Path) -> None:
    """The io's store opener opens the store of each partition the worker serves."""
    opened: list[Path] = []

    def opener(path: Path, **kwargs: Any) -> PartitionStore:
        opened.append(path)
        return PartitionStore.open(path, **kwargs)

    io, _clients = fake_io(consumer=FakeConsumer(assign={TP0}, logs={}))
    worker = Worker(settings(tmp_path), TOPOLOGY, io=dataclasses.replace(io, open_store=opener))
    await worker.start()
    task = asyncio.create_task(worker.run())
    try:
        await _eventually(lambda: (t := worker.tasks.get(TP0)) is not None and t.serving, what="partition 0")
        assert opened
        assert {path.name for path in opened} == {f"{TOPICS.input}-0"}
    finally:
        worker.stop()
        await asyncio.wait_for(task, 5)


async def test_a_workers_records_travel_before_the_commit_once_a_batch_reaches_its_send_bytes(
    tmp_path: Path,
) -> None:
    """send_bytes 1 KiB and a command of some 6 KB: the command is sent while its transaction is still open (its
    commit 30 s away), not held back for the commit."""
    key = keys_for(0, 1)[0]
    logs = {TP0: [record(0, key, value=body(key, pad=6000))]}
    io, clients = fake_io(consumer=FakeConsumer(assign={TP0}, logs=logs))
    given = settings(
        tmp_path, send_bytes=1024, commit_policy="interval", commit_interval=30.0, transaction_timeout=60.0
    )
    worker = Worker(given, TOPOLOGY, io=io)
    await worker.start()
    task = asyncio.create_task(worker.run())
    try:
        await _eventually(
            lambda: any(s.topic == TOPICS.commands for s in clients.producers.latest().pending),
            what="the command sent in the open transaction",
        )
        assert clients.producers.latest().committed == []
    finally:
        worker.stop()
        await asyncio.wait_for(task, 5)


class _RefreshingConsumer(FakeConsumer):
    """A group consumer whose client's metadata can be refreshed and whose coordinator can be asked to rejoin."""

    def __init__(self) -> None:
        super().__init__(assign=set())
        self.updates = 0
        self.rejoins = 0
        self._client = self
        self._coordinator = self

    async def force_metadata_update(self) -> bool:
        self.updates += 1
        return True

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return {0, 1} if self.updates else None

    def request_rejoin(self) -> None:
        self.rejoins += 1


async def test_a_worker_that_led_a_rebalance_without_a_topics_partitions_refreshes_its_metadata_and_rejoins(
    tmp_path: Path,
) -> None:
    """The worker's assignor, leading a rebalance whose metadata lacks the input topic, has the worker's own
    consumer refresh its metadata and rejoin the group."""
    consumer = _RefreshingConsumer()
    io, _clients = fake_io(consumer=consumer)
    assignors: list[Any] = []

    def made(_settings: Any, **kwargs: Any) -> FakeConsumer:
        assignors.append(kwargs["assignor"])
        return consumer

    worker = Worker(settings(tmp_path), TOPOLOGY, io=dataclasses.replace(io, consumer=made))
    await worker.start()
    task = asyncio.create_task(worker.run())
    try:
        (assignor,) = assignors
        member = ConsumerProtocol.METADATA.decode(assignor.metadata([TOPICS.input]).encode())
        assignor.assign(Cluster({}), {"member-1": member})
        await _eventually(lambda: consumer.rejoins == 1, what="the rejoin")
        assert consumer.updates >= 1
    finally:
        worker.stop()
        await asyncio.wait_for(task, 5)

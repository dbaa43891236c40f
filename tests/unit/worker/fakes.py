"""Stand-ins for what the worker reaches outside its process: no broker, no network.

- :class:`FakeProducer`: a transactional producer built on aiokafka's real
  ``BatchBuilder``; it decodes every batch it is sent, keeps what each
  transaction holds, what was committed and what was aborted, answers sends
  with futures carrying log offsets, and fails on demand (``fail[...]`` for
  the next calls, ``fail_send_if`` / ``fail_commit_if`` for what a batch or a
  transaction holds). It also notes protocol misuse in ``violations``.
- :class:`FakeConsumer`: the group consumer the loop drives (assignment,
  pause, resume, seek, committed offsets, getmany over per-partition logs);
  the first poll hands the assignment to the rebalance listener, as the real
  consumer does from inside a poll.
- :class:`FakeGroup`, :class:`FakeReader`: the group coordinator's answers, and a
  changelog that is empty (its reads can wait at a gate).
- :func:`fake_io`: all of them as the :class:`~pipeline.worker.io.WorkerIO` a worker is built
  with; :class:`Harness`: tasks, the transaction and the executor without a loop; :class:`Running`: a
  started worker over them, and its ``run()`` as a task.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import TopicPartition
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord

from pipeline import topology as topology_module
from pipeline.headers import RECEIVED_AT_HEADER, SOURCE_HEADER
from pipeline.kafka.partitioner import KeyPartitioner, owner_partition
from pipeline.kafka.requests import GroupMetadata
from pipeline.kafka.topic_layout import TopicLayout
from pipeline.kafka.transactional import TransactionalProducer
from pipeline.state.partition_transaction import PartitionTransaction
from pipeline.state.restore import RestoreBudget, Restorer
from pipeline.state.transaction import Transaction
from pipeline.worker.classify import Classifier
from pipeline.worker.context import PartitionContext
from pipeline.worker.emitter import OutputTopics
from pipeline.worker.executor import Outcome, TaskExecutor
from pipeline.worker.io import WorkerIO
from pipeline.worker.lifecycle import PartitionState
from pipeline.worker.loop import Worker
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.settings import WorkerSettings
from pipeline.worker.task import ActiveTask

ROOT = Path(__file__).resolve().parents[3]
TOPOLOGY_PATH = ROOT / "topologies" / "default.toml"
TOPOLOGY = topology_module.load(TOPOLOGY_PATH)
TOPICS = TOPOLOGY.topics
PARTITIONS = 6  # every topic's partition count
MIB = 1024 * 1024
T0 = 1_700_000_000_000  # record timestamps (ms): stream time, far from any expiry
SOURCE = "stripe"  # verified at the ingress: the worker checks no signature


INPUT = TOPICS.input


def tp(partition: int = 0) -> TopicPartition:
    """An input partition."""
    return TopicPartition(INPUT, partition)


def keys_for(partition: int, count: int, *, start: int = 0) -> list[str]:
    """``count`` scoped Stripe keys that murmur2 places on input ``partition`` (so none is rerouted)."""
    found: list[str] = []
    i = start
    while len(found) < count:
        key = f"{SOURCE}:evt_{i}"
        if owner_partition(key.encode(), PARTITIONS) == partition:
            found.append(key)
        i += 1
    return found


def body(key: str, *, pad: int = 0) -> bytes:
    """A Stripe event body for ``key`` (``pad`` bytes of filler make it bigger)."""
    event: dict[str, Any] = {"id": key.split(":", 1)[1], "type": "charge.succeeded", "object": "event"}
    if pad:
        event["data"] = "x" * pad
    return orjson.dumps(event)


def record(
    offset: int,
    key: str | None,
    *,
    partition: int = 0,
    value: bytes | None = None,
    headers: list[tuple[str, bytes]] | None = None,
    timestamp: int | None = None,
    topic: str | None = None,
) -> ConsumerRecord[bytes, bytes]:
    """An input record as the ingress writes it: ``source`` and ``received-at`` headers, the raw body."""
    ts = T0 + offset if timestamp is None else timestamp
    if headers is None:
        headers = [(SOURCE_HEADER, SOURCE.encode()), (RECEIVED_AT_HEADER, str(ts).encode())]
    if value is None:
        value = body(key) if key else b"{}"
    encoded = key.encode() if key is not None else None
    return ConsumerRecord(
        topic=topic or INPUT,
        partition=partition,
        offset=offset,
        timestamp=ts,
        timestamp_type=0,
        key=encoded,
        value=value,
        checksum=None,
        serialized_key_size=len(encoded) if encoded else -1,
        serialized_value_size=len(value),
        headers=headers,
    )


def records(partition: int, first: int, keys: Iterable[str]) -> list[ConsumerRecord[bytes, bytes]]:
    """One record per key, at consecutive offsets from ``first``."""
    return [record(first + i, key, partition=partition) for i, key in enumerate(keys)]


def settings(state_dir: Path, **overrides: Any) -> WorkerSettings:
    """Worker settings with a short open timeout and no broker anywhere."""
    values: dict[str, Any] = {
        "bootstrap": "x",
        "topology": TOPOLOGY_PATH,
        "state_dir": state_dir,
        "open_timeout": 1.0,
    }
    values.update(overrides)
    return WorkerSettings(**values)


def outputs(limits: dict[str, int] | None = None) -> OutputTopics:
    """Every topic with :data:`PARTITIONS` partitions, murmur2, and 4 MiB limits unless given."""
    names = [
        TOPICS.input,
        TOPICS.commands,
        TOPICS.audit,
        TOPICS.dlq,
        TOPICS.changelog,
        TOPICS.effects,
        TOPICS.effects_changelog,
        *TOPOLOGY.command_topics(),
    ]
    all_limits = dict.fromkeys(names, 4 * MIB)
    all_limits.update(limits or {})
    return OutputTopics(dict.fromkeys(names, PARTITIONS), KeyPartitioner(), all_limits)


def classifier() -> Classifier:
    """The default topology's classifier over :data:`PARTITIONS` input partitions."""
    return Classifier(TOPOLOGY, KeyPartitioner(), input_partitions=PARTITIONS, environ={})


# -- the producer ------------------------------------------------------------------------


class FailingWrites:
    """A store's database whose writes fail, as a disk error makes RocksDB's fail."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def write(self, *_: Any) -> None:
        raise Exception("IO error: No space left on device")  # rocksdict raises bare Exception


@dataclass(frozen=True)
class Sent:
    """One record the producer was sent, decoded from the batch it travelled in."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int

    def json(self) -> dict[str, Any]:
        """The value as JSON (commands, audit and DLQ records)."""
        parsed: dict[str, Any] = orjson.loads(self.value)
        return parsed


class _Metadata:
    """What a send's future resolves to: the base offset of its batch."""

    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset


Failure = Callable[[list[Sent]], BaseException | None]


class FakeProducer:
    """A transactional producer without a broker (see the module docstring)."""

    def __init__(self, transactional_id: str = "fake") -> None:
        self.transactional_id = transactional_id
        self.calls: list[str] = []
        self.fail: dict[str, list[BaseException]] = defaultdict(list)  # call -> errors for its next calls
        self.fail_after: dict[str, list[BaseException]] = defaultdict(list)  # the same, raised once it took
        self.fail_send_if: Failure | None = None  # given the batch's records
        self.fail_commit_if: Failure | None = None  # given the transaction's records
        self.on_commit: Callable[[], None] | None = None  # runs as commit_transaction starts
        self.commit_gate: asyncio.Event | None = None  # when set up, commit_transaction waits for it
        self.stop_gate: asyncio.Event | None = None  # when set up, stop waits for it
        self.in_transaction = False
        self.pending: list[Sent] = []  # sent in the open transaction
        self.committed: list[Sent] = []
        self.aborted: list[Sent] = []
        self.offsets: list[tuple[TopicPartition, int, str]] = []  # committed consumer offsets
        # the group coordinator's committed offsets (a consumer's ``committed_offsets``), if a test follows them
        self.group_offsets: dict[TopicPartition, int] | None = None
        self.generations: list[int] = []  # the group generation each offset commit carried
        self.violations: list[str] = []
        self.started = False
        self.stopped = False
        self._pending_offsets: list[tuple[TopicPartition, int, str]] = []
        self._log_end: dict[tuple[str, int], int] = defaultdict(int)

    def made_after_start(self) -> list[str]:
        """The starts after the first: each is a new producer for the same transactional id."""
        return [c for c in self.calls if c == "start"][1:]

    def succeed(self, earlier: FakeProducer) -> None:
        """Take over from ``earlier`` (same transactional id): one broker's view, the same failures to come."""
        self.calls = earlier.calls
        self.fail = earlier.fail
        self.fail_after = earlier.fail_after
        self.fail_send_if = earlier.fail_send_if
        self.fail_commit_if = earlier.fail_commit_if
        self.committed = earlier.committed
        self.aborted = earlier.aborted
        self.offsets = earlier.offsets
        self.group_offsets = earlier.group_offsets
        self.generations = earlier.generations
        self.violations = earlier.violations
        self._log_end = earlier._log_end

    def _maybe_fail(self, call: str) -> None:
        queued = self.fail.get(call)
        if queued:
            raise queued.pop(0)

    async def start(self) -> None:
        self.calls.append("start")
        self._maybe_fail("start")
        self.started = True

    async def stop(self) -> None:
        self.calls.append("stop")
        if self.stop_gate is not None:  # aiokafka's stop waits for what is still being delivered
            await self.stop_gate.wait()
        self.stopped = True

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(MIB, 0, is_transactional=True, key_serializer=None, value_serializer=None)

    async def begin_transaction(self) -> None:
        self.calls.append("begin")
        self._maybe_fail("begin")
        if self.in_transaction:
            self.violations.append("begin while a transaction is open")
        self.in_transaction = True

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> asyncio.Future[Any]:
        if not self.in_transaction:
            self.violations.append(f"send to {topic}-{partition} outside a transaction")
        batch.close()
        buffer = bytes(batch._builder.build())  # the encoding a real send does
        base = self._log_end[(topic, partition)]
        decoded = MemoryRecords(buffer).next_batch()
        sent = [
            Sent(
                topic,
                partition,
                base + i,
                r.key,
                r.value,
                tuple((name, value) for name, value in r.headers),
                r.timestamp,
            )
            for i, r in enumerate(decoded or [])
        ]
        self.calls.append(f"send {topic}-{partition} {len(sent)}")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        error: BaseException | None = None
        queued = self.fail.get("send")
        if queued:
            error = queued.pop(0)
        elif self.fail_send_if is not None:
            error = self.fail_send_if(sent)
        if error is not None:
            future.set_exception(error)
            return future
        self._log_end[(topic, partition)] = base + len(sent)
        self.pending.extend(sent)
        future.set_result(_Metadata(topic, partition, base))
        return future

    async def send_offsets_to_transaction(self, offsets: dict[TopicPartition, int], group: str) -> None:
        self.calls.append("offsets " + " ".join(f"{t.topic}-{t.partition}:{o}" for t, o in offsets.items()))
        self._maybe_fail("offsets")
        self._pending_offsets.extend((t, o, group) for t, o in offsets.items())

    async def commit_transaction(self) -> None:
        if self.commit_gate is not None:
            await self.commit_gate.wait()
        if self.on_commit is not None:
            self.on_commit()
        self.calls.append("commit")
        self._maybe_fail("commit")
        if self.fail_commit_if is not None:
            error = self.fail_commit_if(self.pending)
            if error is not None:
                raise error
        if not self.in_transaction:
            self.violations.append("commit without a transaction")
        self.committed.extend(self.pending)
        self.offsets.extend(self._pending_offsets)
        if self.group_offsets is not None:
            self.group_offsets.update({tp: offset for tp, offset, _ in self._pending_offsets})
        self._end()
        lost = self.fail_after.get("commit")
        if lost:  # the broker committed; its answer never came (a fence, the producer dying)
            raise lost.pop(0)

    async def abort_transaction(self) -> None:
        self.calls.append("abort")
        self._maybe_fail("abort")
        if not self.in_transaction:
            self.violations.append("abort without a transaction")
        self.aborted.extend(self.pending)
        self._end()

    def _end(self) -> None:
        self.pending = []
        self._pending_offsets = []
        self.in_transaction = False

    # -- what it saw ---------------------------------------------------------------
    def committed_to(self, topic: str) -> list[Sent]:
        """The committed records of ``topic``, in the order they were sent."""
        return [s for s in self.committed if s.topic == topic]

    def committed_keys(self, topic: str) -> list[bytes | None]:
        """The keys of the committed records of ``topic``."""
        return [s.key for s in self.committed_to(topic)]

    def dlq(self) -> list[dict[str, Any]]:
        """The committed DLQ records, as JSON."""
        return [s.json() for s in self.committed_to(TOPICS.dlq)]

    def committed_offset(self) -> int | None:
        """The last consumer offset committed in a transaction."""
        return self.offsets[-1][1] if self.offsets else None


class ProducerFactory:
    """Stands in for ``transactional_producer``: one :class:`FakeProducer` per transactional id."""

    def __init__(self, prepare: Callable[[FakeProducer], None] | None = None) -> None:
        self.made: dict[str, list[FakeProducer]] = defaultdict(list)
        self.prepare = prepare

    def __call__(self, settings: WorkerSettings, transactional_id: str) -> FakeProducer:
        producer = FakeProducer(transactional_id)
        earlier = self.made[transactional_id]
        if earlier:
            producer.succeed(earlier[-1])
        if self.prepare is not None:
            self.prepare(producer)
        self.made[transactional_id].append(producer)
        return producer

    def latest(self) -> FakeProducer:
        """The producer made last (a worker has one transactional id)."""
        for producers in self.made.values():
            return producers[-1]
        raise KeyError("no producer made")


async def send_offsets(producer: Any, offsets: Mapping[TopicPartition, int], metadata: GroupMetadata) -> None:
    """What the worker's offsets go through: the fake producer's offsets, with the generation noted."""
    await producer.send_offsets_to_transaction(dict(offsets), metadata.group_id)
    producer.generations.append(metadata.generation_id)


class FakeReader:
    """A changelog reader over empty changelogs (``ends`` and ``log_ends`` say otherwise for the start-up check
    of the stores on disk); with ``gate``, every read of an end waits for it first."""

    def __init__(
        self,
        gate: asyncio.Event | None = None,
        *,
        ends: Mapping[TopicPartition, int] | None = None,
        log_ends: Mapping[TopicPartition, int] | None = None,
    ) -> None:
        self.gate = gate
        self.ends_at = dict(ends or {})  # what ends() says of each changelog (0 for the others)
        self.log_ends_at: dict[TopicPartition, int] = dict(
            log_ends or {}
        )  # what log_end() says (0 for others)
        self.entered: list[TopicPartition] = []
        self.fetch_bytes = MIB
        self.started = 0
        self.stopped = 0

    async def start(self) -> None:
        self.started += 1

    async def stop(self) -> None:
        self.stopped += 1

    async def _wait(self, tp: TopicPartition) -> int:
        self.entered.append(tp)
        if self.gate is not None:
            await self.gate.wait()
        return 0

    async def end(self, tp: TopicPartition) -> int:
        return await self._wait(tp)

    async def log_end(self, tp: TopicPartition) -> int:
        await self._wait(tp)
        return self.log_ends_at.get(tp, 0)

    async def ends(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.ends_at.get(tp, 0) for tp in tps}


def restorer(reader: FakeReader | None = None) -> Restorer:
    """The worker's restore service over ``reader`` (an empty changelog by default)."""
    chosen = reader or FakeReader()
    return Restorer(lambda: chosen, RestoreBudget(64 * MIB), fetch_bytes=MIB)  # type: ignore[arg-type,return-value]


# -- the consumer ------------------------------------------------------------------------


class FakeConsumer:
    """The worker's group consumer over in-memory logs (see the module docstring)."""

    def __init__(
        self,
        *,
        assign: Iterable[TopicPartition] = (),
        committed: dict[TopicPartition, int] | None = None,
        logs: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] | None = None,
    ) -> None:
        self.to_assign = set(assign)
        self.assigned: set[TopicPartition] = set()
        self.committed_offsets = dict(committed or {})
        self.logs = defaultdict(list, logs or {})
        self.positions: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()
        self.seeks: list[tuple[TopicPartition, int | str]] = []
        self.events: list[tuple[str, TopicPartition]] = []  # pause, resume, seek, in order
        self.listener: Any = None
        self.topics: list[str] = []
        self.polls = 0
        self.max_wait_ms = 10  # an empty fetch waits up to this, or its timeout if shorter
        self.cancelled_fetches = 0
        self.on_poll: Callable[[int], Any] | None = None  # called with the poll number; may raise or stop
        self.started = False
        self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def subscribe(self, topics: list[str], listener: Any = None) -> None:
        self.topics = list(topics)
        self.listener = listener

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def pause(self, *partitions: TopicPartition) -> None:
        for p in partitions:
            self.paused.add(p)
            self.events.append(("pause", p))

    def resume(self, *partitions: TopicPartition) -> None:
        for p in partitions:
            self.paused.discard(p)
            self.events.append(("resume", p))

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self.positions[partition] = offset
        self.seeks.append((partition, offset))
        self.events.append(("seek", partition))

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for p in partitions:
            log = self.logs[p]
            self.positions[p] = log[0].offset if log else 0
            self.seeks.append((p, "beginning"))
            self.events.append(("seek", p))

    async def position(self, partition: TopicPartition) -> int:
        return self.positions[partition]

    async def committed(self, partition: TopicPartition) -> int | None:
        return self.committed_offsets.get(partition)

    def highwater(self, partition: TopicPartition) -> int:
        log = self.logs[partition]
        return log[-1].offset + 1 if log else 0

    def last_stable_offset(self, partition: TopicPartition) -> int:
        return self.highwater(partition)  # no open transactions in a fake log

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        self.polls += 1
        if self.on_poll is not None:
            outcome = self.on_poll(self.polls)
            if inspect.isawaitable(outcome):
                await outcome
        if self.to_assign:
            fresh, self.to_assign = self.to_assign, set()
            self.assigned |= fresh
            if self.listener is not None:
                await self.listener.on_partitions_assigned(fresh)
        batches = self._take(max_records)  # as aiokafka: with nothing to wait for, it never yields
        if batches or not timeout_ms:
            return batches
        try:
            await asyncio.sleep(min(timeout_ms, self.max_wait_ms) / 1000)
        except asyncio.CancelledError:
            self.cancelled_fetches += 1  # aiokafka's getmany would leave its fetch count raised
            raise
        # as aiokafka: records are taken only as it returns, never before a wait
        return self._take(max_records)

    def _take(self, max_records: int | None) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        batches = {}
        for p in sorted(self.assigned - self.paused, key=lambda t: t.partition):
            position = self.positions.get(p)
            if position is None:  # no position yet: the committed offset, else the beginning
                position = self.committed_offsets.get(p, 0)
            fetched = [r for r in self.logs[p] if r.offset >= position][: max_records or None]
            if fetched:
                batches[p] = fetched
                self.positions[p] = fetched[-1].offset + 1
        return batches


# -- the group ----------------------------------------------------------------------------


class FakeGroup:
    """The group coordinator's answers: the consumer's committed offsets, generation ``generation``."""

    def __init__(self, consumer: FakeConsumer, *, group: str = "webhooks") -> None:
        self.consumer = consumer
        self.group = group
        self.generation = 1
        self.member_id = "member-1"
        self.rejoins = 0
        self.reads: list[list[TopicPartition]] = []
        self.refusals: list[BaseException] = []  # raised by the next reads, one each

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        wanted = list(partitions)
        self.reads.append(wanted)
        if self.refusals:
            raise self.refusals.pop(0)
        return {tp: self.consumer.committed_offsets.get(tp) for tp in wanted}

    async def member(self) -> bool | None:
        return True

    def metadata(self) -> GroupMetadata:
        return GroupMetadata(self.group, self.generation, self.member_id, None)

    def rejoin(self) -> None:
        self.rejoins += 1


# -- the worker's world -----------------------------------------------------------------


@dataclass
class Clients:
    """The fakes a worker built with :func:`fake_io` talks to."""

    producers: ProducerFactory
    reader: FakeReader
    consumer: FakeConsumer = field(default_factory=FakeConsumer)
    groups: list[FakeGroup] = field(default_factory=list)
    fenced: list[str] = field(default_factory=list)  # transactional ids fenced without a producer
    fence_refusals: list[BaseException] = field(default_factory=list)  # raised by the next fences, one each

    @property
    def group(self) -> FakeGroup:
        return self.groups[-1]


def layout(limits: dict[str, str] | None = None) -> TopicLayout:
    """Every topic with :data:`PARTITIONS` partitions and 4 MiB limits unless given."""
    names = [*outputs().partitions]
    sizes = {name: int(limits[name]) if limits and name in limits else 4 * MIB for name in names}
    return TopicLayout(
        dict.fromkeys(names, PARTITIONS), sizes, {}, "fake-cluster", {n: f"id-{n}" for n in names}
    )


def fake_io(
    *,
    producers: ProducerFactory | None = None,
    reader: FakeReader | None = None,
    consumer: FakeConsumer | None = None,
    limits: dict[str, str] | None = None,
) -> tuple[WorkerIO, Clients]:
    """A :class:`WorkerIO` over the fakes, and the fakes."""
    clients = Clients(producers or ProducerFactory(), reader or FakeReader(), consumer or FakeConsumer())

    def group(consumer: Any) -> FakeGroup:
        made = FakeGroup(consumer)
        clients.groups.append(made)
        return made

    async def fence(_client: Any, transactional_id: str) -> None:
        if clients.fence_refusals:
            raise clients.fence_refusals.pop(0)
        clients.fenced.append(transactional_id)

    async def topic_layout(_bootstrap: str, _topology: Any) -> TopicLayout:
        return layout(limits)

    io = WorkerIO(
        consumer=lambda _settings, **_kwargs: clients.consumer,
        producer=clients.producers,
        group=group,
        fence=fence,
        changelog_reader=lambda _settings: clients.reader,  # type: ignore[arg-type,return-value]
        layout=topic_layout,
        send_offsets=send_offsets,
    )
    return io, clients


GROUP = "webhooks"  # the default topology's app name: the default group


def part_transaction(
    producer: FakeProducer,
    tp: TopicPartition,
    *,
    store: Any,
    changelog: TopicPartition,
    limits: Mapping[str, int] | None = None,
) -> PartitionTransaction:
    """``tp``'s part of a worker transaction over ``producer`` (its ``txn`` commits it)."""
    txn = Transaction(
        TransactionalProducer(producer, producer.transactional_id, send_offsets=send_offsets),
        group=lambda: GroupMetadata(GROUP, 1, "member-1", None),
        limits=limits,
    )
    return PartitionTransaction(tp=tp, txn=txn, store=store, changelog=changelog)


@dataclass
class Harness:
    """Tasks of the default topology's input topic over one fake producer's transaction, without a loop:
    what the loop does with them, step by step (the executor's outcomes applied as the table would)."""

    state_dir: Path
    overrides: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, int] | None = None
    reader: FakeReader = field(default_factory=FakeReader)
    tasks: dict[TopicPartition, ActiveTask] = field(default_factory=dict)
    seeks: list[tuple[TopicPartition, int]] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    replaced: int = 0  # new producers started in place of one fenced, unusable or out of sequence

    def __post_init__(self) -> None:
        self.settings = settings(self.state_dir, **self.overrides).for_topology(TOPOLOGY.app)
        self.metrics = WorkerMetrics.create()
        self.producer = FakeProducer(f"{TOPOLOGY.app}-{GROUP}-worker-test")
        self.group = FakeGroup(FakeConsumer())
        self.context = PartitionContext(
            settings=self.settings,
            topology=TOPOLOGY,
            classifier=classifier(),
            outputs=outputs(self.limits),
            metrics=self.metrics,
            cluster="fake-cluster",
            topic_ids={TOPICS.changelog: "changelog-id", TOPICS.effects_changelog: "effects-changelog-id"},
            restorer=restorer(self.reader),
        )
        self.txn = Transaction(
            TransactionalProducer(self.producer, self.producer.transactional_id, send_offsets=send_offsets),
            group=self.group.metadata,
            limits=self.context.outputs.limits,
            timestamps=self.context.outputs.timestamps,
            send_bytes=self.settings.send_bytes,
        )
        self.executor = TaskExecutor(self.txn, self.settings, self.metrics)

    def task(self, partition: int = 0) -> ActiveTask:
        """Input partition ``partition``'s task (made unopened on first use)."""
        where = tp(partition)
        found = self.tasks.get(where)
        if found is None:
            found = self.tasks[where] = ActiveTask(
                where, changelog=TopicPartition(TOPICS.changelog, partition), context=self.context
            )
        return found

    async def open(self, partition: int = 0) -> ActiveTask:
        """Open ``partition``'s task (store in the state dir, an empty changelog) and position it."""
        task = self.task(partition)
        await task.open(self.txn, time.monotonic() + self.settings.open_timeout)
        task.positioned(0)
        return task

    def feed(self, records: list[ConsumerRecord[bytes, bytes]]) -> None:
        """Hand fetched records to their tasks."""
        for record in records:
            self.task(record.partition).feed([record])

    async def apply(self, outcome: Outcome) -> Outcome:
        """What the table and the worker do with an outcome: tasks moved back (the seeks noted), a new
        producer (sharing the broker's view), and a fatal one raised."""
        self.outcomes.append(outcome)
        for where, offset in outcome.rewind.items():
            task = self.tasks.get(where)
            if task is not None and task.serving:
                task.rewind(offset)
                self.seeks.append((where, offset))
        if outcome.replace_producer:
            replacement = FakeProducer(self.producer.transactional_id)
            replacement.succeed(self.producer)
            await replacement.start()
            self.producer = replacement
            self.txn.producer = TransactionalProducer(
                replacement,
                replacement.transactional_id,
                send_offsets=send_offsets,
            )
            self.replaced += 1
        if outcome.fatal is not None:
            raise outcome.fatal
        return outcome

    async def work(self) -> Outcome:
        """The executor handles what the tasks have queued."""
        return await self.apply(await self.executor.process(self.tasks))

    async def commit(self) -> Outcome:
        """The executor commits the open transaction."""
        return await self.apply(await self.executor.commit(self.tasks))

    async def handle_and_commit(self, records: list[ConsumerRecord[bytes, bytes]]) -> None:
        """Feed, handle and commit."""
        self.feed(records)
        await self.work()
        await self.commit()

    def close(self) -> None:
        """Close every task (their stores released)."""
        for task in self.tasks.values():
            task.close()


class Running:
    """A started worker over fakes, and its ``run()`` as a task."""

    def __init__(self, worker: Worker, clients: Clients) -> None:
        self.worker = worker
        self.clients = clients
        self.task: asyncio.Task[None] | None = None

    @property
    def consumer(self) -> FakeConsumer:
        return self.clients.consumer

    @property
    def producer(self) -> FakeProducer:
        """The worker's producer (the latest, after a replacement)."""
        return self.clients.producers.latest()

    def states(self) -> dict[int, PartitionState]:
        return {t.partition: task.state for t, task in self.worker.tasks.items()}

    def run(self) -> asyncio.Task[None]:
        self.task = asyncio.create_task(self.worker.run())
        return self.task

    async def stop(self) -> None:
        """A clean stop (SIGTERM): run() returns."""
        self.worker.stop()
        if self.task is not None:
            await asyncio.wait_for(self.task, 5)


Starter = Callable[..., Any]

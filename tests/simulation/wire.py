"""The network between aiokafka's real clients and the broker model.

aiokafka opens every connection with ``aiokafka.client.create_conn``; while a run is
on, that name gives a :class:`SimConnection` instead, the one place the simulation
reaches into aiokafka (pinned by ``tests/simulation/test_wire.py``). Requests are
aiokafka's own protocol structs, encoded and decoded as on the wire, handled by the
model one at a time per connection (as a broker does), each way after a latency the
seed draws. An outage closes every connection (what was in flight is lost) and
refuses new ones until the broker is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import uuid
from collections.abc import Callable, Iterator
from random import Random
from typing import Any

import aiokafka.client
from aiokafka.conn import CloseReason
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol import admin as admin_protocol
from aiokafka.protocol import commit, coordination, fetch, group, metadata, offset, produce, transaction

from pipeline.kafka.clients import STANDBY_CLIENT_ID
from tests.simulation import broker as b
from tests.simulation import codes
from tests.simulation.loop import CURRENT
from tests.simulation.records import decode_produced

HOST, PORT, NODE = "sim", 9092, 0

#: The request types aiokafka's clients send, each spoken at the newest version aiokafka has
#: (which a Kafka 4.x broker also serves: the clients send what they send to the real one).
REQUESTS = (
    produce.ProduceRequest,
    fetch.FetchRequest,
    offset.OffsetRequest,
    metadata.MetadataRequest,
    commit.OffsetFetchRequest,
    coordination.FindCoordinatorRequest,
    group.JoinGroupRequest,
    group.HeartbeatRequest,
    group.LeaveGroupRequest,
    group.SyncGroupRequest,
    transaction.InitProducerIdRequest,
    transaction.AddPartitionsToTxnRequest,
    transaction.AddOffsetsToTxnRequest,
    transaction.EndTxnRequest,
    transaction.TxnOffsetCommitRequest,
    admin_protocol.DescribeConfigsRequest,
    admin_protocol.DescribeGroupsRequest,
    admin_protocol.CreatePartitionsRequest,
)
VERSIONS: dict[int, tuple[int, int]] = {
    r.API_KEY: (r._CLASSES[-1].API_VERSION, r._CLASSES[-1].API_VERSION) for r in REQUESTS
}
# Metadata up to v12 too: the worker asks v12 for the cluster and topic ids (pipeline.kafka.internals);
# OffsetFetch up to v7 (require_stable) and TxnOffsetCommit up to v3 (the group metadata), which the worker
# asks through pipeline.kafka.requests (eos-v2); aiokafka's own still picks its v3 and v0 from these ranges
VERSIONS[metadata.MetadataRequest.API_KEY] = (VERSIONS[metadata.MetadataRequest.API_KEY][0], 12)
VERSIONS[commit.OffsetFetchRequest.API_KEY] = (1, 7)
VERSIONS[transaction.TxnOffsetCommitRequest.API_KEY] = (0, 3)


class Network:
    """Latencies, connections and outages between the clients and one :class:`~tests.simulation.broker.Broker`."""

    def __init__(self, broker: b.Broker, rng: Random) -> None:
        self.broker = broker
        self.rng = rng
        self.connections: list[SimConnection] = []
        self.spike_chance = 0.02  # a request that takes far longer (GC pause, slow disk, busy broker)
        self.requests = 0
        self.errors: list[str] = []  # the model's own failures (a bug of the simulation, not the worker)
        #: slot name -> (until, (low, high)): the standby fetches of that worker's processes crawl until then
        self.slow_standbys: dict[str, tuple[float, tuple[float, float]]] = {}
        #: (process, callback): the first fetch that process sends calls the callback (a broker that goes away
        #: just as a tool has read its end offsets and begins to read)
        self.on_fetch: tuple[Any, Callable[[], None]] | None = None
        #: encode and decode every request and response, as on the wire (slower; catches a response
        #: the model builds in a shape aiokafka would not read): ``SIM_STRICT_WIRE=1``
        self.strict = os.environ.get("SIM_STRICT_WIRE") == "1"

    def latency(self) -> float:
        if self.rng.random() < self.spike_chance:
            return self.rng.uniform(0.05, 0.6)
        return self.rng.uniform(0.0001, 0.002)

    def standby_crawl(self, conn: SimConnection) -> float:
        """The extra latency of a request on a standby's connection of a worker whose standbys crawl."""
        if conn.process is None or not conn.client_id.startswith(STANDBY_CLIENT_ID):
            return 0.0
        slow = self.slow_standbys.get(conn.process.name.split(".")[0])
        if slow is None or self.broker.now() >= slow[0]:
            return 0.0
        return self.rng.uniform(*slow[1])

    async def connect(self, host: str, port: int, **options: Any) -> SimConnection:
        await asyncio.sleep(self.latency())
        if self.broker.down:
            raise KafkaConnectionError(f"Connection at {host}:{port} refused (the broker is down)")
        conn = SimConnection(self, host, port, **options)
        self.connections.append(conn)
        return conn

    def outage(self) -> None:
        """The broker goes down: every connection breaks."""
        self.broker.down = True
        self.broker.outages += 1
        for conn in list(self.connections):
            conn.close(reason=CloseReason.CONNECTION_BROKEN)
        self.connections.clear()

    def recover(self) -> None:
        self.broker.down = False
        self.broker.coordinator.restarted()


class SimConnection:
    """What ``aiokafka.conn.AIOKafkaConnection`` is to aiokafka's client, over the model."""

    def __init__(
        self,
        network: Network,
        host: str,
        port: int,
        *,
        client_id: str = "aiokafka",
        request_timeout_ms: int = 40000,
        on_close: Callable[..., Any] | None = None,
        **_: Any,
    ) -> None:
        self.network = network
        self._host, self._port = host, port
        self.client_id = client_id
        self._request_timeout = request_timeout_ms / 1000
        self._on_close_cb = on_close
        self._versions = VERSIONS
        self._open = True
        self._queue: asyncio.Queue[tuple[Any, asyncio.Future[Any]]] = asyncio.Queue()
        self._pending: list[asyncio.Future[Any]] = []
        self.process = CURRENT.get()  # the process that opened it (None: the world)
        self._server = network.broker.loop.spawn(None, self._serve(), f"conn-{client_id}")
        loop = network.broker.loop
        self._closed_fut = loop.create_future()

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    def connected(self) -> bool:
        return self._open

    def send(self, request: Any, expect_response: bool = True) -> Any:
        if not self._open:
            raise KafkaConnectionError(f"No connection to broker at {self._host}:{self._port}")
        struct = request.prepare(self._versions)
        if self.network.strict:
            struct = type(struct).decode(struct.encode())  # as the broker reads it off the wire
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append(future)
        self.network.requests += 1
        watched = self.network.on_fetch
        if (
            watched is not None
            and watched[0] is self.process
            and struct.API_KEY == fetch.FetchRequest.API_KEY
        ):
            self.network.on_fetch = None
            watched[1]()
        delay = self.network.latency() + self.network.standby_crawl(self)
        loop = self.network.broker.loop
        loop.call_later(delay, self._arrive, struct, future, context=contextvars.Context())
        if not expect_response:
            future.set_result(None)
            return future
        return asyncio.wait_for(future, self._request_timeout)

    def _arrive(self, struct: Any, future: asyncio.Future[Any]) -> None:
        if self._open:
            self._queue.put_nowait((struct, future))

    async def _serve(self) -> None:
        while True:
            struct, future = await self._queue.get()
            try:
                response = await handle(self.network.broker, struct, self.client_id, self.process)
                _watch_fences(self.network.broker, struct, response, self.process)
            except Exception as exc:  # a bug of the model: reported, never a hang
                self.network.errors.append(f"the broker model failed on {type(struct).__name__}: {exc!r}")
                self.close()
                return
            if not self._open:
                return
            if self.network.broker.lose_reply:  # the connection breaks before the reply is written
                self.network.broker.lose_reply = False
                self.close(reason=CloseReason.CONNECTION_BROKEN)
                return
            if self.network.strict:
                response = type(response).decode(response.encode())  # as the client reads it off the wire
            await asyncio.sleep(self.network.latency())
            if self._open and not future.done():
                future.set_result(response)

    def close(self, reason: Any = None, exc: BaseException | None = None) -> asyncio.Future[Any]:
        if self._open:
            self._open = False
            self._server.cancel()
            for future in self._pending:
                if not future.done():
                    future.set_exception(
                        KafkaConnectionError(f"Connection at {self._host}:{self._port} closed")
                    )
            self._pending.clear()
            with contextlib.suppress(ValueError):
                self.network.connections.remove(self)
            if self._on_close_cb is not None:
                self._on_close_cb(self, reason)
                self._on_close_cb = None
            if not self._closed_fut.done():
                self._closed_fut.set_result(None)
        return self._closed_fut


@contextlib.contextmanager
def installed(network: Network) -> Iterator[None]:
    """aiokafka's clients connect to ``network`` for the duration."""
    saved = aiokafka.client.create_conn

    async def create_conn(host: str, port: int, **options: Any) -> SimConnection:
        return await network.connect(host, port, **options)

    aiokafka.client.create_conn = create_conn
    try:
        yield
    finally:
        aiokafka.client.create_conn = saved


# -- requests ----------------------------------------------------------------------------

# rows of the responses, in the shapes aiokafka's protocol structs take
# partition, error, high watermark, last stable offset, log start, aborted transactions, preferred replica, records
FetchAnswer = tuple[int, int, int, int, int, list[tuple[int, int]] | None, int, bytes]
# name, value, read-only, source, sensitive, synonyms
ConfigEntry = tuple[str, str, bool, int, bool, list[Any]]
# error, partition, leader, (leader epoch,) replicas, in-sync replicas, offline replicas(, tagged fields)
PartitionMetadata = tuple[int, int, int, list[int], list[int], list[int]]
PartitionMetadataV12 = tuple[int, int, int, int, list[int], list[int], list[int], dict[int, Any]]


async def handle(broker: b.Broker, req: Any, client_id: str, process: Any = None) -> Any:
    key = req.API_KEY
    if key == produce.ProduceRequest.API_KEY:
        return _produce(broker, req)
    if key == fetch.FetchRequest.API_KEY:
        return await _fetch(broker, req)
    if key == offset.OffsetRequest.API_KEY:
        return _list_offsets(broker, req)
    if key == metadata.MetadataRequest.API_KEY:
        return _metadata_v12(broker, req) if req.API_VERSION == 12 else _metadata(broker, req)
    if key == commit.OffsetFetchRequest.API_KEY:
        return _offset_fetch(broker, req)
    if key == coordination.FindCoordinatorRequest.API_KEY:
        return req.RESPONSE_TYPE(0, 0, None, NODE, HOST, PORT)
    if key == group.JoinGroupRequest.API_KEY:
        return await _join(broker, req, client_id, process)
    if key == group.SyncGroupRequest.API_KEY:
        result = await broker.coordinator.sync(
            req.group,
            req.generation_id,
            req.member_id,
            req.group_assignment,
            getattr(req, "group_instance_id", None),
        )
        return req.RESPONSE_TYPE(0, result["error"], result.get("assignment", b""))
    if key == group.HeartbeatRequest.API_KEY:
        instance = getattr(req, "group_instance_id", None)  # aiokafka's Heartbeat (v1) carries none
        return req.RESPONSE_TYPE(
            0, broker.coordinator.heartbeat(req.group, req.generation_id, req.member_id, instance)
        )
    if key == group.LeaveGroupRequest.API_KEY:
        return req.RESPONSE_TYPE(0, broker.coordinator.leave(req.group, req.member_id))
    if key == transaction.InitProducerIdRequest.API_KEY:
        error, pid, epoch = broker.transactions.init_producer_id(
            req.transactional_id, req.transaction_timeout_ms, process
        )
        return req.RESPONSE_TYPE(0, error, pid, epoch)
    if key == transaction.AddPartitionsToTxnRequest.API_KEY:
        tps = [(topic, p) for topic, partitions in req.topics for p in partitions]
        added = broker.transactions.add_partitions(
            req.transactional_id, req.producer_id, req.producer_epoch, tps
        )
        return req.RESPONSE_TYPE(0, _by_topic(added))
    if key == transaction.AddOffsetsToTxnRequest.API_KEY:
        error = broker.transactions.add_offsets(
            req.transactional_id, req.producer_id, req.producer_epoch, req.group_id
        )
        return req.RESPONSE_TYPE(0, error)
    if key == transaction.EndTxnRequest.API_KEY:
        error = broker.transactions.end_txn(
            req.transactional_id, req.producer_id, req.producer_epoch, bool(req.transaction_result)
        )
        return req.RESPONSE_TYPE(0, error)
    if key == transaction.TxnOffsetCommitRequest.API_KEY:
        return _txn_offset_commit(broker, req)
    if key == admin_protocol.DescribeConfigsRequest.API_KEY:
        return _describe_configs(broker, req)
    if key == admin_protocol.DescribeGroupsRequest.API_KEY:
        return _describe_groups(broker, req)
    if key == admin_protocol.CreatePartitionsRequest.API_KEY:
        errors = [
            (topic, broker.create_partitions(topic, count), None)
            for topic, (count, _) in req.topic_partitions
        ]
        return req.RESPONSE_TYPE(0, errors)
    raise NotImplementedError(f"the simulated broker has no handler for {type(req).__name__}")


def _watch_fences(broker: b.Broker, req: Any, response: Any, process: Any) -> None:
    """Tell the broker model which process learned it is fenced, and which got an assignment."""
    key = req.API_KEY
    if key == group.SyncGroupRequest.API_KEY and response.error_code == 0:
        broker.transactions.assigned(process)
        return
    txn_id = getattr(req, "transactional_id", None)
    if txn_id is None:
        return
    errors = []
    if key == produce.ProduceRequest.API_KEY:
        errors = [answer[1] for _topic, answers in response.topics for answer in answers]
    elif key == transaction.TxnOffsetCommitRequest.API_KEY and req.API_VERSION >= 3:
        errors = [answer[1] for _topic, answers, _tags in response.topics for answer in answers]
    elif key in (transaction.AddPartitionsToTxnRequest.API_KEY, transaction.TxnOffsetCommitRequest.API_KEY):
        errors = [error for _topic, topic_errors in response.errors for _p, error in topic_errors]
    elif hasattr(response, "error_code"):
        errors = [response.error_code]
    if codes.INVALID_PRODUCER_EPOCH in errors:
        broker.transactions.told_fenced(process, txn_id)


def _by_topic(result: dict[tuple[str, int], int]) -> list[tuple[str, list[tuple[int, int]]]]:
    topics: dict[str, list[tuple[int, int]]] = {}
    for (topic, partition), error in result.items():
        topics.setdefault(topic, []).append((partition, error))
    return list(topics.items())


def _produce(broker: b.Broker, req: Any) -> Any:
    topics = []
    for topic, partitions in req.topics:
        answers = []
        for partition, messages in partitions:
            error, base = broker.produce(topic, partition, decode_produced(bytes(messages)))
            answers.append((partition, error, base, -1, 0))
        topics.append((topic, answers))
    return req.RESPONSE_TYPE(topics, 0)


async def _fetch(broker: b.Broker, req: Any) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + req.max_wait_time / 1000
    committed = req.isolation_level == 1
    while True:
        topics: list[tuple[str, list[FetchAnswer]]] = []
        found = False
        waits = []
        for topic, partitions in req.topics:
            answers: list[FetchAnswer] = []
            for partition, _leader_epoch, position, _log_start, max_bytes in partitions:
                log = broker.log(topic, partition)
                if log is None:
                    answers.append((partition, codes.UNKNOWN_TOPIC_OR_PARTITION, -1, -1, -1, None, -1, b""))
                    continue
                if position > log.end or position < log.log_start:
                    answers.append(
                        (
                            partition,
                            codes.OFFSET_OUT_OF_RANGE,
                            log.end,
                            log.lso(),
                            log.log_start,
                            None,
                            -1,
                            b"",
                        )
                    )
                    found = True
                    continue
                raw, aborted = log.read(position, max_bytes, committed=committed)
                found = found or bool(raw)
                waits.append(log.changed)
                answers.append(
                    (
                        partition,
                        codes.NONE,
                        log.end,
                        log.lso(),
                        log.log_start,
                        aborted if committed else None,
                        -1,
                        raw,
                    )
                )
            topics.append((topic, answers))
        left = deadline - loop.time()
        if found or left <= 0 or not waits:
            return req.RESPONSE_TYPE(0, 0, 0, topics)
        tasks = [asyncio.ensure_future(event.wait()) for event in waits]
        try:
            await asyncio.wait(tasks, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()


def _list_offsets(broker: b.Broker, req: Any) -> Any:
    topics = []
    for topic, partitions in req.topics:
        answers = []
        for partition, timestamp in partitions:
            log = broker.log(topic, partition)
            if log is None:
                answers.append((partition, codes.UNKNOWN_TOPIC_OR_PARTITION, -1, -1))
                continue
            latest = log.lso() if req.isolation_level == 1 else log.end
            if timestamp >= 0:  # the first record stamped at or after it (-1, -1: none)
                answers.append((partition, codes.NONE, *log.offset_for_time(timestamp, latest)))
                continue
            found = log.log_start if timestamp == -2 else latest
            answers.append((partition, codes.NONE, -1, found))
        topics.append((topic, answers))
    return req.RESPONSE_TYPE(0, topics)


def _metadata(broker: b.Broker, req: Any) -> Any:
    names = list(broker.topics) if req.topics is None else list(req.topics)
    topics: list[tuple[int, str, bool, list[PartitionMetadata]]] = []
    for name in names:
        topic = broker.topics.get(name)
        if topic is None:
            topics.append((codes.UNKNOWN_TOPIC_OR_PARTITION, name, False, []))
            continue
        partitions: list[PartitionMetadata] = [
            (0, p, NODE, [NODE], [NODE], []) for p in range(len(topic.partitions))
        ]
        topics.append((0, name, False, partitions))
    return req.RESPONSE_TYPE(0, [(NODE, HOST, PORT, None)], broker.cluster_id, NODE, topics)


def _metadata_v12(broker: b.Broker, req: Any) -> Any:
    names = [name for _id, name, _tags in req.topics]
    topics: list[tuple[int, str, uuid.UUID, bool, list[PartitionMetadataV12], int, dict[int, Any]]] = []
    for name in names:
        topic = broker.topics.get(name)
        if topic is None:
            topics.append((codes.UNKNOWN_TOPIC_OR_PARTITION, name, uuid.UUID(int=0), False, [], 0, {}))
            continue
        partitions: list[PartitionMetadataV12] = [
            (0, p, NODE, 0, [NODE], [NODE], [], {}) for p in range(len(topic.partitions))
        ]
        topics.append((0, name, topic.id, False, partitions, 0, {}))
    return req.RESPONSE_TYPE(0, [(NODE, HOST, PORT, None, {})], broker.cluster_id, NODE, topics, {})


def _txn_offset_commit(broker: b.Broker, req: Any) -> Any:
    """v0 (aiokafka's): no member; v3 (pipeline.kafka.requests): the generation, member id and instance id."""
    if req.API_VERSION < 3:
        offsets = {(topic, p): off for topic, partitions in req.topics for p, off, _meta in partitions}
        error = broker.transactions.txn_offset_commit(
            req.transactional_id, req.group_id, req.producer_id, req.producer_epoch, offsets
        )
        return req.RESPONSE_TYPE(0, _by_topic(dict.fromkeys(offsets, error)))
    offsets = {
        (topic, p): off for topic, partitions, _ in req.topics for p, off, _epoch, _meta, _ in partitions
    }
    member = (req.generation_id, req.member_id, req.group_instance_id)
    error = broker.transactions.txn_offset_commit(
        req.transactional_id, req.group_id, req.producer_id, req.producer_epoch, offsets, member
    )
    answers = _by_topic(dict.fromkeys(offsets, error))
    return req.RESPONSE_TYPE(0, [(topic, [(p, e, {}) for p, e in rows], {}) for topic, rows in answers], {})


def _offset_fetch(broker: b.Broker, req: Any) -> Any:
    """v1-v3 (aiokafka's); v7 (pipeline.kafka.requests) flexible, with require_stable."""
    if req.API_VERSION < 7:
        tps = [(topic, p) for topic, partitions in req.topics for p in partitions]
        found = broker.coordinator.offset_fetch(req.consumer_group, tps)
        topics: dict[str, list[tuple[int, int, str, int]]] = {}
        for (topic, partition), (position, error) in found.items():
            topics.setdefault(topic, []).append((partition, position, "", error))
        return req.RESPONSE_TYPE(0, list(topics.items()), 0)
    tps = [(topic, p) for topic, partitions, _tags in req.topics for p in partitions]
    found = broker.coordinator.offset_fetch(req.group_id, tps, require_stable=req.require_stable)
    flexible: dict[str, list[tuple[int, int, int, str, int, dict[int, bytes]]]] = {}
    for (topic, partition), (position, error) in found.items():
        flexible.setdefault(topic, []).append((partition, position, -1, "", error, {}))
    return req.RESPONSE_TYPE(0, [(topic, rows, {}) for topic, rows in flexible.items()], 0, {})


async def _join(broker: b.Broker, req: Any, client_id: str, process: Any) -> Any:
    result = await broker.coordinator.join(
        req.group,
        req.member_id,
        client_id,
        process,
        req.session_timeout,
        req.rebalance_timeout,
        req.protocol_type,
        [(name, bytes(meta)) for name, meta in req.group_protocols],
        getattr(req, "group_instance_id", None),
    )
    if result["error"]:
        return req.RESPONSE_TYPE(0, result["error"], -1, "", "", result.get("member_id", ""), [])
    members = [(member_id, None, meta) for member_id, meta in result["members"]]
    return req.RESPONSE_TYPE(
        0, 0, result["generation"], result["protocol"], result["leader"], result["member_id"], members
    )


def _describe_groups(broker: b.Broker, req: Any) -> Any:
    groups: list[tuple[Any, ...]] = []
    for group_id in req.groups:
        state, protocol_type, protocol, members = broker.coordinator.describe_group(group_id)
        rows = [(m.member_id, m.client_id, "/sim", b"", m.assignment) for m in members]
        groups.append((0, group_id, state, protocol_type, protocol, rows, -2147483648))
    if req.API_VERSION < 3:
        groups = [row[:-1] for row in groups]
    if req.API_VERSION == 0:
        return req.RESPONSE_TYPE(groups)
    return req.RESPONSE_TYPE(0, groups)


def _describe_configs(broker: b.Broker, req: Any) -> Any:
    resources: list[tuple[int, str | None, int, str, list[ConfigEntry]]] = []
    for resource_type, name, _keys in req.resources:
        topic = broker.topics.get(name)
        if topic is None:
            resources.append(
                (codes.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name} does not exist", resource_type, name, [])
            )
            continue
        entries: list[ConfigEntry] = [(k, v, False, 1, False, []) for k, v in topic.config.as_dict().items()]
        resources.append((0, None, resource_type, name, entries))
    return req.RESPONSE_TYPE(0, resources)

"""A stand-in for the broker behind ``AIOKafkaAdminClient``: topics in memory, no network.

:class:`FakeBroker` holds the topics (partition count, configs, id) and how the broker
behaves: a topic it knows but does not serve yet (``hidden_for`` describe calls, answered
with ``hidden_code`` and ``hidden_partitions`` partitions), topics another client creates
between our describe and our create (``concurrent``), refusals of a create (``create_errors``)
or of a config change (``alter_errors``), a start that fails (``start_error``) or never ends
(``start_hangs``). It records what was asked: the clients made (with their arguments), the
topics created, the describe calls, the configs read and the configs altered.

:class:`FakeAdminClient` is one client over it, with the calls ``pipeline.kafka.admin`` makes:
``start``, ``close``, ``describe_topics``, ``create_topics``, ``describe_configs``, and
``_send_request``, through which :func:`pipeline.kafka.internals.admin_request` sends
IncrementalAlterConfigs (``set_topic_configs``) and Metadata v12 (``cluster_ids``): each
request is prepared and encoded as for the wire, then decoded, so the fake reads the bytes
a broker would. :class:`FakeClock` stands in for ``asyncio`` inside ``pipeline.kafka.admin``:
its sleeps move the clock at once and are recorded.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any

from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from pipeline.kafka.alter_configs import IncrementalAlterConfigsRequest, _ResponseV0
from pipeline.kafka.requests import MetadataRequest, MetadataResponseV12

UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
TOPIC_ALREADY_EXISTS = 36
INVALID_REQUEST = 42
#: the versions of IncrementalAlterConfigs and Metadata a Kafka 4 broker serves (ApiVersions)
VERSIONS = {44: (0, 1), 3: (0, 13)}
#: some of Kafka's defaults, which DescribeConfigs lists beside a topic's own settings
KAFKA_DEFAULTS = {"cleanup.policy": "delete", "retention.ms": "604800000", "max.message.bytes": "1048588"}

_real_sleep = asyncio.sleep


@dataclass
class FakeTopic:
    """One topic of the fake broker."""

    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    topic_id: uuid.UUID = field(default_factory=uuid.uuid4)
    hidden_for: int = 0  # describe calls still answered as known but not served
    hidden_code: int = LEADER_NOT_AVAILABLE  # the topic's error code while hidden
    hidden_partitions: int = 0  # how many partitions it shows while hidden


@dataclass(frozen=True)
class Created:
    """One topic as a CreateTopics request asked for it."""

    name: str
    partitions: int
    replication: int
    configs: dict[str, str]


@dataclass
class FakeBroker:
    """The topics and the recorded requests; :meth:`client` is ``AIOKafkaAdminClient``'s stand-in."""

    topics: dict[str, FakeTopic] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=lambda: dict(KAFKA_DEFAULTS))
    cluster_id: str = "fake-cluster"
    serve_after: int = 0  # describe calls a created topic is known but not served for
    concurrent: set[str] = field(default_factory=set)  # created by someone else just before our create
    create_errors: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    messages_in_create_errors: bool = True  # False: CreateTopics v0's (name, code) pairs
    alter_errors: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    # DescribeConfigs refused per topic: (code, message)
    config_errors: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    # (partitions, configs) another client gave a topic of ``concurrent`` (default: as we asked)
    concurrent_layouts: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    start_error: BaseException | None = None
    start_hangs: bool = False
    # what was asked
    clients: list[FakeAdminClient] = field(default_factory=list)
    described: list[list[str] | None] = field(default_factory=list)
    created: list[Created] = field(default_factory=list)
    create_timeouts: list[int | None] = field(default_factory=list)
    config_reads: list[list[str]] = field(default_factory=list)
    altered: list[dict[str, dict[str, str]]] = field(default_factory=list)
    metadata_asked: list[list[str]] = field(default_factory=list)

    def add(
        self,
        name: str,
        partitions: int,
        configs: dict[str, str] | None = None,
        *,
        hidden_for: int = 0,
        hidden_code: int = LEADER_NOT_AVAILABLE,
        hidden_partitions: int = 0,
    ) -> FakeTopic:
        """Make ``name`` exist with ``partitions`` and ``configs``, known but not served for ``hidden_for``
        describe calls (answered meanwhile with ``hidden_code`` and ``hidden_partitions`` partitions)."""
        topic = FakeTopic(
            partitions,
            dict(configs or {}),
            hidden_for=hidden_for,
            hidden_code=hidden_code,
            hidden_partitions=hidden_partitions,
        )
        self.topics[name] = topic
        return topic

    def client(self, **kwargs: Any) -> FakeAdminClient:
        """A new client, as ``AIOKafkaAdminClient(bootstrap_servers=..., request_timeout_ms=...)``."""
        made = FakeAdminClient(self, kwargs)
        self.clients.append(made)
        return made

    def configs_of(self, name: str) -> dict[str, str]:
        """Every config of ``name`` as DescribeConfigs lists it: the defaults and its own."""
        return self.defaults | self.topics[name].configs

    def describe(self, name: str) -> dict[str, Any]:
        """One topic's metadata as ``describe_topics`` gives it (one more describe call for a hidden topic)."""
        topic = self.topics.get(name)
        if topic is None:
            return {
                "error_code": UNKNOWN_TOPIC_OR_PARTITION,
                "topic": name,
                "is_internal": False,
                "partitions": [],
            }
        code, count = 0, topic.partitions
        if topic.hidden_for > 0:
            topic.hidden_for -= 1
            code, count = topic.hidden_code, topic.hidden_partitions
        partitions = [
            {"error_code": 0, "partition": p, "leader": 1, "replicas": [1], "isr": [1]} for p in range(count)
        ]
        return {"error_code": code, "topic": name, "is_internal": False, "partitions": partitions}

    def alter(
        self, resources: list[tuple[int, str, list[tuple[str, int, str]]]]
    ) -> list[tuple[int, str | None, int, str]]:
        """Apply an IncrementalAlterConfigs request's resources; each one's answer."""
        answers: list[tuple[int, str | None, int, str]] = []
        asked: dict[str, dict[str, str]] = {}
        for resource_type, name, configs in resources:
            asked[name] = {key: value for key, _operation, value in configs}
            if name in self.alter_errors:
                code, message = self.alter_errors[name]
            elif name not in self.topics:
                code, message = UNKNOWN_TOPIC_OR_PARTITION, "This server does not host this topic-partition."
            elif resource_type != ConfigResourceType.TOPIC.value or any(op != 0 for _k, op, _v in configs):
                code, message = INVALID_REQUEST, "only SET on topics is modelled"
            else:
                self.topics[name].configs |= asked[name]
                code, message = 0, None
            answers.append((code, message, resource_type, name))
        self.altered.append(asked)
        return answers


class FakeAdminClient:
    """One admin client over a :class:`FakeBroker`."""

    def __init__(self, broker: FakeBroker, kwargs: dict[str, Any]) -> None:
        self.broker = broker
        self.kwargs = kwargs
        self.started = False
        self.closed = 0  # how many times close was called

    async def start(self) -> None:
        if self.broker.start_hangs:
            await asyncio.Event().wait()
        if self.broker.start_error is not None:
            raise self.broker.start_error
        self.started = True

    async def close(self) -> None:
        self.closed += 1

    async def describe_topics(self, topics: list[str] | None = None) -> list[dict[str, Any]]:
        self.broker.described.append(None if topics is None else list(topics))
        names = list(self.broker.topics) if topics is None else topics
        return [self.broker.describe(name) for name in names]

    async def create_topics(self, new_topics: list[NewTopic], timeout_ms: int | None = None) -> Any:
        broker = self.broker
        broker.create_timeouts.append(timeout_ms)
        errors: list[tuple[Any, ...]] = []
        for topic in new_topics:
            broker.created.append(
                Created(topic.name, topic.num_partitions, topic.replication_factor, dict(topic.topic_configs))
            )
            code: int
            message: str | None
            if topic.name in broker.create_errors:
                code, message = broker.create_errors[topic.name]
            elif topic.name in broker.concurrent:
                partitions, configs = broker.concurrent_layouts.get(
                    topic.name, (topic.num_partitions, dict(topic.topic_configs))
                )
                broker.add(topic.name, partitions, configs, hidden_for=broker.serve_after)
                code, message = TOPIC_ALREADY_EXISTS, f"Topic '{topic.name}' already exists."
            elif topic.name in broker.topics:
                code, message = TOPIC_ALREADY_EXISTS, f"Topic '{topic.name}' already exists."
            else:
                broker.add(
                    topic.name, topic.num_partitions, dict(topic.topic_configs), hidden_for=broker.serve_after
                )
                code, message = 0, None
            errors.append(
                (topic.name, code, message) if broker.messages_in_create_errors else (topic.name, code)
            )
        return CreateTopicsAnswer(errors)

    async def describe_configs(self, config_resources: Sequence[ConfigResource]) -> list[Any]:
        names = []
        resources: list[tuple[int, str | None, int, str, list[tuple[str, str, bool, bool, bool]]]] = []
        for resource in config_resources:
            assert resource.resource_type is ConfigResourceType.TOPIC, resource.resource_type
            names.append(resource.name)
            if resource.name not in self.broker.topics:
                resources.append((UNKNOWN_TOPIC_OR_PARTITION, "unknown topic", 2, resource.name, []))
                continue
            if resource.name in self.broker.config_errors:
                code, message = self.broker.config_errors[resource.name]
                resources.append((code, message, 2, resource.name, []))
                continue
            configs = self.broker.configs_of(resource.name)
            entries = [
                (key, value, False, key not in self.broker.topics[resource.name].configs, False)
                for key, value in configs.items()
            ]
            resources.append((0, None, 2, resource.name, entries))
        self.broker.config_reads.append(names)
        return [DescribeConfigsAnswer(resources)]

    async def _send_request(self, request: Any) -> Any:
        """IncrementalAlterConfigs and Metadata v12, read from their encoded bytes."""
        struct = request.prepare(VERSIONS)
        decoded = type(struct).decode(BytesIO(struct.encode()))
        if isinstance(request, IncrementalAlterConfigsRequest):
            assert decoded.validate_only is False
            answer = _ResponseV0(0, self.broker.alter(decoded.resources))
            return _ResponseV0.decode(BytesIO(answer.encode()))
        if isinstance(request, MetadataRequest):
            return self._metadata([name for _id, name, _tags in decoded.topics])
        raise AssertionError(f"the fake broker does not answer {type(request).__name__}")

    def _metadata(self, names: list[str]) -> Any:
        self.broker.metadata_asked.append(names)
        topics: list[tuple[Any, ...]] = []
        for name in names:
            topic = self.broker.topics.get(name)
            if topic is None:
                topics.append((UNKNOWN_TOPIC_OR_PARTITION, name, uuid.UUID(int=0), False, [], 0, {}))
            else:
                partitions: list[tuple[Any, ...]] = [
                    (0, p, 1, 0, [1], [1], [], {}) for p in range(topic.partitions)
                ]
                topics.append((0, name, topic.topic_id, False, partitions, 0, {}))
        answer = MetadataResponseV12(
            0, [(1, "broker", 9092, None, {})], self.broker.cluster_id, 1, topics, {}
        )
        return MetadataResponseV12.decode(BytesIO(answer.encode()))


@dataclass(frozen=True)
class CreateTopicsAnswer:
    """A CreateTopics response: ``(name, code, message)`` per topic (``(name, code)`` in v0)."""

    topic_errors: list[tuple[Any, ...]]


@dataclass(frozen=True)
class DescribeConfigsAnswer:
    """A DescribeConfigs response: ``(code, message, type, name, entries)`` per resource."""

    resources: list[tuple[int, str | None, int, str, list[tuple[str, str, bool, bool, bool]]]]


@dataclass
class FakeClock:
    """``asyncio`` as ``pipeline.kafka.admin`` uses it, on a clock that only sleeps move.

    ``get_running_loop().time()`` reads the clock; ``sleep`` records its delay and moves the
    clock by it at once; ``wait_for`` is asyncio's own (the start's timeout stays real).
    """

    now: float = 0.0
    sleeps: list[float] = field(default_factory=list)

    def get_running_loop(self) -> FakeClock:
        return self

    def time(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        self.now += delay
        await _real_sleep(0)

    wait_for = staticmethod(asyncio.wait_for)

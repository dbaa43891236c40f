"""Topic administration: the topics a topology needs, created and checked idempotently."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError, RequestTimedOutError

from pipeline.errors import BrokerUnavailableError, ConfigError, PipelineError
from pipeline.kafka.alter_configs import set_topic_configs
from pipeline.kafka.settings import MAX_MESSAGE_BYTES
from pipeline.topology import Topology

log = logging.getLogger(__name__)

TOPIC_ALREADY_EXISTS = 36
NO_LIMIT_MS = 2**63 - 1  # Kafka's Long.MAX_VALUE: no bound
UNKNOWN_TOPIC_OR_PARTITION = 3


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic as the pipeline wants it."""

    name: str
    partitions: int
    replication: int = 1
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopicResult:
    """What ``ensure_topics`` did to one topic."""

    name: str
    action: str  # "created" | "exists" | "updated"
    partitions: int
    note: str = ""


def topic_specs(topology: Topology, partitions: int | None = None) -> list[TopicSpec]:
    """Every topic a topology needs, with its configs.

    The changelog has as many partitions as the input topic (partition *p* of
    one restores partition *p* of the other), is compacted *and* deleted, and
    keeps records for the largest TTL plus a margin.
    """
    count = partitions or topology.topics.partitions
    replication = topology.topics.replication
    retention_ms = int(topology.changelog_retention.total_seconds() * 1000)
    plain = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
    # deleted by time only (never by size: retention.bytes would drop live claims), after the largest TTL and a day
    changelog = plain | {
        "cleanup.policy": "compact,delete",
        "retention.ms": str(retention_ms),
        "retention.bytes": "-1",
    }
    topics = topology.topics
    # a producer whose clock runs ahead must not be refused (Kafka 4 refuses records more than an
    # hour ahead by default): the worker handles such records at its own bound (--max-clock-skew)
    accept_any_time = plain | {"message.timestamp.after.max.ms": str(NO_LIMIT_MS)}
    # a keyless input record has a keyless audit and DLQ record, which a compacted topic refuses
    deleted = plain | {"cleanup.policy": "delete"}
    specs = [
        TopicSpec(topics.input, count, replication, accept_any_time),
        TopicSpec(topics.audit, count, replication, deleted),
        TopicSpec(topics.dlq, count, replication, deleted),
        TopicSpec(topics.changelog, count, replication, changelog),
    ]
    specs += [TopicSpec(name, count, replication, plain) for name in topology.command_topics()]
    if topology.has_effects:
        specs += [
            TopicSpec(topics.effects, count, replication, plain),
            TopicSpec(topics.effects_changelog, count, replication, changelog),
        ]
    return specs


def redrive_history_spec(topology: Topology) -> TopicSpec:
    """The console's redrive history: one partition (one order for every run), compacted (each run
    and each redriven record is keyed; its latest state is kept), never rescaled."""
    configs = {"max.message.bytes": str(MAX_MESSAGE_BYTES), "cleanup.policy": "compact"}
    return TopicSpec(topology.topics.redrives, 1, topology.topics.replication, configs)


# what an admin request raises when the broker went away after the client started
UNREACHABLE = (KafkaConnectionError, NodeNotReadyError, RequestTimedOutError, KafkaTimeoutError)


@asynccontextmanager
async def admin_client(bootstrap: str, *, timeout: float = 10.0) -> AsyncIterator[AIOKafkaAdminClient]:
    """An admin client that raises ``BrokerUnavailableError`` when the broker cannot be reached: at start,
    or while the caller uses it (the broker going away between two requests)."""
    check_bootstrap(bootstrap)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    try:
        await asyncio.wait_for(admin.start(), timeout)
    except (TimeoutError, KafkaConnectionError, OSError) as exc:
        await admin.close()
        why = str(exc) or f"no answer within {timeout:g}s"
        raise BrokerUnavailableError(f"cannot reach Kafka at {bootstrap}: {why}") from None
    except BaseException:  # another error, or a cancellation: nothing is left open behind it
        await admin.close()
        raise
    try:
        yield admin
    except UNREACHABLE as exc:
        raise BrokerUnavailableError(f"lost Kafka at {bootstrap}: {exc!r}") from None
    except TimeoutError:  # aiokafka's admin gives up on a request at its timeout with the builtin error
        raise BrokerUnavailableError(f"lost Kafka at {bootstrap}: no answer within {timeout:g}s") from None
    finally:
        await admin.close()


def check_bootstrap(bootstrap: str) -> None:
    """ConfigError unless ``bootstrap`` is a comma-separated list of ``host:port``.

    A host without a port is refused rather than given Kafka's 9092 silently: a
    newcomer's ``--bootstrap 127.0.0.1`` would otherwise reach another broker, or none.
    Every command meets it before its first connection (:func:`admin_client`); the
    ingress and ``up`` also before they start anything.
    """
    for entry in bootstrap.split(","):
        host, colon, port = entry.strip().rpartition(":")
        if entry.strip() and not colon:
            raise ConfigError(
                f"bootstrap servers {bootstrap!r}: {entry.strip()!r} has no port; give host:port"
                f" (e.g. {entry.strip()}:9092)"
            )
        if not entry.strip() or not (host and port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(f"bootstrap servers {bootstrap!r}: {entry.strip()!r} is not host:port")


async def ensure_topics(
    bootstrap: str, specs: Sequence[TopicSpec], *, timeout: float = 10.0
) -> list[TopicResult]:
    """Create the topics that are missing and restore the configs the pipeline owns.

    Idempotent: running it twice leaves the same topics with the same configs.
    Only the keys a spec names are set, with IncrementalAlterConfigs: every other
    setting of an existing topic (an operator's ``retention.ms`` on the input,
    say) is left as it is. A topic whose partition count differs from the one
    asked raises ``ConfigError`` before anything is created or changed: raising
    a count moves keys between partitions, which only ``pipeline rescale`` does
    safely, and a count cannot be lowered at all.
    """
    async with admin_client(bootstrap, timeout=timeout) as admin:
        existing = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics()}
        problem = _partition_problem(specs, existing)
        if problem is not None:
            raise ConfigError(problem)
        missing = [s for s in specs if s.name not in existing]
        results: list[TopicResult] = []
        if missing:
            response = await admin.create_topics(
                [NewTopic(s.name, s.partitions, s.replication, topic_configs=s.configs) for s in missing],
                timeout_ms=int(timeout * 1000),
            )
            raced = set()  # created by another client between our describe and our create
            for name, code, *rest in response.topic_errors:
                if code == TOPIC_ALREADY_EXISTS:
                    raced.add(name)
                elif code != 0:
                    message = (rest[0] if rest else "") or ""  # v1+ carry a message, which may be null
                    raise PipelineError(f"cannot create topic {name}: error {code} {message}".strip())
            made = [s for s in missing if s.name not in raced]
            if made:
                await until_served(admin, {s.name: s.partitions for s in made}, timeout=timeout)
            results += [TopicResult(s.name, "created", s.partitions) for s in made]
            if raced:  # taken as they are, as any existing topic: its count checked, our configs restored
                existing.update(await _served_counts(admin, sorted(raced), timeout))
                problem = _partition_problem([s for s in specs if s.name in raced], existing)
                if problem is not None:
                    raise ConfigError(problem)
        present = [s for s in specs if s.name in existing]
        current = await read_configs(admin, [s.name for s in present if s.configs])
        changes = {
            s.name: {
                key: value for key, value in s.configs.items() if current.get(s.name, {}).get(key) != value
            }
            for s in present
        }
        changes = {name: configs for name, configs in changes.items() if configs}
        await set_topic_configs(admin, changes)
        for spec in present:
            changed = changes.get(spec.name, {})
            note = "restored " + ", ".join(f"{k}={v}" for k, v in sorted(changed.items())) if changed else ""
            results.append(
                TopicResult(spec.name, "updated" if changed else "exists", existing[spec.name], note)
            )
        return results


async def _served_counts(admin: AIOKafkaAdminClient, names: list[str], timeout: float) -> dict[str, int]:
    """Each topic's partition count once the broker serves it (another client just created it)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        counts = {t["topic"]: served_partitions(t) for t in await admin.describe_topics(names)}
        if all(counts.get(name) for name in names):
            return {name: count for name, count in counts.items() if count}
        if asyncio.get_running_loop().time() > deadline:
            missing = ", ".join(name for name in names if not counts.get(name))
            raise PipelineError(
                f"topics created by another client but not served after {timeout:g}s: {missing}"
            )
        await asyncio.sleep(0.1)


def _partition_problem(specs: Sequence[TopicSpec], existing: dict[str, int]) -> str | None:
    """One line naming each existing topic whose partition count is not the one asked, and the fix."""
    wrong = [(s, existing[s.name]) for s in specs if s.name in existing and existing[s.name] != s.partitions]
    if not wrong:
        return None
    asked = max(s.partitions for s, _ in wrong)
    listed = ", ".join(f"{s.name} has {count}" for s, count in wrong)
    fixes = []
    more = [count for s, count in wrong if count > s.partitions]
    if more:
        fixes.append(
            f"partitions cannot be removed: set topics.partitions = {max(more)} in the topology"
            f" (or pass --partitions {max(more)})"
        )
    if any(count < s.partitions for s, count in wrong):
        fixes.append(
            f"raise them with 'pipeline rescale --partitions {asked}' (workers stopped: it moves"
            " the keys; a changelog needs as many partitions as its input)"
        )
    return f"partition counts differ from the {asked} asked ({listed}); nothing was changed: " + "; or ".join(
        fixes
    )


async def read_configs(admin: AIOKafkaAdminClient, names: Sequence[str]) -> dict[str, dict[str, str]]:
    """The current configs of ``names`` over an open admin client."""
    if not names:
        return {}
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
    )
    configs: dict[str, dict[str, str]] = {}
    for response in responses:
        for code, message, _type, name, entries in response.resources:
            if code == UNKNOWN_TOPIC_OR_PARTITION:
                raise missing_topic(name)
            if code:  # an empty answer would read as the broker's defaults: a limit or a bound lost
                raise PipelineError(
                    f"cannot read the configs of topic {name}: {message} (Kafka error {code})"
                )
            configs[name] = {entry[0]: entry[1] for entry in entries}
    return configs


async def until_served(admin: AIOKafkaAdminClient, wanted: dict[str, int], *, timeout: float) -> None:
    """Wait until the broker's metadata shows each topic of ``wanted`` with all its partitions.

    CreateTopics (and CreatePartitions) answer once the controller has made them; a
    broker can take a moment more to serve them, and a worker started right after
    ``pipeline topics create`` would find them missing, as a producer writing to a
    partition ``pipeline rescale`` just added would (aiokafka asserts it knows it).
    """
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        described = await admin.describe_topics(list(wanted))
        ready = {t["topic"] for t in described if served_partitions(t) == wanted.get(t["topic"])}
        if ready >= set(wanted):
            return
        if asyncio.get_running_loop().time() > deadline:
            missing = ", ".join(sorted(set(wanted) - ready))
            raise PipelineError(f"topics created but not served by the broker after {timeout:g}s: {missing}")
        await asyncio.sleep(0.1)


async def partition_count(bootstrap: str, topic: str) -> int | None:
    """How many partitions ``topic`` has, or ``None`` when it does not exist."""
    async with admin_client(bootstrap) as admin:
        [described] = await admin.describe_topics([topic])
    return served_partitions(described)


def missing_topic(topic: str) -> ConfigError:
    """The one line that says ``topic`` does not exist, and what to run."""
    return ConfigError(f"topic {topic} does not exist: run 'pipeline topics create' first")


async def require_topic(bootstrap: str, topic: str, *, timeout: float = 10.0) -> int:
    """How many partitions ``topic`` has; ConfigError at once when the broker does not know it.

    One metadata answer says so, where a producer or consumer would retry until its
    own timeout. A topic the broker knows but does not serve whole yet (just created)
    is waited for, up to ``timeout`` seconds.
    """
    async with admin_client(bootstrap, timeout=timeout) as admin:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            [described] = await admin.describe_topics([topic])
            count = served_partitions(described)
            if count is not None:
                return count
            if described.get("error_code") == UNKNOWN_TOPIC_OR_PARTITION:
                raise missing_topic(topic)
            if asyncio.get_running_loop().time() > deadline:
                raise BrokerUnavailableError(f"topic {topic} is not served by Kafka at {bootstrap} yet")
            await asyncio.sleep(0.1)


def served_partitions(described: dict[str, Any]) -> int | None:
    """The partition count in one topic's metadata, or ``None`` when the broker does not serve it."""
    if described.get("error_code", 0) != 0 or not described.get("partitions"):
        return None
    return len(described["partitions"])


async def describe_topic_configs(bootstrap: str, names: Sequence[str]) -> dict[str, dict[str, str]]:
    """The current configs of ``names`` (all keys, defaults included)."""
    async with admin_client(bootstrap) as admin:
        return await read_configs(admin, names)

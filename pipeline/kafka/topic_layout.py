"""What the worker learns about its topics at start (:func:`topic_layout`): counts, limits, timestamp bounds and ids,
and the configs it refuses to start on (:mod:`pipeline.kafka.topic_checks`)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import ConfigError
from pipeline.kafka.admin import NO_LIMIT_MS, admin_client, missing_topic, read_configs, served_partitions
from pipeline.kafka.internals import cluster_ids
from pipeline.kafka.settings import MAX_MESSAGE_BYTES
from pipeline.kafka.topic_checks import refused_configs
from pipeline.topology import Topology


@dataclass(frozen=True, slots=True)
class TopicLayout:
    """What the worker learns about its topics at start."""

    counts: dict[str, int]  # partitions of each topic
    limits: dict[str, int]  # the largest record each takes
    timestamps: dict[str, tuple[int, int]]  # (before, after) ms each accepts, for the topics that bound them
    cluster: str  # the cluster's id
    topic_ids: dict[str, str]  # each topic's id: a topic deleted and created again has another


class RefusedConfigError(ConfigError):
    """A topic config the worker refuses to start on (:mod:`pipeline.kafka.topic_checks`), with the layout read
    beside it: a running worker that reads its topics again still takes their limits from it."""

    def __init__(self, message: str, layout: TopicLayout) -> None:
        super().__init__(message)
        self.layout = layout


def timestamp_bounds(configs: dict[str, str]) -> tuple[int, int] | None:
    """The (before, after) ms around the broker's clock a topic accepts, or None when it takes any time.

    ``message.timestamp.before.max.ms`` and ``after.max.ms`` (Kafka 3.6 and later; Kafka 4's
    default after is one hour), else the older ``message.timestamp.difference.max.ms`` both
    ways; a topic stamped with the log append time accepts anything.
    """
    if configs.get("message.timestamp.type") == "LogAppendTime":
        return None

    def bound(key: str) -> int:
        raw = configs.get(key) or configs.get("message.timestamp.difference.max.ms") or ""
        return int(raw) if raw.isdigit() else NO_LIMIT_MS

    before, after = bound("message.timestamp.before.max.ms"), bound("message.timestamp.after.max.ms")
    if before >= NO_LIMIT_MS and after >= NO_LIMIT_MS:
        return None
    return before, after


async def topic_layout(bootstrap: str, topology: Topology, *, timeout: float = 10.0) -> TopicLayout:
    """Every topic the worker reads or writes: its partition count, largest record and timestamp
    bounds, with the cluster id and the topic ids, over one admin connection.

    Raises :class:`ConfigError` when a topic is missing or a changelog's partition count differs from
    its source topic's, and :class:`RefusedConfigError` (with the layout) for a config the worker refuses
    to start on (a changelog deleted sooner than its claims live or by size, a compacted audit or DLQ topic).
    """
    topics = topology.topics
    names = [topics.input, topics.audit, topics.dlq, topics.changelog, *topology.command_topics()]
    stages = [(topics.input, topics.changelog)]
    if topology.has_effects:
        names += [topics.effects, topics.effects_changelog]
        stages.append((topics.effects, topics.effects_changelog))
    async with admin_client(bootstrap, timeout=timeout) as admin:
        described = {t["topic"]: served_partitions(t) for t in await admin.describe_topics(names)}
        counts = {}
        for name in names:
            count = described.get(name)
            if count is None:
                raise missing_topic(name)
            counts[name] = count
        for source, changelog in stages:
            if counts[changelog] != counts[source]:
                raise ConfigError(
                    f"changelog {changelog} has {counts[changelog]} partitions but {source} "
                    f"has {counts[source]}: they must match (a `pipeline rescale` that did not finish? "
                    "run it again)"
                )
        configs = await read_configs(admin, names)
        ids = await cluster_ids(admin, names)
    limits = {}
    bounds = {}
    for name in names:
        raw = configs.get(name, {}).get("max.message.bytes")
        limit = int(raw) if raw and raw.isdigit() else MAX_MESSAGE_BYTES
        limits[name] = min(limit, MAX_MESSAGE_BYTES)  # the producers' own request limit
        found = timestamp_bounds(configs.get(name, {}))
        if found is not None:
            bounds[name] = found
    layout = TopicLayout(counts, limits, bounds, ids.cluster, ids.topics)
    refusal = refused_configs(topology, configs)
    if refusal is not None:
        raise RefusedConfigError(str(refusal), layout)
    return layout

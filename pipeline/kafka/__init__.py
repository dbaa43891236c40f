"""Kafka wiring: topic administration, client settings and the key partitioner.

Everything under here talks to the broker except :mod:`pipeline.kafka.partitioner`;
the pure logic (key extraction, the dedupe decision) imports nothing from it.
"""

from __future__ import annotations

from aiokafka.errors import KafkaError

from pipeline.kafka.admin import (
    TopicResult,
    TopicSpec,
    admin_client,
    describe_topic_configs,
    ensure_topics,
    partition_count,
    topic_specs,
)
from pipeline.kafka.partitioner import KeyPartitioner, murmur2, owner_partition
from pipeline.kafka.settings import MAX_MESSAGE_BYTES

__all__ = [
    "MAX_MESSAGE_BYTES",
    "KafkaError",
    "KeyPartitioner",
    "TopicResult",
    "TopicSpec",
    "admin_client",
    "describe_topic_configs",
    "ensure_topics",
    "murmur2",
    "owner_partition",
    "partition_count",
    "topic_specs",
]

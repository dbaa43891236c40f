"""The topics of a seed's world, as ``pipeline topics create`` would make them, in the broker model.

Each topic the topology declares (``topic_specs``) with the configs it is given, made small or
strict where the scenario asks: Kafka 4's timestamp bound, small limits on the outputs, changelogs
deleted by retention in small segments (``LogAppendTime`` in some time seeds), small changelog
batches, a command topic too small for a redrive's oversized cause, and the console's history.
"""

from __future__ import annotations

from pipeline.kafka.admin import redrive_history_spec, topic_specs
from pipeline.topology_model import Topology
from tests.simulation import broker as b
from tests.simulation import logs, redrive
from tests.simulation.scenario import CHANGELOG_LIMIT, Scenario

CHANGELOG_SEGMENT_BYTES = 2048  # small segments, so that retention has whole segments to delete


def create_topics(broker: b.Broker, scenario: Scenario, topology: Topology) -> None:
    """Every topic of ``topology`` in ``broker``, configured as ``scenario`` draws them."""
    for spec in topic_specs(topology):
        config = logs.TopicConfig()
        if scenario.flavor == "4.x":
            config.timestamp_after_max_ms = 3_600_000  # Kafka 4's default
        raw = spec.configs
        if "max.message.bytes" in raw:
            config.max_message_bytes = int(raw["max.message.bytes"])
        if "message.timestamp.after.max.ms" in raw:
            config.timestamp_after_max_ms = int(raw["message.timestamp.after.max.ms"])
        if "message.timestamp.before.max.ms" in raw:
            config.timestamp_before_max_ms = int(raw["message.timestamp.before.max.ms"])
        if scenario.small_limits and spec.name != topology.topics.input:
            config.max_message_bytes = 4096
        if scenario.mix != "classic" and "retention.ms" in raw:  # the changelogs: deleted by time
            config.cleanup_policy = raw.get("cleanup.policy", "delete")
            config.retention_ms = int(raw["retention.ms"])
            config.segment_bytes = CHANGELOG_SEGMENT_BYTES
            if scenario.time is not None and scenario.time.log_append_time:
                config.timestamp_type = logs.LOG_APPEND_TIME
        if scenario.small_changelogs and "retention.ms" in raw:
            config.max_message_bytes = CHANGELOG_LIMIT
        if (
            scenario.redrive is not None
            and redrive.SIZE in scenario.redrive.causes
            and spec.name == topology.topics.commands
        ):
            config.max_message_bytes = min(config.max_message_bytes, redrive.COMMAND_LIMIT)
        broker.create_topic(spec.name, spec.partitions, config)
    if any(f.kind == redrive.CONSOLE for f in scenario.faults):  # the console's history (it never creates it
        history = redrive_history_spec(topology)  # here: the model answers no CreateTopics)
        broker.create_topic(history.name, 1, logs.TopicConfig(cleanup_policy="compact"))

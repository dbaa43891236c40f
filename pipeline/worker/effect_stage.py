"""The effect stage: commands keyed and partitioned by their effect key, deduped once more.

A route with an ``effect_key`` sends its commands here instead of to the
command topic (see :func:`pipeline.worker.event_stage.resolve_target`). Two different
events that mean the same effect (Stripe's ``checkout.session.completed`` and
``payment_intent.succeeded`` for one payment) meet on one partition of the
effects topic, and only the first within the effect TTL reaches the command
topic. The same machinery as the first stage applies: a RocksDB seen-set per
partition, one transaction per batch with the changelog, audit and offsets.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from aiokafka import TopicPartition

from pipeline.contract import Delivery, audit_value, dlq_value, parse_json_object
from pipeline.state.decision import Outcome, decide
from pipeline.state.transaction import PartitionCheckpoint
from pipeline.topology import Topology
from pipeline.worker.event_stage import (
    COMMAND_TOPIC_HEADER,
    EFFECT_TTL_HEADER,
    OutputTopics,
    handle_in_chunks,
)
from pipeline.worker.metrics import NullRecorder, Recorder

log = logging.getLogger(__name__)


class EffectProcessor:
    """Dedupes commands of one effects-topic partition by effect key."""

    def __init__(
        self,
        *,
        tp: TopicPartition,
        topology: Topology,
        checkpoint: PartitionCheckpoint,
        outputs: OutputTopics,
        recorder: Recorder | None = None,
    ) -> None:
        self.tp = tp
        self.topology = topology
        self.checkpoint = checkpoint
        self.outputs = outputs
        self.recorder: Recorder = recorder or NullRecorder()

    async def handle(self, records: Sequence[Any]) -> None:
        """Process effect records into the open transaction, in chunks, as the first stage does."""
        await handle_in_chunks(self.checkpoint, records, self._chunk)

    def _chunk(self, records: Sequence[Any]) -> None:
        ckpt = self.checkpoint
        deliveries = Delivery.from_records(records)
        keys = [d.key for d in deliveries if d.key]
        known = ckpt.lookup(list(dict.fromkeys(k for k in keys if k is not None)))
        for delivery in deliveries:
            self._one(delivery, known)
            ckpt.consumed(delivery.offset, delivery.timestamp)

    def _one(self, delivery: Delivery, known: dict[bytes, Any]) -> None:
        ckpt = self.checkpoint
        command = parse_json_object(delivery.value)
        ttl = delivery.headers.get(EFFECT_TTL_HEADER, "")
        topic = delivery.headers.get(COMMAND_TOPIC_HEADER)
        if not delivery.key or command is None or not ttl.isdigit() or not topic:
            self._invalid(delivery)
            return
        key = delivery.key
        effect_key = key.decode("utf-8", "replace")
        existing = ckpt.staged(key) or known.get(key)
        decision = decide(
            existing,
            timestamp=delivery.timestamp,
            ttl_ms=int(ttl),
            sliding=False,
            partition=delivery.partition,
            offset=delivery.offset,
            command=str(command.get("command")),
            topic=topic,
        )
        entry = decision.entry
        value = ckpt.stage(key, entry, decision.previous)
        if decision.outcome is Outcome.FIRST:
            self.recorder.command(topic)
            ckpt.emit(
                topic,
                self.outputs.partition_for(topic, key),
                key=key,
                value=delivery.value,
                timestamp=delivery.timestamp,
            )
        ckpt.emit(  # every state change, so a restored store has the counts too
            ckpt.changelog.topic,
            ckpt.changelog.partition,
            key=key,
            value=value,
            timestamp=delivery.timestamp,
        )
        audit = self.topology.topics.audit
        value = audit_value(
            key=effect_key,
            outcome=decision.outcome.value,
            partition=delivery.partition,
            offset=delivery.offset,
            received_at=int(command.get("received_at") or delivery.timestamp),
            first_seen_at=entry.first_seen,
            source=command.get("source"),
            event_type=command.get("event_type"),
            expires_at=entry.expires_at,
            extra={"stage": "effect", "event_key": command.get("key"), "command": command.get("command")},
        )
        ckpt.emit(
            audit, self.outputs.partition_for(audit, key), key=key, value=value, timestamp=delivery.timestamp
        )
        log.info(
            "%s effect_key=%s key=%s outcome=%s",
            self.tp,
            effect_key,
            command.get("key"),
            decision.outcome.value,
        )
        self.recorder.outcome(command.get("source"), f"effect-{decision.outcome.value}")

    def _invalid(self, delivery: Delivery) -> None:
        dlq = self.topology.topics.dlq
        error = "an effects-topic record without key, command JSON, effect TTL or command topic"
        self.checkpoint.emit(
            dlq,
            delivery.partition % self.outputs.partitions[dlq],
            key=delivery.key,
            value=dlq_value(delivery, error=error, reason="bad-effect-record"),
            timestamp=delivery.timestamp,
        )
        self.recorder.dlq("bad-effect-record")
        log.warning("%s offset=%s to the DLQ: %s", self.tp, delivery.offset, error)

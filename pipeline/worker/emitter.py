"""What both stages write into a partition's transaction: commands, audit, DLQ records and reroutes.

One emitter per partition, over its :class:`PartitionTransaction`. Every input
record ends in exactly one audit record. A DLQ record always fits its topic
(the body is truncated and hashed when it would not), so bad input can never
block a partition; a command or rerouted copy that does not fit raises
:class:`RecordTooLargeError` *before* anything about its key is staged, and
the stage sends the record to the DLQ instead.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.contract import Delivery, audit_value
from pipeline.dead_letter import dlq_value
from pipeline.headers import REROUTED_FROM_HEADER
from pipeline.log_text import escape
from pipeline.state.partition_transaction import PartitionTransaction
from pipeline.state.transaction import Header
from pipeline.topology import Topics
from pipeline.worker.metrics import Recorder

log = logging.getLogger(__name__)

MAX_DLQ_KEY_BYTES = 16 * 1024  # a longer key is replaced by its hash in DLQ and audit records


def _bounded(key: bytes) -> bytes:
    """``key``, or ``sha256:<hex>`` of it when it is longer than :data:`MAX_DLQ_KEY_BYTES`."""
    if len(key) <= MAX_DLQ_KEY_BYTES:
        return key
    return b"sha256:" + hashlib.sha256(key).hexdigest().encode()


@dataclass(frozen=True, slots=True)
class OutputTopics:
    """Where records go, each topic's partition count, the largest record each takes, and the
    timestamps each accepts: ``(before, after)`` ms around the broker's clock, for the topics that
    set ``message.timestamp.before.max.ms`` or ``message.timestamp.after.max.ms``."""

    partitions: Mapping[str, int]
    partitioner: Callable[[bytes, int], int]
    limits: Mapping[str, int]
    timestamps: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def partition_for(self, topic: str, key: bytes) -> int:
        """The partition the default (murmur2) partitioner gives ``key`` on ``topic``."""
        return self.partitioner(key, self.partitions[topic])


class Emitter:
    """Appends one partition's output records to its open transaction."""

    def __init__(
        self, txn: PartitionTransaction, *, topics: Topics, outputs: OutputTopics, recorder: Recorder
    ) -> None:
        self.txn = txn
        self.topics = topics
        self.outputs = outputs
        self.recorder = recorder

    def command(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        *,
        timestamp: int,
        headers: list[Header] | None = None,
        hashed: int | None = None,
    ) -> None:
        """A command (or an effect-stage record) keyed by ``key``, on the partition murmur2 gives it
        (``hashed``: ``key``'s :func:`~pipeline.kafka.partitioner.key_hash`, when the caller has it)."""
        self.txn.emit(
            topic,
            self.outputs.partition_for(topic, key)
            if hashed is None
            else hashed % self.outputs.partitions[topic],
            key=key,
            value=value,
            timestamp=timestamp,
            headers=headers,
        )

    def command_fits(self, topic: str, key: bytes, value: bytes, headers: list[Header] | None = None) -> bool:
        """Whether a command of this size is within ``topic``'s limit."""
        return self.txn.fits(topic, key, value, headers)

    def reroute(self, delivery: Delivery, *, key: str, partition: int) -> None:
        """The record, moved to the input partition that owns ``key`` (raises when it no longer fits)."""
        headers = [(n, v) for n, v in delivery.raw_headers if n.lower() != REROUTED_FROM_HEADER]
        headers.append((REROUTED_FROM_HEADER, f"{delivery.partition}:{delivery.offset}".encode()))
        self.txn.emit(
            delivery.topic,
            partition,
            key=key.encode(),
            value=delivery.value,
            timestamp=delivery.timestamp,
            headers=headers,
        )

    def dlq(
        self,
        delivery: Delivery,
        *,
        reason: str,
        error: str,
        key: str | None,
        source: str | None,
        extra: Mapping[str, Any] | None = None,
        event_type: str | None = None,
    ) -> None:
        """The record to the DLQ with ``reason`` (truncated to fit), and its ``invalid`` audit record."""
        topic = self.topics.dlq
        limit = self.outputs.limits.get(topic)
        record_key = delivery.key
        if record_key is not None:
            record_key = _bounded(record_key)
        value = dlq_value(delivery, error=error, reason=reason, max_bytes=limit)
        self.txn.emit(
            topic,
            delivery.partition % self.outputs.partitions[topic],
            key=record_key,
            value=value,
            timestamp=delivery.timestamp,
        )
        self.audit(
            delivery,
            key=key,
            outcome="invalid",
            first_seen_at=None,
            source=source,
            event_type=event_type,
            reason=reason,
            extra=extra,
        )
        self.recorder.dlq(reason)
        log.warning(
            "%s-%s key=%s offset=%s to the DLQ: %s (%s)",
            delivery.topic,
            delivery.partition,
            escape(key),
            delivery.offset,
            escape(error, 1000),
            reason,
        )

    def audit(
        self,
        delivery: Delivery,
        *,
        key: str | None,
        outcome: str,
        first_seen_at: int | None,
        source: str | None,
        event_type: str | None = None,
        expires_at: int | None = None,
        reason: str | None = None,
        extra: Mapping[str, Any] | None = None,
        key_bytes: bytes | None = None,
        received_at: int | None = None,
        hashed: int | None = None,
    ) -> None:
        """The audit record of one input record, on the audit partition of its key (``hashed``: the key's
        :func:`~pipeline.kafka.partitioner.key_hash`, when the caller has it)."""
        topic = self.topics.audit
        if key_bytes is None and key is not None:
            key_bytes = key.encode()
        if key_bytes is not None and len(key_bytes) > MAX_DLQ_KEY_BYTES:
            key_bytes = _bounded(key_bytes)
            key = key_bytes.decode()
            hashed = None  # the bounded key is placed, not the original
        if key_bytes is None:
            partition = delivery.partition % self.outputs.partitions[topic]
        elif hashed is None:
            partition = self.outputs.partition_for(topic, key_bytes)
        else:
            partition = hashed % self.outputs.partitions[topic]
        value = audit_value(
            key=key,
            outcome=outcome,
            partition=delivery.partition,
            offset=delivery.offset,
            received_at=delivery.received_at if received_at is None else received_at,
            first_seen_at=first_seen_at,
            source=source,
            event_type=event_type,
            expires_at=expires_at,
            reason=reason,
            extra=extra,
        )
        self.txn.emit(topic, partition, key=key_bytes, value=value, timestamp=delivery.timestamp)

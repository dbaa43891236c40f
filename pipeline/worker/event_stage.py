"""Handle one input partition's records: classify, decide, emit, inside its transaction."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

from pipeline.contract import REROUTED_FROM_HEADER, Delivery, audit_value, command_value, dlq_value
from pipeline.state.decision import Outcome, decide, fingerprint
from pipeline.state.transaction import PartitionCheckpoint
from pipeline.topology import Expiry, Route, Topology
from pipeline.worker.classify import Accepted, Classifier, Invalid, Reroute
from pipeline.worker.metrics import NullRecorder, Recorder, Tally

log = logging.getLogger(__name__)

DEFAULT_COMMAND = "handle"
EFFECT_TTL_HEADER = "effect-ttl-ms"
COMMAND_TOPIC_HEADER = "command-topic"
# Body fields a provider changes from one delivery attempt to the next: left out of conflict checks.
VOLATILE_FIELDS: Mapping[str, tuple[str, ...]] = {"stripe": ("pending_webhooks",)}


@dataclass(frozen=True, slots=True)
class Target:
    """Where an accepted event's command goes."""

    topic: str | None  # None: dropped by an explicit route
    command: str | None
    effect_key: str | None = None
    effect_ttl_ms: int = 0


def resolve_target(topology: Topology, route: Route | None, item: Accepted) -> Target | None:
    """The command topic, name and effect key for ``item``; ``None`` when its effect key is missing."""
    if route is not None and route.drop:
        return Target(None, None)
    topic = route.topic if route and route.topic else topology.topics.commands
    command = route.command if route and route.command else DEFAULT_COMMAND
    if route is None or route.effect_key is None:
        return Target(topic, command)
    value = route.effect_value(item.event)
    if value is None:
        return None
    ttl = route.effect_ttl or item.source.ttl
    return Target(topic, command, f"{command}:{value}", int(ttl.total_seconds() * 1000))


@dataclass(frozen=True, slots=True)
class OutputTopics:
    """Where records go, and each topic's partition count."""

    partitions: Mapping[str, int]
    partitioner: Callable[[bytes, int], int]

    def partition_for(self, topic: str, key: bytes) -> int:
        """The partition the default (murmur2) partitioner gives ``key`` on ``topic``."""
        return self.partitioner(key, self.partitions[topic])


@dataclass(frozen=True, slots=True)
class _Rule:
    """What the decision needs from a source, computed once."""

    ttl_ms: int
    sliding: bool
    volatile: tuple[str, ...]


ROUTE_CACHE_SIZE = 4096
CHUNK_RECORDS = 250  # records handled between two yields to the event loop


async def handle_in_chunks(
    checkpoint: PartitionCheckpoint, records: Sequence[Any], chunk: Callable[[Sequence[Any]], None]
) -> None:
    """Open the transaction, then ``chunk`` the records :data:`CHUNK_RECORDS` at a time.

    The loop gets a turn between chunks, so the producer's sender and other
    partitions' commits (each a few broker round trips) move on while a large
    batch is handled; full batches leave at each turn.
    """
    await checkpoint.begin()
    for start in range(0, len(records), CHUNK_RECORDS):
        if start:
            await asyncio.sleep(0)
        chunk(records[start : start + CHUNK_RECORDS])
        await checkpoint.drain()


class PartitionProcessor:
    """Turns records of one input partition into commands, audit, changelog and DLQ records."""

    def __init__(
        self,
        *,
        tp: TopicPartition,
        topology: Topology,
        classifier: Classifier,
        checkpoint: PartitionCheckpoint,
        outputs: OutputTopics,
        recorder: Recorder | None = None,
    ) -> None:
        self.tp = tp
        self.topology = topology
        self.classifier = classifier
        self.checkpoint = checkpoint
        self.outputs = outputs
        self.recorder = Tally(recorder or NullRecorder())  # flushed after each chunk
        self._routes: dict[tuple[str, str | None], tuple[Route | None, Target | None]] = {}
        self._rules = {
            name: _Rule(
                ttl_ms=int(source.ttl.total_seconds() * 1000),
                sliding=source.expiry is Expiry.SLIDING,
                volatile=VOLATILE_FIELDS.get(source.provider, ()),
            )
            for name, source in topology.sources.items()
        }

    async def handle(self, records: Sequence[Any]) -> None:
        """Process consumer records of this partition into the open transaction."""
        await handle_in_chunks(self.checkpoint, records, self._chunk)

    def _chunk(self, records: Sequence[Any]) -> None:
        ckpt = self.checkpoint
        deliveries = Delivery.from_records(records)
        classified = [self.classifier.classify(d) for d in deliveries]
        keys = [c.key_bytes for c in classified if isinstance(c, Accepted)]
        known = ckpt.lookup(list(dict.fromkeys(keys)))
        for delivery, result in zip(deliveries, classified, strict=True):
            if isinstance(result, Accepted):
                self._accepted(delivery, result, known)
            elif isinstance(result, Reroute):
                self._reroute(delivery, result)
            else:
                self._invalid(delivery, result)
            ckpt.consumed(delivery.offset, delivery.timestamp)
        self.recorder.flush()

    def _route(self, source: str, item: Accepted) -> tuple[Route | None, Target | None]:
        """The route of ``item`` and, when it does not depend on the event, its target.

        Remembered per (source, event type); bounded, since event types come from input.
        """
        found = self._routes.get((source, item.event_type))
        if found is None:
            if len(self._routes) >= ROUTE_CACHE_SIZE:
                self._routes.clear()
            route = self.topology.route(source, item.event_type)
            static = (
                resolve_target(self.topology, route, item)
                if route is None or route.effect_key is None
                else None
            )
            found = self._routes[(source, item.event_type)] = (route, static)
        return found

    def _accepted(self, delivery: Delivery, item: Accepted, known: dict[bytes, Any]) -> None:
        ckpt = self.checkpoint
        source = item.source
        route, target = self._route(source.name, item)
        if target is None:
            target = resolve_target(self.topology, route, item)
        if target is None:
            effect_path = route.effect_key if route else None
            error = f"the event has no value at effect_key {effect_path!r}"
            self._invalid(delivery, Invalid("missing-effect-key", error, item.key, source.name))
            return
        rule = self._rules[source.name]
        key_bytes = item.key_bytes
        existing = ckpt.staged(key_bytes) or known.get(key_bytes)
        decision = decide(
            existing,
            timestamp=delivery.timestamp,
            ttl_ms=rule.ttl_ms,
            sliding=rule.sliding,
            partition=delivery.partition,
            offset=delivery.offset,
            command=target.command,
            topic=target.topic,
            body_hash=fingerprint(item.event, rule.volatile),
        )
        entry, outcome = decision.entry, decision.outcome
        value = ckpt.stage(key_bytes, entry, decision.previous)
        if outcome is Outcome.FIRST and target.topic is not None and target.command is not None:
            self._command(delivery, item, target)
        changelog = ckpt.changelog
        # every state change, so a restored store has the counts too
        ckpt.emit(
            changelog.topic, changelog.partition, key=key_bytes, value=value, timestamp=delivery.timestamp
        )
        extra: dict[str, Any] = {}
        if outcome is Outcome.FIRST and decision.previous is not None:
            extra["previous_expired_at"] = decision.previous.expires_at
        if target.topic is None:
            extra["dropped_by_route"] = True
        if target.effect_key is not None:
            extra["effect_key"] = target.effect_key
        if outcome is Outcome.CONFLICT:
            log.warning(
                "%s key=%s offset=%s conflict: body differs from the first copy's (offset %s); not processed",
                self.tp,
                item.key,
                delivery.offset,
                entry.offset,
            )
        self._audit(
            delivery,
            key=item.key,
            outcome=outcome,
            first_seen_at=entry.first_seen,
            source=source.name,
            event_type=item.event_type,
            expires_at=entry.expires_at,
            extra=extra,
            key_bytes=key_bytes,
        )
        log.debug("%s key=%s offset=%s outcome=%s", self.tp, item.key, delivery.offset, outcome)
        self.recorder.outcome(source.name, outcome.value)

    def _command(self, delivery: Delivery, item: Accepted, target: Target) -> None:
        """Emit the command: to its topic, or to the effect stage when the route names an effect key."""
        command, topic = target.command or DEFAULT_COMMAND, target.topic or self.topology.topics.commands
        effect_key = target.effect_key or item.key
        value = command_value(
            command=command,
            key=item.key,
            effect_key=effect_key,
            source=item.source.name,
            event_type=item.event_type,
            received_at=delivery.received_at,
            body=delivery.value,
        )
        headers: list[tuple[str, bytes | None]] = []
        out_topic = topic
        if target.effect_key is not None:
            out_topic = self.topology.topics.effects
            headers = [
                (EFFECT_TTL_HEADER, str(target.effect_ttl_ms).encode()),
                (COMMAND_TOPIC_HEADER, topic.encode()),
            ]
        key = effect_key.encode()
        if target.effect_key is None:
            self.recorder.command(topic)
        self.checkpoint.emit(
            out_topic,
            self.outputs.partition_for(out_topic, key),
            key=key,
            value=value,
            timestamp=delivery.timestamp,
            headers=headers,
        )

    def _reroute(self, delivery: Delivery, item: Reroute) -> None:
        headers = [(n, v) for n, v in delivery.raw_headers if n.lower() != REROUTED_FROM_HEADER]
        headers.append((REROUTED_FROM_HEADER, f"{delivery.partition}:{delivery.offset}".encode()))
        self.checkpoint.emit(
            self.tp.topic,
            item.partition,
            key=item.key.encode(),
            value=delivery.value,
            timestamp=delivery.timestamp,
            headers=headers,
        )
        self._audit(
            delivery,
            key=item.key,
            outcome=Outcome.REROUTED,
            first_seen_at=None,
            source=item.source,
            extra={"to_partition": item.partition},
        )
        log.info(
            "%s key=%s offset=%s rerouted to partition %s",
            self.tp,
            item.key,
            delivery.offset,
            item.partition,
        )
        self.recorder.outcome(item.source, Outcome.REROUTED.value)

    def _invalid(self, delivery: Delivery, item: Invalid) -> None:
        dlq = self.topology.topics.dlq
        self.checkpoint.emit(
            dlq,
            delivery.partition % self.outputs.partitions[dlq],
            key=delivery.key,
            value=dlq_value(delivery, error=item.error, reason=item.reason),
            timestamp=delivery.timestamp,
        )
        self._audit(
            delivery,
            key=item.key,
            outcome=Outcome.INVALID,
            first_seen_at=None,
            source=item.source,
            reason=item.reason,
        )
        self.recorder.dlq(item.reason)
        log.warning(
            "%s key=%s offset=%s to the DLQ: %s (%s)",
            self.tp,
            item.key,
            delivery.offset,
            item.error,
            item.reason,
        )
        self.recorder.outcome(item.source, Outcome.INVALID.value)

    def _audit(
        self,
        delivery: Delivery,
        *,
        key: str | None,
        outcome: Outcome,
        first_seen_at: int | None,
        source: str | None,
        event_type: str | None = None,
        expires_at: int | None = None,
        reason: str | None = None,
        extra: Mapping[str, Any] | None = None,
        key_bytes: bytes | None = None,
    ) -> None:
        audit = self.topology.topics.audit
        if key_bytes is None and key is not None:
            key_bytes = key.encode()
        partition = (
            self.outputs.partition_for(audit, key_bytes)
            if key_bytes is not None
            else delivery.partition % self.outputs.partitions[audit]
        )
        value = audit_value(
            key=key,
            outcome=outcome.value,
            partition=delivery.partition,
            offset=delivery.offset,
            received_at=delivery.received_at,
            first_seen_at=first_seen_at,
            source=source,
            event_type=event_type,
            expires_at=expires_at,
            reason=reason,
            extra=extra,
        )
        self.checkpoint.emit(audit, partition, key=key_bytes, value=value, timestamp=delivery.timestamp)

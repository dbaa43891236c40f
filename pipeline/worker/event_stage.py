"""The first stage: one input partition's records classified, decided and emitted into its transaction.

A command is built and checked against its topic's limit before its key is
claimed: a key is never claimed without its command. A command bound for the
effect stage is checked against the effects topic's limit and its command
topic's (the smaller wins), so the effect stage never refuses one for its size.

Time: a record is decided at its own timestamp, but never later than the wall
clock plus ``max_skew_ms``: a producer whose clock runs days ahead must not make
its keys live for days more, nor move stream time so far that every other key
expires. Only accepted records (valid, on their own partition) move stream time.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

from pipeline.contract import BAD_TIMESTAMP, DEFAULT_COMMAND, Delivery, command_value, replayed_from
from pipeline.errors import RecordTooLargeError
from pipeline.headers import COMMAND_TOPIC_HEADER, EFFECT_TTL_HEADER
from pipeline.kafka.partitioner import key_hash
from pipeline.log_text import escape
from pipeline.state.decision import Entry, Outcome, decide, fingerprint_like, volatile_pattern
from pipeline.state.partition_transaction import PartitionTransaction
from pipeline.state.transaction import Header
from pipeline.topology import Expiry, Route, Topology
from pipeline.worker.classify import Accepted, Classified, Classifier, Invalid, Reroute
from pipeline.worker.emitter import Emitter, OutputTopics
from pipeline.worker.metrics import NullRecorder, Recorder
from pipeline.worker.poison import RESTAMP
from pipeline.worker.stage import HandlerFailedError, Poison, handle_in_chunks

log = logging.getLogger(__name__)

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
    value = route.effect_value(item.event())
    if value is None:
        return None
    ttl = route.effect_ttl or item.source.ttl
    return Target(topic, command, f"{command}:{value}", int(ttl.total_seconds() * 1000))


@dataclass(frozen=True, slots=True)
class _Rule:
    """What the decision needs from a source, computed once."""

    ttl_ms: int
    sliding: bool
    volatile_names: tuple[str, ...]
    volatile: re.Pattern[bytes] | None


ROUTE_CACHE_SIZE = 4096
SKEW_LOG_EVERY_S = 60.0  # at most one line a minute about records dated too far ahead
_FIRST, _CONFLICT = Outcome.FIRST, Outcome.CONFLICT  # compared for every record


class EventStage:
    """Turns records of one input partition into commands, audit, changelog and DLQ records."""

    def __init__(
        self,
        *,
        tp: TopicPartition,
        topology: Topology,
        classifier: Classifier,
        txn: PartitionTransaction,
        outputs: OutputTopics,
        recorder: Recorder | None = None,
        chunk_records: int = 250,
        max_skew_ms: int = 3_600_000,
        wall: Callable[[], float] | None = None,
    ) -> None:
        self.tp = tp
        self.name = f"{tp.topic}-{tp.partition}"
        self.topology = topology
        self.max_skew_ms = max_skew_ms
        self.wall = wall or _wall
        self._horizon = 0  # the latest timestamp a record of this chunk is decided at
        self._skew_logged_at = -SKEW_LOG_EVERY_S
        self.classifier = classifier
        self.txn = txn
        self.outputs = outputs
        self.chunk_records = chunk_records
        self.recorder: Recorder = recorder or NullRecorder()  # a partition's Tally: flushed at its commit
        self.emit = Emitter(txn, topics=topology.topics, outputs=outputs, recorder=self.recorder)
        self._routes: dict[tuple[str, str | None], tuple[Route | None, Target | None]] = {}
        self._rules = {
            name: _Rule(
                ttl_ms=int(source.ttl.total_seconds() * 1000),
                sliding=source.expiry is Expiry.SLIDING,
                volatile_names=VOLATILE_FIELDS.get(source.provider, ()),
                volatile=volatile_pattern(VOLATILE_FIELDS.get(source.provider, ())),
            )
            for name, source in topology.sources.items()
        }
        self._poison: Mapping[int, Poison] = {}
        self._debug = False

    async def handle(self, records: Sequence[Any], poison: Mapping[int, Poison]) -> None:
        """Process consumer records of this partition into the open transaction."""
        self._poison = poison
        await handle_in_chunks(self.txn, records, self._chunk, chunk_records=self.chunk_records)

    def _chunk(self, records: Sequence[Any]) -> None:
        txn = self.txn
        self._debug = log.isEnabledFor(logging.DEBUG)  # asked once per chunk, not per record
        self._horizon = int(self.wall() * 1000) + self.max_skew_ms
        deliveries = Delivery.from_records(records)
        classified = [self._classify(d) for d in deliveries]
        keys = [c.key_bytes for c in classified if isinstance(c, Accepted)]
        known = txn.lookup(list(dict.fromkeys(keys)))  # StoreError: the partition is reopened
        poison = self._poison
        for delivery, result in zip(deliveries, classified, strict=True):
            marked = poison.get(delivery.offset) if poison else None
            txn.restamp = marked is not None and marked.restamp
            try:
                if isinstance(result, Accepted):
                    self._accepted(delivery, result, known)
                elif isinstance(result, Reroute):
                    self._reroute(delivery, result)
                else:
                    self._invalid(delivery, result)
            except Exception as exc:
                raise HandlerFailedError(delivery.offset, repr(exc)[:500]) from exc
            finally:
                txn.restamp = False
            txn.consumed(delivery.offset)

    def _classify(self, delivery: Delivery) -> Classified:
        """What ``delivery`` is; poison and out-of-range headers go to the DLQ before anything else."""
        poison = self._poison.get(delivery.offset)
        if poison is not None and poison.reason != RESTAMP:
            return Invalid(poison.reason, poison.error, _text_key(delivery), delivery.source)
        problem = delivery.problem
        if problem is not None:
            if problem[0] == BAD_TIMESTAMP:
                delivery.timestamp = self.txn.stream_time  # never let it move stream time (and expire keys)
            return Invalid(problem[0], problem[1], _text_key(delivery), delivery.source)
        try:
            return self.classifier.classify(delivery)
        except Exception as exc:
            raise HandlerFailedError(delivery.offset, repr(exc)[:500]) from exc

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
        """Decide; build the command and check it fits *before* the key is claimed; then stage and emit."""
        txn = self.txn
        source = item.source.name
        route, target = self._route(source, item)
        if target is None:
            target = resolve_target(self.topology, route, item)
            if target is None:
                effect_path = route.effect_key if route else None
                error = f"the event has no value at effect_key {effect_path!r}"
                self._invalid(
                    delivery, Invalid("missing-effect-key", error, item.key, source, item.event_type)
                )
                return
        rule = self._rules[source]
        key_bytes = item.key_bytes
        timestamp = delivery.timestamp
        if timestamp > self._horizon:
            timestamp = self._skewed(delivery, item.key)
        existing = txn.staged(key_bytes) or known.get(key_bytes)
        outcome, entry, previous = decide(
            existing,
            timestamp=timestamp,
            ttl_ms=rule.ttl_ms,
            sliding=rule.sliding,
            partition=delivery.partition,
            offset=delivery.offset,
            stream_time=txn.stream_time,
            command=target.command,
            topic=target.topic,
            body_hash=_fingerprint(existing, delivery.value, item, rule),
        )
        placed = key_hash(key_bytes)  # the audit's partition, and the command's when keyed by the event key
        command = None
        if outcome is _FIRST and target.topic is not None and target.command is not None:
            command = self._command(delivery, item, target)
            refused_by = self._refused_by(command, target.topic)
            if refused_by is not None:
                error = f"its command of {len(command[2])} bytes is larger than {refused_by} takes"
                self._invalid(
                    delivery, Invalid(RecordTooLargeError.reason, error, item.key, source, item.event_type)
                )
                return
        txn.stage(key_bytes, entry, previous)
        txn.observe(timestamp)
        if command is not None:
            out_topic, out_key, value, headers = command
            if target.effect_key is None:
                self.emit.command(
                    out_topic, out_key, value, timestamp=delivery.timestamp, headers=headers, hashed=placed
                )
                self.recorder.command(out_topic)
            else:
                self.emit.command(out_topic, out_key, value, timestamp=delivery.timestamp, headers=headers)
        if outcome is _CONFLICT:
            log.warning(
                "%s key=%s offset=%s conflict: body differs from the first copy's (offset %s); not processed",
                self.name,
                escape(item.key),
                delivery.offset,
                entry.offset,
            )
        self.emit.audit(
            delivery,
            key=item.key,
            outcome=outcome,
            first_seen_at=entry.first_seen,
            source=source,
            event_type=item.event_type,
            expires_at=entry.expires_at,
            extra=_audit_extra(delivery, target, previous if outcome is _FIRST else None),
            key_bytes=key_bytes,
            hashed=placed,
        )
        if self._debug:
            log.debug("%s key=%s offset=%s outcome=%s", self.name, escape(item.key), delivery.offset, outcome)
        self.recorder.outcome(source, outcome)

    def _skewed(self, delivery: Delivery, key: str) -> int:
        """The bounded time of a record dated past the skew bound: counted, and logged once a minute."""
        self.recorder.skewed()
        now = time.monotonic()
        if now - self._skew_logged_at >= SKEW_LOG_EVERY_S:
            self._skew_logged_at = now
            log.warning(
                "%s key=%s offset=%s is dated %ss ahead of this clock; handled at the bound of %ss "
                "(--max-clock-skew; such records are counted in pipeline_clock_skewed_records_total)",
                self.name,
                escape(key),
                delivery.offset,
                (delivery.timestamp - self._horizon + self.max_skew_ms) // 1000,
                self.max_skew_ms // 1000,
            )
        return self._horizon

    def _command(
        self, delivery: Delivery, item: Accepted, target: Target
    ) -> tuple[str, bytes, bytes, list[Header]]:
        """The command (topic, key, value, headers): to its topic, or to the effect stage when the
        route names an effect key."""
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
        headers: list[Header] = []
        out_topic = topic
        if target.effect_key is not None:
            out_topic = self.topology.topics.effects
            headers = [
                (EFFECT_TTL_HEADER, str(target.effect_ttl_ms).encode()),
                (COMMAND_TOPIC_HEADER, topic.encode()),
            ]
        return out_topic, effect_key.encode(), value, headers

    def _refused_by(self, command: tuple[str, bytes, bytes, list[Header]], topic: str) -> str | None:
        """The topic that would refuse ``command`` for its size, or ``None``. A command bound for the
        effect stage must also fit ``topic``, the command topic the effect stage forwards it to as it is
        (without headers): refused there, its event key would be claimed and its effect never produced."""
        out_topic, key, value, _ = command
        if not self.emit.command_fits(*command):
            return out_topic
        if out_topic != topic and not self.emit.command_fits(topic, key, value):
            return topic
        return None

    def _reroute(self, delivery: Delivery, item: Reroute) -> None:
        try:
            self.emit.reroute(delivery, key=item.key, partition=item.partition)
        except RecordTooLargeError as exc:
            self._invalid(delivery, Invalid(exc.reason, f"its rerouted copy: {exc}", item.key, item.source))
            return
        self.emit.audit(
            delivery,
            key=item.key,
            outcome=Outcome.REROUTED.value,
            first_seen_at=None,
            source=item.source,
            extra={"to_partition": item.partition, **replayed_from(delivery)},
        )
        log.info(
            "%s key=%s offset=%s rerouted to partition %s",
            self.name,
            escape(item.key),
            delivery.offset,
            item.partition,
        )
        self.recorder.outcome(item.source, Outcome.REROUTED.value)

    def _invalid(self, delivery: Delivery, item: Invalid) -> None:
        self.emit.dlq(
            delivery,
            reason=item.reason,
            error=item.error,
            key=item.key,
            source=item.source,
            extra=replayed_from(delivery),
            event_type=item.event_type,
        )
        self.recorder.outcome(item.source, Outcome.INVALID.value)


def _audit_extra(delivery: Delivery, target: Target, claimed_over: Entry | None) -> dict[str, Any] | None:
    """The audit fields beyond the common ones (None when there are none, as for most records)."""
    extra: dict[str, Any] | None = replayed_from(delivery) or None
    if claimed_over is None and target.topic is not None and target.effect_key is None:
        return extra
    extra = extra or {}
    if claimed_over is not None:
        extra["previous_expired_at"] = claimed_over.expires_at
    if target.topic is None:
        extra["dropped_by_route"] = True
    if target.effect_key is not None:
        extra["effect_key"] = target.effect_key
    return extra


def _fingerprint(existing: Entry | None, body: bytes, item: Accepted, rule: _Rule) -> str:
    """The copy's body fingerprint, of the kind ``existing`` holds (see ``fingerprint_like``)."""
    held = existing.body_hash if existing is not None else None
    return fingerprint_like(held, body, rule.volatile, rule.volatile_names, item.event)


def _wall() -> float:
    return time.time()


def _text_key(delivery: Delivery) -> str | None:
    """The record key as text, for a record that goes to the DLQ before it is classified."""
    return delivery.key.decode("utf-8", "replace") if delivery.key else None

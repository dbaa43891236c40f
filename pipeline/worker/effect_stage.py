"""The effect stage: commands keyed and partitioned by their effect key, deduped once more.

A route with an ``effect_key`` sends its commands here instead of to the
command topic (see :func:`pipeline.worker.event_stage.resolve_target`). Two different
events that mean the same effect (Stripe's ``checkout.session.completed`` and
``payment_intent.succeeded`` for one payment) meet on one partition of the
effects topic, and only the first within the effect TTL reaches the command
topic. The same machinery as the first stage applies: a RocksDB seen-set per
partition, one transaction per batch with the changelog, audit and offsets, and
time bounded by the wall clock plus ``max_skew_ms``.

A record on a partition its effect key does not hash to (the effects topic was
given more partitions while records waited on it) is moved to the partition that
owns the key, as the first stage moves misplaced input records: otherwise one
effect key would be deduped on two partitions, and emitted twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiokafka import TopicPartition

from pipeline.contract import BAD_TIMESTAMP, Delivery, parse_json_object, replayed_from
from pipeline.errors import RecordTooLargeError
from pipeline.headers import COMMAND_TOPIC_HEADER, EFFECT_TTL_HEADER
from pipeline.log_text import escape
from pipeline.state.decision import Outcome, decide
from pipeline.state.partition_transaction import PartitionTransaction
from pipeline.topology import Topology
from pipeline.worker.emitter import Emitter, OutputTopics
from pipeline.worker.metrics import NullRecorder, Recorder
from pipeline.worker.poison import RESTAMP
from pipeline.worker.stage import HandlerFailedError, Poison, handle_in_chunks

log = logging.getLogger(__name__)

MAX_EFFECT_TTL_MS = 10 * 365 * 86_400_000  # ten years: anything longer is not a TTL


class EffectStage:
    """Dedupes commands of one effects-topic partition by effect key."""

    def __init__(
        self,
        *,
        tp: TopicPartition,
        topology: Topology,
        txn: PartitionTransaction,
        outputs: OutputTopics,
        recorder: Recorder | None = None,
        chunk_records: int = 250,
        max_skew_ms: int = 3_600_000,
        wall: Callable[[], float] | None = None,
    ) -> None:
        self.max_skew_ms = max_skew_ms
        self.wall = wall or _wall
        self._horizon = 0
        self.tp = tp
        self.name = f"{tp.topic}-{tp.partition}"
        self.topology = topology
        self.txn = txn
        self.outputs = outputs
        self.chunk_records = chunk_records
        self.recorder: Recorder = recorder or NullRecorder()  # a partition's Tally: flushed at its commit
        self.emit = Emitter(txn, topics=topology.topics, outputs=outputs, recorder=self.recorder)
        self._command_topics = frozenset(topology.command_topics())
        self._poison: Mapping[int, Poison] = {}

    async def handle(self, records: Sequence[Any], poison: Mapping[int, Poison]) -> None:
        """Process effect records into the open transaction, in chunks, as the first stage does."""
        self._poison = poison
        await handle_in_chunks(self.txn, records, self._chunk, chunk_records=self.chunk_records)

    def _chunk(self, records: Sequence[Any]) -> None:
        txn = self.txn
        self._horizon = int(self.wall() * 1000) + self.max_skew_ms
        deliveries = Delivery.from_records(records)
        keys = [d.key for d in deliveries if d.key]
        known = txn.lookup(list(dict.fromkeys(k for k in keys if k is not None)))
        poison = self._poison
        for delivery in deliveries:
            marked = poison.get(delivery.offset) if poison else None
            txn.restamp = marked is not None and marked.restamp
            try:
                self._one(delivery, known)
            except Exception as exc:
                raise HandlerFailedError(delivery.offset, repr(exc)[:500]) from exc
            finally:
                txn.restamp = False
            txn.consumed(delivery.offset)

    def _problem(self, delivery: Delivery, command: Mapping[str, Any] | None) -> tuple[str, str] | None:
        """Why an effects-topic record cannot be handled, as (reason, error), or ``None``."""
        poison = self._poison.get(delivery.offset)
        if poison is not None and poison.reason != RESTAMP:
            return poison.reason, poison.error
        problem = delivery.problem
        if problem is not None:
            if problem[0] == BAD_TIMESTAMP:
                delivery.timestamp = self.txn.stream_time  # never let it move stream time (and expire keys)
            return problem
        ttl = delivery.headers.get(EFFECT_TTL_HEADER, "")
        topic = delivery.headers.get(COMMAND_TOPIC_HEADER)
        if not delivery.key or command is None or not topic:
            error = "an effects-topic record without key, command JSON or command topic"
            return "bad-effect-record", error
        if not (ttl.isascii() and ttl.isdigit() and len(ttl) <= 15 and 0 < int(ttl) <= MAX_EFFECT_TTL_MS):
            return "bad-effect-record", f"effect TTL {ttl[:40]!r} is not a number of ms in range"
        if topic not in self._command_topics:  # every command topic's layout was read at start
            return "unknown-command-topic", f"command topic {topic[:200]!r} is not one of the topology's"
        return None

    def _one(self, delivery: Delivery, known: dict[bytes, Any]) -> None:
        txn = self.txn
        command = parse_json_object(delivery.value)
        problem = self._problem(delivery, command)
        effect_key = delivery.key.decode("utf-8", "replace") if delivery.key else None
        source = command.get("source") if command else None
        if problem is not None or command is None or delivery.key is None:
            reason, error = problem or ("bad-effect-record", "unreadable effect record")
            self.emit.dlq(
                delivery,
                reason=reason,
                error=error,
                key=effect_key,
                source=source if isinstance(source, str) else None,
                extra={"stage": "effect", **replayed_from(delivery)},
            )
            self.recorder.outcome(None, f"effect-{Outcome.INVALID.value}")
            return
        key = delivery.key
        owner = self.outputs.partition_for(delivery.topic, key)
        if owner != delivery.partition:
            self._reroute(delivery, effect_key or "", owner, source)
            return
        topic = delivery.headers[COMMAND_TOPIC_HEADER]
        timestamp = min(delivery.timestamp, self._horizon)
        if timestamp < delivery.timestamp:
            self.recorder.skewed()
        existing = txn.staged(key) or known.get(key)
        decision = decide(
            existing,
            timestamp=timestamp,
            ttl_ms=int(delivery.headers[EFFECT_TTL_HEADER]),
            sliding=False,
            partition=delivery.partition,
            offset=delivery.offset,
            stream_time=txn.stream_time,
            command=str(command.get("command")),
            topic=topic,
        )
        entry = decision.entry
        first = decision.outcome is Outcome.FIRST
        if first and not self.emit.command_fits(topic, key, delivery.value):
            error = f"a command of {len(delivery.value)} bytes is larger than {topic} takes"
            self._too_large(delivery, error, effect_key, source)
            return
        txn.stage(key, entry, decision.previous)
        txn.observe(timestamp)
        if first:
            self.recorder.command(topic)
            self.emit.command(topic, key, delivery.value, timestamp=delivery.timestamp)
        received_at = command.get("received_at")
        self.emit.audit(
            delivery,
            key=effect_key,
            outcome=decision.outcome.value,
            first_seen_at=entry.first_seen,
            source=str(source) if source is not None else None,
            event_type=_text(command.get("event_type")),
            expires_at=entry.expires_at,
            extra={
                "stage": "effect",
                "event_key": _text(command.get("key")),
                "command": _text(command.get("command")),
                **replayed_from(delivery),
            },
            key_bytes=key,
            received_at=received_at if _sane_int(received_at) else delivery.timestamp,
        )
        log.info(
            "%s effect_key=%s key=%s outcome=%s",
            self.name,
            escape(effect_key),
            escape(command.get("key")),
            decision.outcome.value,
        )
        self.recorder.outcome(str(source) if source is not None else None, f"effect-{decision.outcome.value}")

    def _reroute(self, delivery: Delivery, effect_key: str, partition: int, source: object) -> None:
        """Move a record to the effects partition that owns its key (audited as ``rerouted``)."""
        shown = str(source) if source is not None else None
        try:
            self.emit.reroute(delivery, key=effect_key, partition=partition)
        except RecordTooLargeError as exc:
            self._too_large(delivery, f"its rerouted copy: {exc}", effect_key, source)
            return
        self.emit.audit(
            delivery,
            key=effect_key,
            outcome=Outcome.REROUTED.value,
            first_seen_at=None,
            source=shown,
            extra={"stage": "effect", "to_partition": partition, **replayed_from(delivery)},
        )
        log.info(
            "%s effect_key=%s offset=%s rerouted to partition %s",
            self.name,
            escape(effect_key),
            delivery.offset,
            partition,
        )
        self.recorder.outcome(shown, f"effect-{Outcome.REROUTED.value}")

    def _too_large(self, delivery: Delivery, error: str, effect_key: str | None, source: object) -> None:
        """Dead-letter an effects record whose command (or rerouted copy) is too large: audited and counted as
        every other effect-stage record is."""
        shown = str(source) if source is not None else None
        self.emit.dlq(
            delivery,
            reason=RecordTooLargeError.reason,
            error=error,
            key=effect_key,
            source=shown,
            extra={"stage": "effect", **replayed_from(delivery)},
        )
        self.recorder.outcome(shown, f"effect-{Outcome.INVALID.value}")


def _wall() -> float:
    return time.time()


def _text(value: object) -> str | None:
    """A JSON field read back as text, bounded; ``None`` when absent."""
    return None if value is None else str(value)[:1000]


def _sane_int(value: object) -> bool:
    """Whether ``value`` is a JSON integer a 64-bit field holds (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62

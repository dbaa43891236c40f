"""The redrive history, kept in Kafka: every run, every record it redrove, and what became of each.

The topology names the topic (``topics.redrives``, ``<app>-redrives``): one
partition, compacted. A run is keyed ``run/<id>`` (who, when, from where, what
was chosen, where the audit and the DLQ ended before it, its state); each
DLQ record it redrove is keyed ``run/<id>/<partition>:<offset>`` (planned,
then sent or skipped, then its outcome: ``first``, ``duplicate``, or
``invalid`` with the new DLQ record it became). A later state of either is
written again under the same key, and compaction keeps the latest.

:class:`History` reads the topic from its beginning when the console first
needs it and then only what is new, so a restarted console (or a second one)
shows every run and marks every record as it was left. Values are JSON; a
record that does not parse is skipped, never fatal.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from pipeline.errors import PipelineError
from pipeline.kafka.admin import ensure_topics, partition_count, redrive_history_spec
from pipeline.kafka.clients import started_producer, started_reader
from pipeline.kafka.internals import stop_consumer
from pipeline.topology import Topology

log = logging.getLogger(__name__)

#: Final outcomes: the worker took the record (``first``), had already processed its event
#: (``duplicate``, ``conflict``: a body other than the first copy's), or refused it again (``invalid``).
RESOLVED = frozenset({"first", "duplicate"})
FAILED = frozenset({"invalid", "conflict"})


class HistoryUnavailableError(PipelineError):
    """The redrive history topic cannot be read or written (so no redrive may run)."""

    reason = "history-unavailable"
    retriable = True


@dataclass
class RunRecord:
    """One DLQ record of a run: where it was, why, and what became of it."""

    run: str
    partition: int
    offset: int
    reason: str
    key: str | None
    state: str = "planned"  # planned, sent, skipped
    to_partition: int | None = None  # the partition it was produced to
    # the topic it was produced to: the input, or the effects topic (None: the input, an older console's run)
    to_topic: str | None = None
    skip: str = ""  # why it was not produced
    outcome: str | None = None  # the worker's outcome: first, duplicate, conflict, invalid
    outcome_reason: str | None = None  # the reason of an invalid outcome
    new_record: tuple[int, int] | None = None  # the DLQ record it became, when invalid again

    @property
    def at(self) -> tuple[int, int]:
        """``(partition, offset)`` in the DLQ."""
        return self.partition, self.offset

    @property
    def mark(self) -> str:
        """How the DLQ list marks the record: redriven (no outcome yet), resolved, failed again, or not redriven."""
        if self.state == "skipped":
            return "not replayable"
        if self.outcome in RESOLVED:
            return "resolved"
        if self.outcome in FAILED or self.new_record is not None:
            return "failed again"
        return "redriven"

    @property
    def outcome_text(self) -> str:
        """The outcome in words, as the run page shows it."""
        if self.state == "skipped":
            return f"skipped: {self.skip}"
        if self.outcome is None:
            return "sent, waiting for the worker" if self.state == "sent" else "not sent"
        return f"{self.outcome} ({self.outcome_reason})" if self.outcome_reason else self.outcome


@dataclass
class Run:
    """One redrive: who ran it, when, what it chose, how far it got, and its records."""

    id: str
    user: str
    role: str
    remote: str
    at_ms: int
    dlq: str
    input: str
    chosen: str  # the selection in words: "3 selected", "all 601 matching reason=bad-signature"
    count: int
    reasons: dict[str, int] = field(default_factory=dict)
    state: str = "running"  # running, sent, failed
    error: str = ""
    audit_starts: dict[int, int] = field(default_factory=dict)
    dlq_starts: dict[int, int] = field(default_factory=dict)
    records: dict[tuple[int, int], RunRecord] = field(default_factory=dict, repr=False)

    @property
    def sent(self) -> list[RunRecord]:
        """The records produced again."""
        return [r for r in self.records.values() if r.state == "sent"]

    @property
    def done(self) -> bool:
        """Whether the run ended and every record it sent has an outcome."""
        return self.state != "running" and all(r.outcome is not None for r in self.sent)

    @property
    def counts(self) -> dict[str, int]:
        """How many of its records are resolved, failed again, waiting, skipped."""
        out: dict[str, int] = {}
        for record in self.records.values():
            out[record.mark] = out.get(record.mark, 0) + 1
        return out

    def ordered(self) -> list[RunRecord]:
        """Its records in DLQ order."""
        return [self.records[at] for at in sorted(self.records)]


def new_run_id(now_ms: int) -> str:
    """A run id that sorts by time and is unique across consoles: ``20261130-101500-a1b2``."""
    stamp = datetime.fromtimestamp(now_ms / 1000, UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(2)}"


def _run_value(run: Run) -> bytes:
    data = {k: v for k, v in asdict(run).items() if k != "records"}
    data["audit_starts"] = {str(p): o for p, o in run.audit_starts.items()}
    data["dlq_starts"] = {str(p): o for p, o in run.dlq_starts.items()}
    return orjson.dumps({"kind": "run", **data})


def _record_value(record: RunRecord) -> bytes:
    return orjson.dumps({"kind": "record", **asdict(record)})


def _run_of(data: dict[str, Any]) -> Run:
    fields = {k: v for k, v in data.items() if k != "kind"}
    fields["audit_starts"] = {int(p): int(o) for p, o in dict(fields.get("audit_starts") or {}).items()}
    fields["dlq_starts"] = {int(p): int(o) for p, o in dict(fields.get("dlq_starts") or {}).items()}
    return Run(**fields)


def _record_of(data: dict[str, Any]) -> RunRecord:
    fields = {k: v for k, v in data.items() if k != "kind"}
    new = fields.get("new_record")
    fields["new_record"] = (int(new[0]), int(new[1])) if isinstance(new, list) and len(new) == 2 else None
    return RunRecord(**fields)


class History:
    """The runs in the history topic, as read so far, and the way to add to them."""

    def __init__(self, bootstrap: str, topology: Topology) -> None:
        self.bootstrap = bootstrap
        self.topology = topology
        self.topic = topology.topics.redrives
        self.runs: dict[str, Run] = {}
        self._orphans: dict[str, list[RunRecord]] = {}  # records read before their run (never, in order)
        self._marks: dict[tuple[int, int], RunRecord] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()
        self._ready = False

    # -- reading ------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Read what the topic gained since the last call (all of it the first time)."""
        async with self._lock:
            try:
                await self._refresh()
            except KafkaError as exc:
                await self._drop_consumer()
                raise HistoryUnavailableError(f"the redrive history {self.topic}: Kafka: {exc!r}") from None

    async def _refresh(self) -> None:
        await self._ensure_topic()
        if self._consumer is None:
            self._consumer = await started_reader(self.bootstrap)
            self._consumer.assign([TopicPartition(self.topic, 0)])
            await self._consumer.seek_to_beginning(TopicPartition(self.topic, 0))
        consumer, tp = self._consumer, TopicPartition(self.topic, 0)
        end = (await consumer.end_offsets([tp]))[tp]
        idle = 0
        while await consumer.position(tp) < end and idle < 20:
            batch = await consumer.getmany(tp, timeout_ms=250)
            got = batch.get(tp, [])
            idle = 0 if got else idle + 1
            for record in got:
                self._apply(record.value)

    async def _ensure_topic(self) -> None:
        if self._ready:
            return
        if await partition_count(self.bootstrap, self.topic) is None:
            try:
                await ensure_topics(self.bootstrap, [redrive_history_spec(self.topology)])
            except PipelineError as exc:
                raise HistoryUnavailableError(
                    f"the redrive history topic {self.topic} does not exist and cannot be created ({exc}):"
                    " run 'pipeline topics create'"
                ) from None
            log.info("console: created the redrive history topic %s", self.topic)
        self._ready = True

    def _apply(self, value: bytes | None) -> None:
        try:
            data = orjson.loads(value) if value is not None else None
            if not isinstance(data, dict):
                return
            if data.get("kind") == "run":
                self._put_run(_run_of(data))
            elif data.get("kind") == "record":
                self._put_record(_record_of(data))
        except (orjson.JSONDecodeError, TypeError, ValueError):
            log.warning("console: a record of %s is not a redrive history record; skipped", self.topic)

    def _put_run(self, run: Run) -> None:
        known = self.runs.get(run.id)
        run.records = known.records if known is not None else {}
        self.runs[run.id] = run
        for record in self._orphans.pop(run.id, []):
            self._put_record(record)

    def _put_record(self, record: RunRecord) -> None:
        run = self.runs.get(record.run)
        if run is None:
            self._orphans.setdefault(record.run, []).append(record)
            return
        run.records[record.at] = record
        latest = self._marks.get(record.at)
        if latest is None or latest.run <= record.run:
            self._marks[record.at] = record

    def mark(self, at: tuple[int, int]) -> RunRecord | None:
        """The latest run's record of the DLQ record ``at`` (None: never redriven from the console)."""
        return self._marks.get(at)

    def newest_first(self) -> list[Run]:
        """Every run, the newest first."""
        return sorted(self.runs.values(), key=lambda r: (r.at_ms, r.id), reverse=True)

    # -- writing ------------------------------------------------------------------------------

    async def write(self, run: Run | None, records: list[RunRecord] | None = None) -> None:
        """Write ``run`` (None: only records, as the follower does, never rewriting the run's state)
        and ``records``, acknowledged by every in-sync replica, and take them in."""
        try:
            await self._ensure_topic()
            if self._producer is None:
                self._producer = await started_producer(self.bootstrap)
            futures = []
            if run is not None:
                key = f"run/{run.id}".encode()
                futures.append(await self._producer.send(self.topic, _run_value(run), key=key, partition=0))
            for record in records or []:
                key = f"run/{record.run}/{record.partition}:{record.offset}".encode()
                futures.append(
                    await self._producer.send(self.topic, _record_value(record), key=key, partition=0)
                )
            for future in futures:
                await future
        except KafkaError as exc:
            raise HistoryUnavailableError(f"the redrive history {self.topic}: Kafka: {exc!r}") from None
        if run is not None:
            self._put_run(run)
        for record in records or []:
            self._put_record(record)

    async def close(self) -> None:
        """Stop its Kafka clients."""
        await self._drop_consumer()
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.stop()

    async def _drop_consumer(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await stop_consumer(consumer)

"""Redrives from the console: exactly the records a page chose, recorded in Kafka, then followed.

A run is written to the redrive history (:mod:`pipeline.console.history`)
before anything is produced: who, when, what was chosen, where the audit and
the DLQ ended, and each record as planned. Then each record is read back from
the DLQ, rebuilt byte for byte with a ``replayed-from`` header
(:func:`pipeline.records.dlq.rebuild`, as ``pipeline dlq replay`` does) and
produced to the topic it came from (the input, or the effects topic for a
record the effect stage dead-lettered) on its key's partition; the run and its records
are written again as sent or skipped. A history that cannot be written stops
the run before any record is produced.

:class:`Follower` then reads the audit from where it ended for each replayed
record's delivery (``replayed_from``): ``first``, ``duplicate``, or
``invalid`` again, and for those the new DLQ record (the one whose
``replayed-from`` header names the old), and writes each outcome to the
history. It follows every unfinished run, also those of an earlier console.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import orjson
from aiokafka.errors import KafkaError

from pipeline.cancelling import cancel_and_wait
from pipeline.console.dlq_read import read_range, read_records, reading
from pipeline.console.dlq_view import Row
from pipeline.console.history import History, HistoryUnavailableError, Run, RunRecord, new_run_id
from pipeline.console.settings import User
from pipeline.errors import PipelineError
from pipeline.headers import REPLAYED_FROM_HEADER
from pipeline.kafka.admin import partition_count
from pipeline.kafka.clients import started_producer
from pipeline.kafka.partitioner import owner_partition
from pipeline.log_text import escape
from pipeline.records.dlq import KEY_SHOWN, NotReplayableError, rebuild
from pipeline.topology import Topology

log = logging.getLogger(__name__)
FOLLOW_FOR_MS = 3_600_000  # a run's outcomes are looked for this long after it ran
FOLLOW_EVERY_S = 2.0
MAX_BACKOFF_S = 60.0  # between rounds while Kafka or the history topic is out of reach


async def _ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's end (read_committed) now."""
    count = await partition_count(bootstrap, topic) or 0
    async with reading(bootstrap, topic, range(count)) as (_, _, ends):
        return {tp.partition: offset for tp, offset in ends.items()}


class Redrives:
    """Runs redrives and follows their outcomes, through the history."""

    def __init__(self, bootstrap: str, topology: Topology, history: History) -> None:
        self.bootstrap = bootstrap
        self.topology = topology
        self.history = history
        self._read: dict[str, dict[int, int]] = {}  # run id -> audit partition -> offset read up to

    async def run(self, chosen: Sequence[Row], user: User, remote: str, description: str) -> Run:
        """Redrive ``chosen`` as ``user`` from ``remote``; the run as the history now has it."""
        topics = self.topology.topics
        now = int(time.time() * 1000)
        run = Run(
            id=new_run_id(now),
            user=user.name,
            role=str(user.role),
            remote=remote,
            at_ms=now,
            dlq=topics.dlq,
            input=topics.input,
            chosen=description,
            count=len(chosen),
            reasons=dict(Counter(row.reason for row in chosen)),
        )
        who = f"{escape(user.name)} ({user.role}) from {escape(remote)}"
        log.info(
            "redrive %s by %s: %d DLQ records of %s (%s)",
            run.id,
            who,
            run.count,
            topics.dlq,
            escape(description),
        )
        run.audit_starts = await _ends(self.bootstrap, topics.audit)
        run.dlq_starts = await _ends(self.bootstrap, topics.dlq)
        records = {
            row.at: RunRecord(run.id, row.partition, row.offset, row.reason, row.key) for row in chosen
        }
        await self.history.write(run, list(records.values()))  # before anything is produced
        try:
            await self._produce(records)
            run.state = "sent"
        except (KafkaError, PipelineError) as exc:
            run.state, run.error = "failed", f"stopped: {exc!r}"[:500]
            log.warning("redrive %s by %s failed: %s", run.id, who, escape(run.error, 500))
        for record in records.values():
            if record.state == "planned" and run.state == "sent":
                record.state, record.skip = "skipped", "no longer in the DLQ (retention removed it)"
        await self.history.write(run, list(records.values()))
        sent = [r for r in records.values() if r.state == "sent"]
        log.info(
            "redrive %s by %s: replayed %d (%s), skipped %d",
            run.id,
            who,
            len(sent),
            ", ".join(
                f"{topics.dlq}:{r.partition}:{r.offset} {escape(r.key or '-', KEY_SHOWN)}" for r in sent[:20]
            ),
            sum(1 for r in records.values() if r.state == "skipped"),
        )
        return self.history.runs[run.id]

    async def _produce(self, records: dict[tuple[int, int], RunRecord]) -> None:
        """Rebuild and produce each record (idempotent producer, ``acks=all``) to the topic it came from: the
        input, or the effects topic for a record the effect stage dead-lettered (as ``pipeline dlq replay``);
        mark each sent or skipped."""
        topics = self.topology.topics
        counts = {topics.input: await partition_count(self.bootstrap, topics.input)}
        if counts[topics.input] is None:
            raise PipelineError(f"topic {topics.input} does not exist")
        producer = await started_producer(self.bootstrap)
        pending: list[tuple[RunRecord, asyncio.Future[Any]]] = []
        try:
            async for entry in read_records(self.bootstrap, topics.dlq, records):
                record = records[(entry.partition, entry.offset)]
                try:
                    original = rebuild(
                        entry, dlq_topic=topics.dlq, input_topic=topics.input, effects_topic=topics.effects
                    )
                except NotReplayableError as exc:
                    record.state, record.skip = "skipped", str(exc)
                    continue
                target = original.topic
                if target not in counts:
                    counts[target] = await partition_count(self.bootstrap, target)
                partitions = counts[target]
                if partitions is None:
                    record.state, record.skip = "skipped", f"its topic {target} does not exist"
                    continue
                key = original.key
                partition = owner_partition(key, partitions) if key else original.partition % partitions
                future = await producer.send(
                    target,
                    original.value,
                    key=key,
                    partition=partition,
                    headers=original.headers,
                    timestamp_ms=original.timestamp,
                )
                record.to_topic, record.to_partition = target, partition
                pending.append((record, future))
            for record, future in pending:
                await future
                record.state = "sent"
        finally:
            await producer.stop()

    async def follow(self, run: Run) -> bool:
        """Look in the audit (and the DLQ) for the outcomes ``run`` still lacks; write the new ones.
        Whether any was found."""
        waiting = {f"{run.dlq}:{r.partition}:{r.offset}": r for r in run.sent if r.outcome is None}
        if not waiting:
            return False
        found: dict[str, tuple[RunRecord, dict[str, Any]]] = {}
        audit = self.topology.topics.audit
        count = len(run.audit_starts)
        keys = [r.key for r in waiting.values()]
        partitions = (
            {owner_partition(k.encode(), count) for k in keys if k is not None}
            if count and all(k is not None for k in keys)
            else set(run.audit_starts)
        )
        read = self._read.setdefault(run.id, {})
        starts = {p: max(run.audit_starts[p], read.get(p, 0)) for p in partitions if p in run.audit_starts}
        async for value in _values(self.bootstrap, audit, starts, reached=read):
            where = value.get("replayed_from")
            record = waiting.get(where) if isinstance(where, str) else None
            if record is None or value.get("outcome") == "rerouted":  # a rerouted copy's outcome comes later
                continue
            # a record sent to the input is judged by the event stage (the effect stage's audit of the same
            # replay comes after); one sent back to the effects topic by the effect stage
            if (value.get("stage") == "effect") == self._to_effects(record):
                found[where] = (record, value)
        if not found:
            return False
        await self._find_copies(run, [(r, v) for r, v in found.values() if v.get("outcome") == "invalid"])
        for record, value in found.values():
            record.outcome = str(value.get("outcome"))
            reason = value.get("reason")
            record.outcome_reason = reason if isinstance(reason, str) else None
        await self.history.write(None, [record for record, _ in found.values()])
        return True

    def _to_effects(self, record: RunRecord) -> bool:
        """Whether ``record`` was sent back to the effects topic (a run of an older console never was)."""
        return record.to_topic is not None and record.to_topic != self.topology.topics.input

    async def _find_copies(self, run: Run, failed: list[tuple[RunRecord, dict[str, Any]]]) -> None:
        """The new DLQ record of each record that failed again: on the DLQ partition of its input
        partition, after where the DLQ ended before the run, its ``replayed-from`` naming the old one."""
        if not failed:
            return
        count = len(run.dlq_starts)
        wanted = {f"{run.dlq}:{r.partition}:{r.offset}": r for r, _ in failed}
        partitions = {int(v.get("partition") or 0) % count for _, v in failed} if count else set()
        starts = {p: run.dlq_starts[p] for p in partitions if p in run.dlq_starts}
        async for value, partition, offset in _values(self.bootstrap, run.dlq, starts, where=True):
            headers = value.get("headers")
            named = headers.get(REPLAYED_FROM_HEADER) if isinstance(headers, dict) else None
            if isinstance(named, str) and named in wanted:
                wanted[named].new_record = (partition, offset)


async def _values(
    bootstrap: str,
    topic: str,
    starts: dict[int, int],
    *,
    where: bool = False,
    reached: dict[int, int] | None = None,
) -> Any:
    """The JSON object values of ``topic``'s partitions from ``starts`` to their end now (with
    partition and offset when ``where``); ``reached`` gets each partition's end once it is read."""
    if not starts:
        return
    async with reading(bootstrap, topic, starts) as (consumer, tps, ends):
        for tp in tps:
            if reached is not None:
                reached[tp.partition] = max(reached.get(tp.partition, 0), starts[tp.partition])
            async for record in read_range(consumer, tp, starts[tp.partition], ends[tp]):
                try:
                    value = orjson.loads(record.value) if record.value is not None else None
                except orjson.JSONDecodeError:
                    continue
                if isinstance(value, dict):
                    yield (value, tp.partition, record.offset) if where else value
            if reached is not None and await consumer.position(tp) >= ends[tp]:
                reached[tp.partition] = ends[tp]


class Follower:
    """In the background: reads the history, and follows every run that still waits for outcomes."""

    def __init__(self, redrives: Redrives, *, every: float = FOLLOW_EVERY_S) -> None:
        self.redrives = redrives
        self.every = every
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin following."""
        self._task = asyncio.create_task(self._loop(), name="console-redrive-follower")

    async def stop(self) -> None:
        """Stop following."""
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def once(self) -> None:
        """One round: refresh the history, follow each unfinished run of the last hour."""
        history = self.redrives.history
        await history.refresh()
        recent = int(time.time() * 1000) - FOLLOW_FOR_MS
        for run in history.newest_first():
            if run.at_ms < recent:
                break
            if not run.done:
                await self.redrives.follow(run)

    async def _loop(self) -> None:
        wait = self.every
        while True:
            try:
                await self.once()
                wait = self.every
            except (HistoryUnavailableError, PipelineError, KafkaError) as exc:
                wait = min(wait * 2, MAX_BACKOFF_S)
                log.warning("console: following redrives: %s; again in %.0fs", escape(exc, 500), wait)
            except Exception:  # a follower that dies would leave every run waiting: log it and go on
                log.exception("console: following redrives failed")
                wait = min(wait * 2, MAX_BACKOFF_S)
            await asyncio.sleep(wait)

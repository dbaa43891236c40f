"""The Kafka reads behind a key lookup: its audit records, its DLQ records and its command.

Each read takes one partition, the one the record contract puts the key on
(``docs/design.md``, section 3), and reads it ``read_committed`` up to the end
it had when the read started: audit records and commands go to murmur2(key) of
their topic, DLQ records to the input partition modulo the DLQ's count.
``pipeline/records/lookup.py`` turns what these return into a report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import TopicPartition

from pipeline.kafka.clients import started_reader
from pipeline.kafka.internals import stop_consumer


@dataclass(frozen=True, slots=True)
class Found:
    """One record of the key: where it sits, its time, and its value parsed as a JSON object."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    value: dict[str, Any]


async def read_key(
    bootstrap: str,
    topic: str,
    partition: int,
    key: bytes,
    *,
    since_ms: int | None = None,
    first_only: bool = False,
    idle: float = 6.0,
) -> list[Found]:
    """The records of ``topic``/``partition`` whose Kafka key is ``key``, in log order.

    ``since_ms`` starts at the first record at or after that time (the whole partition when
    None); ``first_only`` stops at the first match. A value that is not a JSON object reads
    as an empty one.
    """
    tp = TopicPartition(topic, partition)
    consumer = await started_reader(bootstrap)
    found: list[Found] = []
    try:
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        await consumer.seek_to_beginning(tp)
        if since_ms is not None:
            at = (await consumer.offsets_for_times({tp: since_ms})).get(tp)
            if at is None:
                return []
            consumer.seek(tp, at.offset)
        last = time.monotonic()
        while await consumer.position(tp) < end and time.monotonic() - last < idle:
            batch = await consumer.getmany(tp, timeout_ms=200)
            for record in batch.get(tp, []):
                last = time.monotonic()
                if record.offset >= end:
                    return found
                if record.key == key:
                    found.append(
                        Found(topic, partition, record.offset, record.timestamp, _object(record.value))
                    )
                    if first_only:
                        return found
    finally:
        await stop_consumer(consumer)
    return found


def _object(value: bytes | None) -> dict[str, Any]:
    try:
        parsed = orjson.loads(value) if value is not None else None
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


@dataclass(frozen=True, slots=True)
class Stored:
    """One record read back whole: its value and headers as Kafka holds them."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


async def read_at(
    bootstrap: str, topic: str, partition: int, offset: int, *, timeout: float = 5.0
) -> Stored | None:
    """The committed record at ``topic``/``partition``/``offset``; None when there is none (retention
    removed it, an aborted record, a transaction marker, or not read within ``timeout``)."""
    tp = TopicPartition(topic, partition)
    consumer = await started_reader(bootstrap)
    try:
        consumer.assign([tp])
        first = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        if not first <= offset < end:
            return None
        consumer.seek(tp, offset)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and await consumer.position(tp) <= offset:
            batch = await consumer.getmany(tp, timeout_ms=250, max_records=1)
            for record in batch.get(tp, []):
                if record.offset != offset:
                    return None
                headers = tuple((name, value or b"") for name, value in record.headers)
                return Stored(topic, partition, offset, record.timestamp, record.key, record.value, headers)
    finally:
        await stop_consumer(consumer)
    return None

"""Operator tools: ``pipeline tail`` (committed records as JSON lines) and ``pipeline produce`` (backfills)."""

from __future__ import annotations

import base64
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import orjson
from aiokafka import TopicPartition

from pipeline import providers
from pipeline.contract import http_headers_to_kafka
from pipeline.errors import InvalidRecordError, PipelineError
from pipeline.kafka.admin import partition_count, require_topic
from pipeline.kafka.clients import started_producer, started_reader
from pipeline.kafka.internals import stop_consumer
from pipeline.kafka.partitioner import owner_partition
from pipeline.topology import Topology


def record_json(record: Any) -> bytes:
    """One consumer record as a JSON line: value parsed when it is JSON, else text or base64."""
    value: Any
    try:
        value = orjson.loads(record.value) if record.value is not None else None
    except orjson.JSONDecodeError:
        try:
            value = record.value.decode("utf-8")
        except UnicodeDecodeError:
            value = {"base64": base64.b64encode(record.value).decode()}
    return orjson.dumps(
        {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": record.timestamp,
            "key": record.key.decode("utf-8", "replace") if record.key is not None else None,
            "headers": {
                name: raw.decode("utf-8", "replace") if raw is not None else None
                for name, raw in record.headers or ()
            },
            "value": value,
        }
    )


async def tail(
    bootstrap: str, topic: str, *, from_beginning: bool, follow: bool, out: IO[bytes], idle: float = 2.0
) -> int:
    """Print the committed records of ``topic``; stop when idle unless ``follow``. Returns the count."""
    count = await partition_count(bootstrap, topic)
    if count is None:
        raise PipelineError(f"topic {topic} does not exist")
    consumer = await started_reader(bootstrap, from_beginning=from_beginning)
    try:
        tps = [TopicPartition(topic, p) for p in range(count)]
        consumer.assign(tps)
        if from_beginning:
            await consumer.seek_to_beginning(*tps)
        else:
            await consumer.seek_to_end(*tps)
        count = 0
        last = time.monotonic()
        while follow or time.monotonic() - last < idle:
            batch = await consumer.getmany(timeout_ms=300)
            for records in batch.values():
                for record in records:
                    out.write(record_json(record) + b"\n")
                    count += 1
                last = time.monotonic()
            out.flush()
        return count
    finally:
        await stop_consumer(consumer)  # aiokafka lets a CancelledError out when the broker is away


def read_webhooks(path: Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """The JSON lines of ``path`` (``{source, headers, body}``) with their line numbers."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    item = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise PipelineError(f"{path}:{number}: not JSON: {exc}") from None
                if not isinstance(item, dict) or "source" not in item or "body" not in item:
                    raise PipelineError(
                        f"{path}:{number}: expected an object with 'source', 'headers' and 'body'"
                    )
                yield number, item


def _body_bytes(body: Any) -> bytes:
    if isinstance(body, str):
        return body.encode()
    return orjson.dumps(body)


async def produce_file(
    bootstrap: str,
    topology: Topology,
    path: Path,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[int, list[str]]:
    """Produce every webhook of ``path`` to the input topic, keyed and partitioned as the ingress does.

    The body is taken as given (a string is sent byte for byte, an object as
    compact JSON); signatures are not checked (a backfill replays what was
    already accepted). Returns the number produced and one problem line per
    line skipped (unknown source, no key).
    """
    items = list(read_webhooks(path))
    # before the producer, which would wait its whole request timeout for a missing topic
    partitions = await require_topic(bootstrap, topology.topics.input)
    producer = await started_producer(bootstrap)
    problems: list[str] = []
    futures = []
    try:
        for done, (number, item) in enumerate(items, 1):
            source = topology.sources.get(str(item["source"]))
            if source is None:
                problems.append(f"{path}:{number}: unknown source {item['source']!r}")
                continue
            headers = {str(k): str(v) for k, v in (item.get("headers") or {}).items()}
            body = _body_bytes(item["body"])
            preset = providers.get(source.provider, **source.options)
            try:
                key = f"{source.name}:{preset.idempotency_key(headers, body)}"
            except InvalidRecordError as exc:
                problems.append(f"{path}:{number}: {exc}")
                continue
            received_at = int(item.get("received_at") or time.time() * 1000)
            futures.append(
                await producer.send(
                    topology.topics.input,
                    body,
                    key=key.encode(),
                    partition=owner_partition(key.encode(), partitions),
                    headers=http_headers_to_kafka(headers, source=source.name, received_at=received_at),
                    timestamp_ms=received_at,
                )
            )
            if progress is not None:
                progress(done, len(items))
        for future in futures:
            await future
    finally:
        await producer.stop()
    return len(futures), problems


def print_progress(done: int, total: int, *, stream: IO[str] = sys.stderr) -> None:
    """A one-line progress display on a terminal, every 1% otherwise."""
    step = max(total // 100, 1)
    if done == total or done % step == 0:
        end = "\n" if done == total else ("\r" if stream.isatty() else "\n")
        stream.write(f"produced {done}/{total} ({done * 100 // max(total, 1)}%){end}")
        stream.flush()

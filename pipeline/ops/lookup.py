"""``pipeline inspect KEY``: what the pipeline knows about an event key or an effect key.

It asks the worker that owns the key's partition (each worker's HTTP
endpoint lists its partitions and answers ``/keys/{key}`` from its seen-set),
and falls back to reading the key's audit partition when no worker answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from aiokafka import TopicPartition
from yarl import URL

from pipeline.kafka.admin import partition_count
from pipeline.kafka.clients import started_reader
from pipeline.kafka.partitioner import owner_partition
from pipeline.topology import Topology
from pipeline.worker.event_stage import DEFAULT_COMMAND


@dataclass
class Report:
    """The answer about one key."""

    key: str
    known: bool = False
    where: str = ""  # who answered: a worker URL or the audit topic
    topic: str | None = None
    partition: int | None = None
    first_seen: int | None = None
    offset: int | None = None
    duplicates: int = 0
    conflicts: int = 0
    last_seen: int | None = None
    command: str | None = None
    command_topic: str | None = None
    expires_at: int | None = None
    dropped: bool = False  # a route dropped the event: no command
    effect_key: str | None = None  # the command went through the effect stage under this key
    deliveries: list[dict[str, Any]] = field(default_factory=list)

    def lines(self) -> list[str]:
        """Human-readable lines."""
        if not self.known:
            return [f"key           {self.key}", f"known         no ({self.where})"]
        out = [
            f"key           {self.key}",
            f"known         yes, {self.topic} partition {self.partition} (from {self.where})",
            f"first seen    {_time(self.first_seen)} at offset {self.offset}",
            f"duplicates    {self.duplicates}"
            + (f", last at {_time(self.last_seen)}" if self.duplicates and self.last_seen else ""),
        ]
        if self.conflicts:
            out.append(f"conflicts     {self.conflicts} (copies whose body differed from the first)")
        out.append(f"command       {self._command()}")
        out.append(f"expires       {_time(self.expires_at)}")
        return out

    def _command(self) -> str:
        if self.dropped:
            return "none (dropped by a route)"
        if not self.command:
            return "unknown"
        text = f"{self.command} -> {self.command_topic}" if self.command_topic else self.command
        return text + (f" (through the effect stage as {self.effect_key})" if self.effect_key else "")


def _time(ms: int | None) -> str:
    """Milliseconds since the epoch as ISO 8601 UTC; ``-`` when unknown."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _last_seen(first_seen: int | None, last_seen: int | None) -> int | None:
    """The last copy's time, never before the first copy's (unknown when not recorded)."""
    if not last_seen:
        return None
    return max(last_seen, first_seen) if first_seen is not None else last_seen


def key_url(worker: str, key: str) -> URL:
    """The worker's ``/keys/{key}`` URL with the key quoted whole (``/``, ``?``, ``#`` and ``%`` included)."""
    return URL(f"{_base(worker)}/keys/{quote(key, safe='')}", encoded=True)


async def inspect(
    key: str, topology: Topology, *, bootstrap: str, workers: Sequence[str], timeout: float = 3.0
) -> Report:
    """Ask the owning worker; fall back to the audit topic."""
    stages = [topology.topics.input] + ([topology.topics.effects] if topology.has_effects else [])
    counts = {topic: await partition_count(bootstrap, topic) for topic in stages}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        owned = await asyncio.gather(*(_partitions(session, url) for url in workers))
        for topic in stages:
            count = counts[topic]
            if not count:
                continue
            partition = owner_partition(key.encode(), count)
            for url, partitions in zip(workers, owned, strict=True):
                if partition in partitions.get(topic, []):
                    answer = await _get_json(session, key_url(url, key))
                    if answer and answer.get("known"):
                        return _from_worker(key, url, answer)
    return await from_audit(key, topology, bootstrap=bootstrap)


def _base(url: str) -> str:
    return url if url.startswith("http") else f"http://{url}"


async def _get_json(session: aiohttp.ClientSession, url: str | URL) -> dict[str, Any] | None:
    try:
        async with session.get(url) as response:
            if response.status != 200:
                return None
            data = await response.json()
            return data if isinstance(data, dict) else None
    except (aiohttp.ClientError, TimeoutError):
        return None


async def _partitions(session: aiohttp.ClientSession, url: str) -> dict[str, list[int]]:
    answer = await _get_json(session, f"{_base(url)}/partitions")
    return dict(answer.get("partitions", {})) if answer else {}


def _from_worker(key: str, url: str, answer: dict[str, Any]) -> Report:
    entry = answer["entry"]
    return Report(
        key=key,
        known=True,
        where=f"worker {url}",
        topic=answer["topic"],
        partition=answer["partition"],
        first_seen=entry["first_seen"],
        offset=entry["offset"],
        duplicates=entry["duplicates"],
        conflicts=entry.get("conflicts", 0),
        last_seen=_last_seen(entry["first_seen"], entry.get("last_seen")),
        command=entry.get("command"),
        command_topic=entry.get("topic"),
        expires_at=entry["expires_at"],
        dropped=entry.get("command") is None and entry.get("topic") is None,
    )


async def from_audit(key: str, topology: Topology, *, bootstrap: str, idle: float = 1.0) -> Report:
    """Rebuild what is known about ``key`` from its audit partition (every delivery is there)."""
    audit = topology.topics.audit
    count = await partition_count(bootstrap, audit)
    report = Report(key=key, where=f"audit topic {audit}")
    if not count:
        return report
    times: list[int] = []
    tp = TopicPartition(audit, owner_partition(key.encode(), count))
    consumer = await started_reader(bootstrap)
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        last_data = time.monotonic()
        while await consumer.position(tp) < end and time.monotonic() - last_data < idle + 5:
            batch = await consumer.getmany(tp, timeout_ms=200)
            for record in batch.get(tp, []):
                last_data = time.monotonic()
                if record.key == key.encode():
                    report.deliveries.append(orjson.loads(record.value))
                    times.append(record.timestamp)
    finally:
        await consumer.stop()
    summarise(report, times, topology)
    return report


def summarise(report: Report, times: Sequence[int], topology: Topology) -> None:
    """Fill ``report`` from its audit deliveries (in audit order) and their record timestamps.

    The key's current claim starts at its last ``first`` delivery; duplicates of an
    earlier, expired claim are not counted. Times are record timestamps, as the
    worker's seen-set keeps them.
    """
    starts = [i for i, d in enumerate(report.deliveries) if d.get("outcome") == "first"]
    if not starts:
        return
    start = starts[-1]
    first = report.deliveries[start]
    later = [
        (d, t)
        for d, t in zip(report.deliveries[start + 1 :], times[start + 1 :], strict=True)
        if d.get("outcome") in {"duplicate", "conflict"}
    ]
    report.known = True
    report.topic = topology.topics.effects if first.get("stage") == "effect" else topology.topics.input
    report.partition = first.get("partition")
    report.offset = first.get("offset")
    report.first_seen = first.get("first_seen_at")
    report.duplicates = len(later)
    report.conflicts = sum(1 for d, _ in later if d.get("outcome") == "conflict")
    report.last_seen = _last_seen(report.first_seen, max((t for _, t in later), default=None))
    report.expires_at = first.get("expires_at")
    report.effect_key = first.get("effect_key")
    report.dropped = bool(first.get("dropped_by_route"))
    if report.dropped:
        return
    route = topology.route(str(first.get("source")), first.get("event_type"))
    report.command = first.get("command") or (route.command if route and route.command else DEFAULT_COMMAND)
    report.command_topic = route.topic if route and route.topic else topology.topics.commands

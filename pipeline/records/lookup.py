"""One key lookup for ``pipeline inspect KEY`` and the console: what became of an event key.

It asks the worker that owns the key's partition (each worker's HTTP endpoint
lists its partitions and answers ``/keys/{key}`` from its seen-set) for the
key's current claim, and reads the key's records from Kafka: every delivery
from its audit partition, its DLQ records, and the command its first copy
produced. A key whose deliveries were all invalid is reported as such (with
the reasons), not as unknown.

Counts mean what ``/metrics`` means: ``duplicates`` are the copies whose
outcome was ``duplicate`` (``pipeline_events_total{outcome="duplicate"}``),
``conflicts`` those whose outcome was ``conflict``; each within the key's
current claim.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
from yarl import URL

from pipeline.contract import DEFAULT_COMMAND
from pipeline.kafka.admin import partition_count
from pipeline.kafka.partitioner import owner_partition
from pipeline.records.key_history import Found, read_key
from pipeline.records.key_report import CommandRecord, Delivery, DlqRecord, Report
from pipeline.topology import Topology


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
    """Everything known about ``key``: the owning worker's claim, else the audit's, and the key's records."""
    report = await from_audit(key, topology, bootstrap=bootstrap)
    answer = await _ask_owner(key, topology, bootstrap=bootstrap, workers=workers, timeout=timeout)
    if answer is not None:
        url, found = answer
        _from_worker(report, url, found)
    report.standbys = await _standbys(key, topology, bootstrap=bootstrap, workers=workers, timeout=timeout)
    await _add_dlq(report, topology, bootstrap)
    await _add_command(report, bootstrap)
    return report


async def _ask_owner(
    key: str, topology: Topology, *, bootstrap: str, workers: Sequence[str], timeout: float
) -> tuple[str, dict[str, Any]] | None:
    """The owning worker's answer about a key it knows, with its URL; None when none knows it."""
    if not workers:
        return None
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
                        return url, answer
    return None


async def _standbys(
    key: str, topology: Topology, *, bootstrap: str, workers: Sequence[str], timeout: float
) -> list[str]:
    """Which workers keep a standby of the key's partitions, with how far behind each is."""
    if not workers:
        return []
    stages = [topology.topics.input] + ([topology.topics.effects] if topology.has_effects else [])
    counts = {topic: await partition_count(bootstrap, topic) for topic in stages}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        answers = await asyncio.gather(*(_get_json(session, f"{_base(url)}/partitions") for url in workers))
    found = []
    for topic in stages:
        count = counts[topic]
        if not count:
            continue
        name = f"{topic}-{owner_partition(key.encode(), count)}"
        for url, answer in zip(workers, answers, strict=True):
            standby = dict((answer or {}).get("standbys") or {}).get(name)
            if isinstance(standby, dict):
                records = standby.get("lag_records")
                behind = "?" if records is None else f"{records} records"
                found.append(f"{url} ({name}, {behind}, {standby.get('lag_seconds', '?')} s behind)")
    return found


def _base(url: str) -> str:
    return url if url.startswith("http") else f"http://{url}"


async def _get_json(session: aiohttp.ClientSession, url: str | URL) -> dict[str, Any] | None:
    try:
        async with session.get(url) as response:
            if response.status != 200:
                return None
            data = await response.json()
            return data if isinstance(data, dict) else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def _partitions(session: aiohttp.ClientSession, url: str) -> dict[str, list[int]]:
    answer = await _get_json(session, f"{_base(url)}/partitions")
    return dict(answer.get("partitions", {})) if answer else {}


def _from_worker(report: Report, url: str, answer: dict[str, Any]) -> None:
    """Take the claim from the worker's seen-set (it counts conflicts among its duplicates)."""
    entry = answer["entry"]
    conflicts = int(entry.get("conflicts", 0))
    report.known = True
    report.where = f"worker {url}"
    report.topic = answer["topic"]
    report.partition = answer["partition"]
    report.first_seen = entry["first_seen"]
    report.offset = entry["offset"]
    report.duplicates = max(int(entry["duplicates"]) - conflicts, 0)
    report.conflicts = conflicts
    report.last_seen = _last_seen(entry["first_seen"], entry.get("last_seen"))
    report.command = entry.get("command")
    report.command_topic = entry.get("topic")
    report.expires_at = entry["expires_at"]
    report.dropped = entry.get("command") is None and entry.get("topic") is None


async def from_audit(key: str, topology: Topology, *, bootstrap: str) -> Report:
    """Rebuild what is known about ``key`` from its audit partition (every delivery is there)."""
    audit = topology.topics.audit
    report = Report(key=key, where=f"audit topic {audit}", dlq_topic=topology.topics.dlq)
    inputs = await partition_count(bootstrap, topology.topics.input)
    if inputs:
        report.owner_partition = owner_partition(key.encode(), inputs)
    count = await partition_count(bootstrap, audit)
    if not count:
        return report
    found = await read_key(bootstrap, audit, owner_partition(key.encode(), count), key.encode())
    report.deliveries = [_delivery(f) for f in found]
    summarise(report, [f.value for f in found], topology)
    return report


def _delivery(found: Found) -> Delivery:
    value = found.value

    def number(name: str) -> int | None:
        got = value.get(name)
        return got if type(got) is int else None

    def text(name: str) -> str | None:
        got = value.get(name)
        return got if isinstance(got, str) else None

    return Delivery(
        outcome=text("outcome") or "unknown",
        timestamp=found.timestamp,
        audit_partition=found.partition,
        audit_offset=found.offset,
        partition=number("partition"),
        offset=number("offset"),
        reason=text("reason"),
        replayed_from=text("replayed_from"),
        to_partition=number("to_partition"),
        stage=text("stage"),
    )


def summarise(report: Report, values: Sequence[dict[str, Any]], topology: Topology) -> None:
    """Fill ``report``'s claim from its audit values (in audit order, beside ``report.deliveries``).

    The key's current claim starts at its last ``first`` delivery; duplicates of an
    earlier, expired claim are not counted. Times are record timestamps, as the
    worker's seen-set keeps them.
    """
    starts = [i for i, d in enumerate(report.deliveries) if d.outcome == "first"]
    if not starts:
        return
    start = starts[-1]
    first = values[start]
    later = [d for d in report.deliveries[start + 1 :] if d.outcome in {"duplicate", "conflict"}]
    report.known = True
    report.topic = topology.topics.effects if first.get("stage") == "effect" else topology.topics.input
    report.partition = first.get("partition")
    report.offset = first.get("offset")
    report.first_seen = first.get("first_seen_at")
    report.duplicates = sum(1 for d in later if d.outcome == "duplicate")
    report.conflicts = sum(1 for d in later if d.outcome == "conflict")
    report.last_seen = _last_seen(report.first_seen, max((d.timestamp for d in later), default=None))
    report.expires_at = first.get("expires_at")
    report.effect_key = first.get("effect_key")
    report.dropped = bool(first.get("dropped_by_route"))
    if report.dropped:
        return
    route = topology.route(str(first.get("source")), first.get("event_type"))
    report.command = first.get("command") or (route.command if route and route.command else DEFAULT_COMMAND)
    report.command_topic = route.topic if route and route.topic else topology.topics.commands


async def _add_dlq(report: Report, topology: Topology, bootstrap: str) -> None:
    """The key's DLQ records: on the input partition (owner, and each invalid delivery's) modulo the DLQ's count."""
    count = await partition_count(bootstrap, topology.topics.dlq)
    if not count:
        return
    inputs = {d.partition for d in report.deliveries if d.outcome == "invalid" and d.partition is not None}
    if report.owner_partition is not None:
        inputs.add(report.owner_partition)
    records: list[Found] = []
    for partition in sorted({p % count for p in inputs}):
        records += await read_key(bootstrap, topology.topics.dlq, partition, report.key.encode())
    for found in records:
        reason, error = found.value.get("reason"), found.value.get("error")
        report.dlq.append(
            DlqRecord(
                partition=found.partition,
                offset=found.offset,
                timestamp=found.timestamp,
                reason=reason if isinstance(reason, str) else "unparseable",
                error=error if isinstance(error, str) else "",
            )
        )


async def _add_command(report: Report, bootstrap: str) -> None:
    """Find the command of the claim's first copy: keyed by the effect key, at the first copy's time."""
    if not report.known or report.dropped or not report.command_topic or report.first_seen is None:
        return
    key = report.effect_key or report.key
    count = await partition_count(bootstrap, report.command_topic)
    if not count:
        return
    partition = owner_partition(key.encode(), count)
    found = await read_key(
        bootstrap, report.command_topic, partition, key.encode(), since_ms=report.first_seen, first_only=True
    )
    if found:
        hit = found[0]
        report.command_record = CommandRecord(hit.topic, hit.partition, hit.offset, hit.timestamp, key)

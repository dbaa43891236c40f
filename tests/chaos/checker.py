"""The independent end-of-run check, written with another Kafka client (confluent-kafka / librdkafka).

It reads the input topic, the command topic, the audit topic and the DLQ with
``isolation.level=read_committed`` in a fresh group, derives what the pipeline must
have done from the input records alone (its own murmur2 and its own reading of the
records, nothing from ``pipeline``), and compares.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

VALID_SOURCES = {"stripe": "id", "github": "x-github-delivery", "shopify": "x-shopify-event-id"}
KNOWN_OUTCOMES = {"first", "duplicate", "conflict", "invalid", "rerouted"}


def murmur2(data: bytes) -> int:
    """The Java client's murmur2 (what the pipeline's partitioner must match)."""
    length = len(data)
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = length - rest
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def owner(key: bytes, partitions: int) -> int:
    """The partition that owns ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass
class Rec:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]


def read_all(bootstrap: str, topic: str, *, timeout: float = 300.0) -> list[Rec]:
    """Every committed record of ``topic``, read to the end of each partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-checker-{uuid.uuid4().hex[:12]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30)
        partitions = sorted(metadata.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending = set(partitions)
        records: list[Rec] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: partitions {sorted(pending)} never reached their end")
            for message in consumer.consume(num_messages=5000, timeout=1.0):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(message.partition())
                        continue
                    raise RuntimeError(f"reading {topic}: {error}")
                partition, offset = message.partition(), message.offset()
                assert partition is not None  # a consumed record has both
                assert offset is not None
                # a consumed record's headers are (name, bytes or None) pairs (the stubs also allow a dict and str)
                headers = cast("list[tuple[str, bytes | None]]", message.headers() or [])
                records.append(
                    Rec(
                        topic,
                        partition,
                        offset,
                        message.key(),
                        message.value() or b"",
                        {name: value or b"" for name, value in headers},
                    )
                )
        return records
    finally:
        consumer.close()


@dataclass
class Expectation:
    """What the pipeline must do with one input record."""

    outcome: str  # "valid" (first or duplicate), "rerouted" or "invalid"
    key: str | None
    reason: str | None = None


def expect(rec: Rec, partitions: int) -> Expectation:
    """Derive the pipeline's duty for ``rec`` from the record alone."""
    source = rec.headers.get("source", b"").decode() or None
    if source not in VALID_SOURCES:
        return Expectation("invalid", None, "unknown-source")
    raw = (rec.key or b"").decode().strip()
    if not raw:
        where = VALID_SOURCES[source]
        if source == "stripe":
            try:
                raw = str(json.loads(rec.value).get("id") or "")
            except (ValueError, AttributeError):
                raw = ""
        else:
            raw = rec.headers.get(f"http-{where}", b"").decode().strip()
    if not raw:
        return Expectation("invalid", None, "missing-key")
    key = raw if raw.startswith(f"{source}:") else f"{source}:{raw}"
    if owner(key.encode(), partitions) != rec.partition:
        return Expectation("rerouted", key)
    try:
        body = json.loads(rec.value)
    except ValueError:
        return Expectation("invalid", key, "bad-body")
    if not isinstance(body, dict):
        return Expectation("invalid", key, "bad-body")
    return Expectation("valid", key)


@dataclass
class Report:
    counts: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def fail(self, message: str, examples: list[Any] | None = None) -> None:
        shown = f": {examples[:5]}" if examples else ""
        self.problems.append(message + shown)

    @property
    def ok(self) -> bool:
        return not self.problems


def check(
    bootstrap: str,
    topics: dict[str, str],
    partitions: int,
    *,
    acked_seqs: set[int],
    planned_malformed: int,
) -> Report:
    """Read everything and compare; ``acked_seqs`` are the sequence numbers the producer saw acked."""
    report = Report()
    inputs = read_all(bootstrap, topics["input"])
    commands = read_all(bootstrap, topics["commands"])
    audit_records = read_all(bootstrap, topics["audit"])
    dlq_records = read_all(bootstrap, topics["dlq"])

    # -- the input, as produced ----------------------------------------------------------
    originals = [r for r in inputs if "rerouted-from" not in r.headers]
    reroute_copies = [r for r in inputs if "rerouted-from" in r.headers]
    seqs = Counter(int(r.headers["chaos-seq"]) for r in originals if "chaos-seq" in r.headers)
    lost = sorted(acked_seqs - set(seqs))
    if lost:
        report.fail(f"{len(lost)} records acked to the producer are not in the input topic", lost)
    doubled = sorted(s for s, n in seqs.items() if n > 1)
    if doubled:
        report.fail(f"{len(doubled)} produced records appear twice in the input (producer retries)", doubled)

    expected = {(r.partition, r.offset): (r, expect(r, partitions)) for r in inputs}
    # a valid or rerouted record always has a key (see expect)
    valid_keys = {
        e.key for _, e in expected.values() if e.outcome in ("valid", "rerouted") and e.key is not None
    }
    malformed = {pos: (r, e) for pos, (r, e) in expected.items() if e.outcome == "invalid"}
    by_kind = Counter(r.headers.get("chaos-malformed", b"?").decode() for r, _ in malformed.values())
    if len(malformed) != planned_malformed:
        report.fail(f"{len(malformed)} malformed records in the input, {planned_malformed} planned")
    rerouted_expected = sum(1 for _, e in expected.values() if e.outcome == "rerouted")
    # every rerouted record must come back once as a copy on its owning partition
    copies_from = Counter(r.headers["rerouted-from"].decode() for r in reroute_copies)
    moved = {f"{p}:{o}" for (p, o), (_, e) in expected.items() if e.outcome == "rerouted"}
    if set(copies_from) != moved or any(n > 1 for n in copies_from.values()):
        report.fail(
            "rerouted copies in the input do not match the misplaced records one to one",
            sorted(set(copies_from) ^ moved) + [k for k, n in copies_from.items() if n > 1],
        )

    # -- audit: one record per input record --------------------------------------------
    audit = [json.loads(r.value) for r in audit_records]
    per_position: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for a in audit:
        per_position[(a["partition"], a["offset"])].append(a)
    missing_audit = sorted(set(expected) - set(per_position))
    extra_audit = sorted(set(per_position) - set(expected))
    twice = sorted(pos for pos, items in per_position.items() if len(items) > 1)
    if missing_audit:
        report.fail(f"{len(missing_audit)} input records have no audit record", missing_audit)
    if extra_audit:
        report.fail(f"{len(extra_audit)} audit records name no input record", extra_audit)
    if twice:
        report.fail(f"{len(twice)} input records are audited more than once", twice)
    outcomes = Counter(a["outcome"] for a in audit)
    wrong_outcome: list[tuple[Any, ...]] = []
    firsts: Counter[str] = Counter()
    for pos, items in per_position.items():
        if pos not in expected:
            continue
        _, exp = expected[pos]
        got = items[0]
        if got["outcome"] not in KNOWN_OUTCOMES:
            wrong_outcome.append((pos, got["outcome"]))
        if exp.outcome == "valid":
            if got["outcome"] not in ("first", "duplicate") or got["key"] != exp.key:
                wrong_outcome.append((pos, exp.key, got["outcome"], got["key"]))
            if got["outcome"] == "first":
                firsts[got["key"]] += 1
        elif exp.outcome == "rerouted":
            if got["outcome"] != "rerouted":
                wrong_outcome.append((pos, "rerouted", got["outcome"]))
        elif got["outcome"] != "invalid" or got.get("reason") != exp.reason:
            wrong_outcome.append((pos, exp.reason, got["outcome"], got.get("reason")))
    if wrong_outcome:
        report.fail(f"{len(wrong_outcome)} audit records have the wrong outcome", wrong_outcome)
    not_once = sorted(k for k in valid_keys if firsts[k] != 1)
    if not_once:
        report.fail(f"{len(not_once)} keys do not have exactly one 'first' audit record", not_once)

    # -- commands: exactly one per unique valid key ---------------------------------------
    command_keys = Counter((r.key or b"").decode() for r in commands)
    duplicated = sorted(k for k, n in command_keys.items() if n > 1)
    missing = sorted(valid_keys - set(command_keys))
    unexpected = sorted(set(command_keys) - valid_keys)
    if duplicated:
        report.fail(f"{len(duplicated)} keys have more than one command", duplicated)
    if missing:
        report.fail(f"{len(missing)} keys have no command", missing)
    if unexpected:
        report.fail(f"{len(unexpected)} commands for keys that are not valid input", unexpected)
    bad_commands = []
    for r in commands:
        value = json.loads(r.value)
        if value.get("key") != (r.key or b"").decode() or not isinstance(value.get("event"), dict):
            bad_commands.append((r.partition, r.offset))
    if bad_commands:
        report.fail(f"{len(bad_commands)} commands are malformed", bad_commands)

    # -- DLQ: every malformed record, once, with its reason and its bytes -------------------
    dlq: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in dlq_records:
        value = json.loads(r.value)
        dlq[(value["partition"], value["offset"])].append(value)
    dlq_missing = sorted(set(malformed) - set(dlq))
    dlq_extra = sorted(set(dlq) - set(malformed))
    dlq_twice = sorted(pos for pos, items in dlq.items() if len(items) > 1)
    dlq_wrong = [
        (pos, exp.reason, dlq[pos][0].get("reason"))
        for pos, (rec, exp) in malformed.items()
        if pos in dlq
        and (
            dlq[pos][0].get("reason") != exp.reason
            or not dlq[pos][0].get("error")
            or base64.b64decode(dlq[pos][0].get("value_base64", "")) != rec.value
        )
    ]
    dlq_findings: list[tuple[str, list[Any]]] = [
        ("malformed records missing from the DLQ", dlq_missing),
        ("DLQ records for records that are not malformed", dlq_extra),
        ("malformed records in the DLQ more than once", dlq_twice),
        ("DLQ records with the wrong reason, no error or other bytes", dlq_wrong),
    ]
    for message, findings in dlq_findings:
        if findings:
            report.fail(f"{len(findings)} {message}", findings)

    report.counts = {
        "input records": len(inputs),
        "  produced": len(originals),
        "  rerouted copies (written by workers)": len(reroute_copies),
        "unique valid keys": len(valid_keys),
        "duplicate deliveries": sum(1 for _, e in expected.values() if e.outcome == "valid")
        - len(valid_keys),
        "misplaced (rerouted)": rerouted_expected,
        "malformed": len(malformed),
        **{f"  {kind}": n for kind, n in sorted(by_kind.items())},
        "commands": len(commands),
        "duplicated commands": sum(n - 1 for n in command_keys.values() if n > 1),
        "missing keys": len(missing),
        "DLQ records": len(dlq_records),
        "audit records": len(audit),
        **{f"  {name}": n for name, n in sorted(outcomes.items())},
    }
    if outcomes.get("conflict"):
        report.fail(f"{outcomes['conflict']} deliveries were judged conflicts (no copy differs in substance)")
    return report

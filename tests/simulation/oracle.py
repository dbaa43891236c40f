"""What must be true at the end of every seed, read from the broker's logs alone.

read_committed, across every process incarnation:

- every input record (first stage) and every effects-topic record (second stage) has
  exactly one audit record, and the group's committed offset of every partition of
  both topics is at its log's end;
- every poison record (each copy of it: a redrive sends copies) has exactly one DLQ record,
  with the reason it deserves, unless it sat on another partition than its key's (it is
  rerouted there, and the rerouted copy goes to the DLQ); a record of a cause the world fixes (a source added, a limit
  raised) has one, with that reason, or none; a valid record has none, unless the broker
  refused its outputs (then ``unproducible`` or ``too-large``); a record dead-lettered
  ``unproducible`` had an output the broker refused alone, and, refused only for its
  timestamp, was redone stamped with another; a record restamped (its audit record carries
  ``original-timestamp``) had an output refused for its timestamp, or one the audit topic's
  bounds refuse (:mod:`tests.simulation.blame`);
- every accepted copy of a key (first, duplicate, conflict) is what the key's TTL windows
  say it must be (:mod:`tests.simulation.windows`, rules 1-7): a copy inside a window gives
  no second command, a copy after it exactly one new command, and a key with no claim yet
  one command; replays and late copies alike (the redrive promise: replaying any record any
  number of times gives at most one command per key within its TTL);
- the commands of a key are exactly its ``first`` copies (per effect key for events routed
  through the effect stage, whose effects-topic records are exactly the event stage's
  ``first`` copies of them); no command names a key the workload never sent;
- with a redrive, once its causes are fixed and the last replay exited 0, every key of the
  causes has a command.

The TTL windows, exact to what the worker guarantees (:mod:`tests.simulation.windows` has
each rule in full):

1. a copy's time ``e`` is its record timestamp bounded by the deciding worker's clock plus
   ``--max-clock-skew``, the clock read between the record's append and its audit record's
   (the seed's clock jumps widen it);
2. a partition's stream time is the largest ``e`` of the accepted copies before it (a restore
   takes it from the entries, so a store never runs ahead of it; a rescale moves entries
   without their ``last_seen``, so never to another partition's);
3. a ``first`` copy claims until ``max(e, stream time) + TTL``, whatever the record's age;
4. a claim's bucket is dropped only once stream time reaches its end plus one bucket of
   grace, so below that the claim is certainly kept (a rebuilt store too: no run lets stream
   time fall a day further behind the clock, where the changelog's retention could take it);
5. a copy certainly past its claim must be ``first``; a copy certainly within it, the claim
   certainly kept, a duplicate; any other either;
6. in the event stage, a copy that is not first is ``conflict`` exactly when its body differs
   from the claiming copy's (the workload's ``data.variant``), else ``duplicate``;
7. with sliding expiry, a copy that is not first moves its claim to ``max(X, e + TTL)``.

A rescale changes which partition owns a key: the copies handled before it (the group's
committed offsets when every worker had stopped) are taken before those handled after it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.headers import (
    EFFECT_TTL_HEADER,
    ORIGINAL_TIMESTAMP_HEADER,
    REPLAYED_FROM_HEADER,
    REROUTED_FROM_HEADER,
)
from tests.simulation import changelog_entries, claim_counts, claim_names
from tests.simulation.blame import SIZE, Blame, Bounds
from tests.simulation.broker import Broker
from tests.simulation.logs import NO_LIMIT
from tests.simulation.windows import Copy, Stream, Windows
from tests.simulation.workload import SIM_ID, Delivery

UNPRODUCIBLE = "unproducible"
REFUSED_REASONS = {UNPRODUCIBLE, "too-large"}
ACCEPTED = {"first", "duplicate", "conflict"}


@dataclass
class Facts:
    """What the oracle knows of a seed beyond the broker's logs."""

    deliveries: list[Delivery]
    input: str
    effects: str | None  # the effects topic, with effect routes
    audit: str
    dlq: str
    changelogs: list[str]
    command_topics: list[str]
    group: str
    ttl_ms: dict[str, int]  # per source
    sliding: frozenset[str]  # the sources whose expiry slides
    width: int  # the expiry buckets' width, ms
    skew: int  # --max-clock-skew, ms
    offsets: tuple[int, int]  # the least and greatest wall clock offset of any worker, ms
    refusals: bool  # outputs may have been refused: valid records may be dead-lettered
    boundaries: list[dict[tuple[str, int], int]] = field(default_factory=list)  # each rescale's
    cause_keys: set[str] = field(default_factory=set)  # keys that must have a command (a redrive fixed them)


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def fail(self, problem: str) -> None:
        if len(self.problems) < 40:
            self.problems.append(problem)


@dataclass(frozen=True)
class Audited:
    """An audit record, when and where it was appended, and the timestamp it had before the worker restamped it."""

    value: dict[str, Any]
    appended: int
    partition: int  # of the audit topic
    offset: int
    original: int | None = None  # its ``original-timestamp`` header: the worker stamped it with its clock


def _records(broker: Broker, topic: str | None) -> list[tuple[int, Any]]:
    found = broker.topics.get(topic) if topic else None
    if found is None:
        return []
    return [(log.partition, record) for log in found.partitions for record in log.committed_records()]


def check(broker: Broker, facts: Facts) -> Verdict:
    verdict = Verdict()
    consumed = [facts.input] + ([facts.effects] if facts.effects else [])
    _offsets(broker, facts, consumed, verdict)
    every_audit = _audit_records(broker, facts)
    audits = _audits(broker, facts, consumed, every_audit, verdict)
    _dead_letters(broker, facts, audits, verdict)
    event, effect = _windows(broker, facts, audits, verdict)
    commands = _commands(broker, facts, event, effect, verdict)
    claims = changelog_entries.decode(
        (name, index > 0, (record for _p, record in _records(broker, name)))
        for index, name in enumerate(facts.changelogs)
    )
    for problem in claim_names.problems(
        ((name, record) for name in facts.command_topics for _p, record in _records(broker, name)), claims
    ):
        verdict.fail(problem)
    for problem in claim_counts.problems(
        ((a.appended, a.partition, a.offset, a.value) for a in every_audit), claims
    ):
        verdict.fail(problem)
    for key in sorted(facts.cause_keys):
        if not commands.get(key):
            verdict.fail(f"{key}: no command, though its cause was fixed and the last replay exited 0")
    outcomes = Counter(a.value.get("outcome", "?") for a in audits.values())
    reasons = Counter(a.value.get("reason") for a in audits.values())
    replayed = Counter(
        name
        for name in consumed
        for _p, r in _records(broker, name)
        if r.header(REPLAYED_FROM_HEADER) is not None
    )
    verdict.counts = {
        "input": len(_records(broker, facts.input)),
        "refused-size": sum(1 for r in broker.refused if r.kind == SIZE),
        "refused-time": sum(1 for r in broker.refused if r.kind != SIZE),
        "unproducible": reasons[UNPRODUCIBLE],
        "commands": sum(commands.values()),
        "dlq": len(_records(broker, facts.dlq)),
        "dlq-effect": sum(
            1
            for _p, r in _records(broker, facts.dlq)
            if facts.effects and facts.effects.encode() in r.value[:300]
        ),
        "replayed": replayed[facts.input],
        "replayed-effect": replayed[facts.effects] if facts.effects else 0,
        "keys": len({d.effect_key or d.event_key for d in facts.deliveries if d.poison is None}),
        **{f"audit-{k}": n for k, n in outcomes.items()},
        **{
            f"window-{k}": event.judged.get(k, 0) + effect.judged.get(k, 0)
            for k in ("new", "renewed", "kept", "either", "slid")
        },
    }
    return verdict


def _offsets(broker: Broker, facts: Facts, consumed: list[str], verdict: Verdict) -> None:
    """Every partition of the consumed topics fully committed, no transaction left open."""
    committed = broker.group(facts.group).committed
    for name in consumed:
        for log in broker.topics[name].partitions:
            at = committed.get((name, log.partition), 0)
            if log.open_txns:
                verdict.fail(f"{name}-{log.partition}: transactions still open at the end: {log.open_txns}")
            if not log.caught_up(at):
                verdict.fail(f"{name}-{log.partition}: committed offset {at}, records up to {log.lso()}")


def _audit_records(broker: Broker, facts: Facts) -> list[Audited]:
    """Every committed audit record, decoded once."""
    found: list[Audited] = []
    for partition, record in _records(broker, facts.audit):
        original = record.header(ORIGINAL_TIMESTAMP_HEADER)
        found.append(
            Audited(
                orjson.loads(record.value),
                record.appended,
                partition,
                record.offset,
                int(original) if original is not None else None,
            )
        )
    return found


def _audits(
    broker: Broker, facts: Facts, consumed: list[str], every_audit: list[Audited], verdict: Verdict
) -> dict[tuple[str, int, int], Audited]:
    """One audit record per consumed record: each one's, by (topic, partition, offset)."""
    found: dict[tuple[str, int, int], Audited] = {}
    seen: Counter[tuple[str, int, int]] = Counter()
    for audited in every_audit:
        audit = audited.value
        stage = facts.effects if audit.get("stage") == "effect" and facts.effects else facts.input
        where = (stage, audit["partition"], audit["offset"])
        seen[where] += 1
        found[where] = audited
    for name in consumed:
        for partition, record in _records(broker, name):
            where = (name, partition, record.offset)
            count = seen.pop(where, 0)
            if count != 1:
                sim_id = (record.header(SIM_ID) or b"?").decode()
                verdict.fail(
                    f"{name}-{partition}@{record.offset} ({sim_id}): {count} audit records, expected 1"
                )
    for (name, partition, offset), count in sorted(seen.items())[:5]:
        verdict.fail(f"{count} audit records for {name}-{partition}@{offset}, which no committed record has")
    return found


def _dead_letters(
    broker: Broker, facts: Facts, audits: dict[tuple[str, int, int], Audited], verdict: Verdict
) -> None:
    """Each consumed record's DLQ records: as many, and with the reason, as it deserves."""
    deliveries = {d.sim_id: d for d in facts.deliveries}
    blamed = Blame.of(
        broker.refused, audit=facts.audit, dlq=facts.dlq, effects=facts.effects, consumed=facts.input
    )
    bounds = Bounds.of(broker.topics[facts.audit].config, facts.offsets, unlimited=NO_LIMIT)
    dlq: dict[tuple[str, int, int], list[str]] = defaultdict(list)
    for _p, record in _records(broker, facts.dlq):
        entry = orjson.loads(record.value)
        dlq[(entry.get("topic"), entry.get("partition"), entry.get("offset"))].append(entry.get("reason"))
    consumed = [(facts.input, _records(broker, facts.input))]
    if facts.effects:
        consumed.append((facts.effects, _records(broker, facts.effects)))
    for name, records in consumed:
        for partition, record in records:
            where = (name, partition, record.offset)
            reasons = dlq.pop(where, [])
            sim_id = (record.header(SIM_ID) or b"").decode()
            shown = f"{name}-{partition}@{record.offset} ({sim_id or '?'})"
            audited = audits.get(where)
            invalid = audited is not None and audited.value.get("outcome") == "invalid"
            if len(reasons) > 1 or invalid != bool(reasons):
                verdict.fail(f"{shown}: DLQ records {reasons} and audit outcome invalid {invalid}")
                continue
            delivery = deliveries.get(sim_id) if name == facts.input else None
            if name == facts.input and delivery is None:
                verdict.fail(f"{shown}: an input record the workload never sent")
                continue
            allowed = _allowed_reasons(delivery, facts.refusals)
            rerouted = audited is not None and audited.value.get("outcome") == "rerouted"
            if delivery is not None and delivery.poison is not None and not reasons and not rerouted:
                verdict.fail(f"{shown} (poison: {delivery.poison}) has no DLQ record")
            elif reasons and reasons[0] not in allowed:
                what = f"poison: {delivery.poison}" if delivery is not None and delivery.poison else "valid"
                verdict.fail(
                    f"{shown} ({what}) went to the DLQ as {reasons[0]}, expected one of {sorted(allowed)}"
                )
            keys = [record.key] + ([delivery.event_key, delivery.effect_key] if delivery is not None else [])
            if reasons == [UNPRODUCIBLE] and (problem := blamed.problem(where, keys)) is not None:
                verdict.fail(f"{shown} went to the DLQ as {UNPRODUCIBLE}, but {problem}")
            if audited is not None and audited.original is not None:
                outside = bounds.outside(audited.original, audited.appended)
                if not outside and not blamed.for_timestamp(where, keys):
                    verdict.fail(
                        f"{shown} was restamped (original timestamp {audited.original}), but the broker refused none "
                        "of its outputs for their timestamp, and the audit topic's bounds take it"
                    )
    for where, reasons in sorted(dlq.items(), key=str)[:5]:
        verdict.fail(f"DLQ records {reasons} for {where}, which no committed consumed record is")


def _allowed_reasons(delivery: Delivery | None, refusals: bool) -> set[str]:
    """The DLQ reasons a record may have (an effects-topic record: ``delivery`` None)."""
    if delivery is not None and delivery.poison is not None:
        return {delivery.poison}
    allowed = set(REFUSED_REASONS) if refusals else set()
    if delivery is not None and delivery.cause is not None:
        allowed.add(delivery.cause)
    return allowed


def _windows(
    broker: Broker, facts: Facts, audits: dict[tuple[str, int, int], Audited], verdict: Verdict
) -> tuple[Windows, Windows]:
    """Every accepted copy, in its partition's order (before a rescale, then after), against its key's windows."""
    stages = {facts.input: Windows(facts.width, facts.skew, facts.offsets, bodies=True)}
    if facts.effects:
        stages[facts.effects] = Windows(facts.width, facts.skew, facts.offsets)
    for name, windows in stages.items():
        streams: dict[int, Stream] = {}
        records = _records(broker, name)
        phases = [*facts.boundaries, None]
        start: dict[int, int] = defaultdict(int)
        for boundary in phases:  # a partition's stream time is its own across a rescale too
            for partition, record in records:
                end = boundary.get((name, partition), 0) if boundary is not None else None
                if record.offset < start[partition] or (end is not None and record.offset >= end):
                    continue
                stream = streams.setdefault(partition, Stream())
                copy = _copy(name, partition, record, audits.get((name, partition, record.offset)), facts)
                if copy is not None:
                    windows.decide(copy, stream)
            if boundary is not None:
                for (topic, partition), end in boundary.items():
                    if topic == name:
                        start[partition] = end
        for problem in windows.problems:
            verdict.fail(problem)
    return stages[facts.input], stages.get(
        facts.effects or "", Windows(facts.width, facts.skew, facts.offsets)
    )


def _copy(name: str, partition: int, record: Any, audited: Audited | None, facts: Facts) -> Copy | None:
    """The accepted copy ``record`` is, or None (invalid, rerouted, no audit)."""
    if audited is None or audited.value.get("outcome") not in ACCEPTED:
        return None
    audit = audited.value
    key = str(audit.get("key"))
    sliding = False
    if name == facts.input:
        source = key.split(":", 1)[0]
        ttl, sliding = facts.ttl_ms.get(source, 0), source in facts.sliding
    else:
        header = record.header(EFFECT_TTL_HEADER)
        ttl = int(header) if header is not None and header.isdigit() else 0
    sim_id = (record.header(SIM_ID) or b"").decode()
    tags = [t for t in (REROUTED_FROM_HEADER, REPLAYED_FROM_HEADER) if record.header(t) is not None]
    where = f"{name}-{partition}@{record.offset} ({sim_id or '?'}{', ' + ', '.join(tags) if tags else ''})"
    return Copy(
        where=where,
        key=key,
        timestamp=record.timestamp,
        appended=record.appended,
        audited=audited.appended,
        outcome=str(audit.get("outcome")),
        first_seen=audit.get("first_seen_at"),
        expires_at=audit.get("expires_at"),
        ttl=ttl,
        variant=_variant(record.value),
        sliding=sliding,
    )


def _variant(value: bytes | None) -> int | None:
    """Which body the workload sent (``data.variant``: rule 6), or None for a body it did not write."""
    try:
        body = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    data = body.get("data") if isinstance(body, dict) else None
    variant = data.get("variant") if isinstance(data, dict) else None
    return variant if isinstance(variant, int) else None


def _commands(
    broker: Broker, facts: Facts, event: Windows, effect: Windows, verdict: Verdict
) -> Counter[str]:
    """The commands of each key are its first copies; the effects-topic records, the event stage's first
    copies of effect-routed events. Returns the commands per key."""
    routed = {d.event_key for d in facts.deliveries if d.effect_key is not None}
    commands: Counter[str] = Counter()
    for name in facts.command_topics:
        for _p, record in _records(broker, name):
            command = orjson.loads(record.value)
            commands[command.get("effect_key") or command.get("key")] += 1
    wanted: Counter[str] = Counter({k: n for k, n in event.firsts.items() if k not in routed})
    wanted.update(effect.firsts)
    for key in sorted(set(commands) | set(wanted)):
        if commands[key] != wanted[key]:
            verdict.fail(f"{key}: {commands[key]} commands, expected {wanted[key]} (its first copies)")
    originals: Counter[str] = Counter()
    for _p, record in _records(broker, facts.effects):
        if record.header(REROUTED_FROM_HEADER) is None and record.header(REPLAYED_FROM_HEADER) is None:
            originals[str(orjson.loads(record.value).get("key"))] += 1
    for key in sorted(routed):
        if originals[key] != event.firsts.get(key, 0):
            verdict.fail(
                f"{key}: {originals[key]} effects-topic records, expected {event.firsts.get(key, 0)} (its first copies)"
            )
    return commands

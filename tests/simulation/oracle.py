"""What must be true at the end of every seed, read from the broker's logs alone.

read_committed, across every process incarnation:

- every input record (first stage) and every effects-topic record (second stage) has
  exactly one audit record, and the group's committed offset of every partition of
  both topics is at its log's end;
- every valid key has exactly one command (per effect key, for events routed through
  the effect stage), unless its record went to the DLQ because the broker refused its
  outputs, and then none;
- every poison record has exactly one DLQ record, with the reason it deserves, and no
  valid record has one (but for outputs the broker refused);
- no command names a key the workload never sent.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.simulation.broker import Broker
from tests.simulation.workload import SIM_ID, Workload

REFUSED_REASONS = {"unproducible", "too-large"}


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


def _records(broker: Broker, topic: str) -> list[Any]:
    found = broker.topics.get(topic)
    if found is None:
        return []
    return [(log.partition, record) for log in found.partitions for record in log.committed_records()]


def check(broker: Broker, workload: Workload, topics: Any, command_topics: list[str], group: str) -> Verdict:
    verdict = Verdict()
    deliveries = {d.sim_id: d for d in workload.deliveries}

    # -- offsets: every partition of the consumed topics fully committed ----------------------------
    committed = broker.group(group).committed
    consumed = [topics.input] + ([topics.effects] if workload.effects else [])
    for name in consumed:
        topic = broker.topics[name]
        for log in topic.partitions:
            at = committed.get((name, log.partition), 0)
            if log.open_txns:
                verdict.fail(f"{name}-{log.partition}: transactions still open at the end: {log.open_txns}")
            if not log.caught_up(at):
                verdict.fail(f"{name}-{log.partition}: committed offset {at}, records up to {log.lso()}")

    # -- audit: one per consumed record ---------------------------------------------------------------
    audits: Counter[tuple[str, int, int]] = Counter()
    outcomes: dict[str, list[str]] = defaultdict(list)
    for _p, record in _records(broker, topics.audit):
        audit = orjson.loads(record.value)
        stage = topics.effects if audit.get("stage") == "effect" else topics.input
        audits[(stage, audit["partition"], audit["offset"])] += 1
        outcomes[audit.get("outcome", "?")].append(audit.get("key") or "")
    input_records = {name: _records(broker, name) for name in consumed}
    for name, records in input_records.items():
        for partition, record in records:
            seen = audits.pop((name, partition, record.offset), 0)
            if seen != 1:
                sim_id = (record.header(SIM_ID) or b"?").decode()
                verdict.fail(
                    f"{name}-{partition}@{record.offset} ({sim_id}): {seen} audit records, expected 1"
                )
    for (name, partition, offset), seen in sorted(audits.items())[:5]:
        verdict.fail(f"{seen} audit records for {name}-{partition}@{offset}, which no committed record has")

    # -- DLQ ------------------------------------------------------------------------------------------
    dlq: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _p, record in _records(broker, topics.dlq):
        entry = orjson.loads(record.value)
        sim_id = entry.get("headers", {}).get(SIM_ID, "?")
        dlq[sim_id].append(entry)
    refused_keys: set[str] = set()
    for sim_id, entries in dlq.items():
        delivery = deliveries.get(sim_id)
        reasons = [e.get("reason") for e in entries]
        if delivery is None:
            verdict.fail(f"DLQ records for an unknown record {sim_id}: {reasons}")
            continue
        if len(entries) != 1:
            verdict.fail(f"{sim_id}: {len(entries)} DLQ records ({reasons}), expected 1")
        if delivery.poison is None:
            if all(r in REFUSED_REASONS for r in reasons):
                refused_keys.add(delivery.effect_key or delivery.event_key)
            else:
                verdict.fail(f"{sim_id} ({delivery.event_key}) is valid but went to the DLQ: {reasons}")
    for sim_id, delivery in deliveries.items():
        if delivery.poison is not None and sim_id not in dlq:
            verdict.fail(f"{sim_id} (poison: {delivery.poison}) has no DLQ record")

    # -- commands: exactly one per key ------------------------------------------------------------------
    commands: Counter[str] = Counter()
    for name in command_topics:
        for _p, record in _records(broker, name):
            command = orjson.loads(record.value)
            commands[command.get("effect_key") or command.get("key")] += 1
    wanted = {d.effect_key or d.event_key for d in workload.deliveries if d.poison is None}
    for key in sorted(wanted):
        count = commands.pop(key, 0)
        if count == 1 or (count == 0 and key in refused_keys):
            continue
        verdict.fail(f"{key}: {count} commands, expected 1")
    for key, count in sorted(commands.items())[:5]:
        verdict.fail(f"{count} commands for {key}, which the workload never sent")
    verdict.counts = {
        "input": sum(len(r) for r in input_records.values()),
        "commands": sum(1 for name in command_topics for _ in _records(broker, name)),
        "dlq": sum(len(v) for v in dlq.values()),
        "keys": len(wanted),
        **{f"audit-{k}": len(v) for k, v in outcomes.items()},
    }
    return verdict

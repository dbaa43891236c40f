"""What a key lookup reports (``pipeline inspect KEY`` and the console's key page), and how it reads as text.

:mod:`pipeline.records.lookup` fills a :class:`Report` from the owning worker and the
key's records in Kafka; this module only holds the report and renders it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime


@dataclass(frozen=True, slots=True)
class Delivery:
    """One audit record of the key: what one delivery (input record) turned out to be."""

    outcome: str  # first, duplicate, conflict, invalid, rerouted
    timestamp: int  # the record time (the input record's)
    audit_partition: int
    audit_offset: int
    partition: int | None = None  # the input record's partition and offset
    offset: int | None = None
    reason: str | None = None  # why an invalid delivery was invalid
    replayed_from: str | None = None  # <dlq topic>:<partition>:<offset> of a redriven record
    to_partition: int | None = None  # where a rerouted delivery went
    stage: str | None = None  # "effect" for the effect stage's records

    @property
    def label(self) -> str:
        """The outcome in words: ``invalid (bad-signature)``, ``first, replayed from webhooks.dlq:0:3``."""
        text = self.outcome
        if self.reason:
            text += f" ({self.reason})"
        if self.to_partition is not None:
            text += f" to partition {self.to_partition}"
        if self.replayed_from:
            text += f", replayed from {self.replayed_from}"
        return text


@dataclass(frozen=True, slots=True)
class DlqRecord:
    """One DLQ record of the key."""

    partition: int
    offset: int
    timestamp: int
    reason: str
    error: str


@dataclass(frozen=True, slots=True)
class CommandRecord:
    """Where the command of the key's first copy is."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: str


@dataclass
class Report:
    """The answer about one key."""

    key: str
    known: bool = False  # the key is claimed (a first copy was processed within its TTL)
    where: str = ""  # who answered the counts: a worker URL or the audit topic
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
    owner_partition: int | None = None  # the input partition that owns the key
    deliveries: list[Delivery] = field(default_factory=list)
    dlq: list[DlqRecord] = field(default_factory=list)
    command_record: CommandRecord | None = None
    dlq_topic: str = ""
    standbys: list[str] = field(default_factory=list)  # workers keeping a standby of the key's partition

    @property
    def invalid_reasons(self) -> Counter[str]:
        """How many deliveries were invalid, per reason."""
        return Counter(d.reason or "unknown" for d in self.deliveries if d.outcome == "invalid")

    @property
    def status(self) -> str:
        """``processed``, ``not processed`` (seen, every delivery invalid or only rerouted) or ``never seen``."""
        if self.known:
            return "processed"
        return "not processed" if self.deliveries or self.dlq else "never seen"

    def lines(self) -> list[str]:
        """Human-readable lines."""
        out = [f"key           {self.key}"]
        if not self.known:
            out.append(f"known         no: {self._unknown()}")
        else:
            out += [
                f"known         yes, {self.topic} partition {self.partition} (from {self.where})",
                f"first seen    {_time(self.first_seen)} at offset {self.offset}",
                f"duplicates    {self.duplicates}"
                + (
                    f", last at {_time(self.last_seen)}"
                    if self.last_seen and self.last_seen != self.first_seen
                    else ""
                ),
            ]
            if self.conflicts:
                out.append(f"conflicts     {self.conflicts} (copies whose body differed from the first)")
            out.append(f"command       {self._command()}")
            out.append(f"expires       {_time(self.expires_at)}")
        if self.deliveries:
            counts = Counter(d.outcome for d in self.deliveries)
            out.append(
                f"deliveries    {len(self.deliveries)}: " + ", ".join(f"{o} {n}" for o, n in counts.items())
            )
        out.extend(f"standby       {standby}" for standby in self.standbys)
        for record in self.dlq:
            out.append(
                f"dlq           {self.dlq_topic}:{record.partition}:{record.offset} {record.reason}"
                f" at {_time(record.timestamp)}"
            )
        return out

    def _unknown(self) -> str:
        if not self.deliveries and not self.dlq:
            return f"never seen ({self.where})"
        invalid = self.invalid_reasons
        if invalid:
            reasons = ", ".join(f"{r} {n}" for r, n in invalid.most_common())
            text = f"{len(self.deliveries)} deliveries, none processed: {sum(invalid.values())} invalid ({reasons})"
        else:
            text = f"{len(self.deliveries)} deliveries, none processed"
        return text + (f"; {len(self.dlq)} in the DLQ" if self.dlq else "")

    def _command(self) -> str:
        if self.dropped:
            return "none (dropped by a route)"
        if not self.command:
            return "unknown"
        text = f"{self.command} -> {self.command_topic}" if self.command_topic else self.command
        if self.command_record is not None:
            text += f" (partition {self.command_record.partition} offset {self.command_record.offset})"
        return text + (f" (through the effect stage as {self.effect_key})" if self.effect_key else "")


def _time(ms: int | None) -> str:
    """Milliseconds since the epoch as ISO 8601 UTC; ``-`` when unknown."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

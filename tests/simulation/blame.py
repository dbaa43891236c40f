"""Which records the broker refused, and whether a record dead-lettered or restamped earned it.

The worker dead-letters a valid record as ``unproducible`` only after bisecting a refused
transaction down to that record alone and being refused again (:mod:`pipeline.worker.poison`);
refused for its timestamp, it first redoes the record stamped with the current time. So:

- a record dead-lettered ``unproducible`` had an output the broker refused, alone: a bisection
  that isolates a neighbour of the record that fails (late, or by the wrong half) dead-letters a
  record none of whose outputs was refused;
- when each of its refusals was for a timestamp, one of them carried another timestamp than the
  rest: the redo stamped with the current time, refused too. A worker that dead-letters a record
  refused for its timestamp without restamping it never sends that second timestamp;
- a record restamped (its outputs carry ``original-timestamp``) had an output refused for its
  timestamp, or a timestamp outside the topic's bounds (:class:`Bounds`): a bisection that
  isolates an innocent record refused for a timestamp restamps that one.

A refused record's outputs are found by the consumed record's position (audit and DLQ records
carry it) or by key (commands and effects-topic records carry the event or effect key, changelog
records contain it): a copy of the same key may lend its refusals, which only weakens the check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from tests.simulation.records import ProducedBatch, Record

SIZE = "size"
TIMESTAMP = "timestamp"
# A batch of one record is at most this much larger than the record's key, value and headers
# (61 bytes of batch header and a record's varints): generous, so that a record near the limit is
# blamed rather than a correct worker failed.
ALONE_OVERHEAD = 120


@dataclass(frozen=True)
class Refusal:
    """One record of a batch the broker refused: the one that made it refused, when that can be told."""

    topic: str
    record: Record
    kind: str  # SIZE or TIMESTAMP


def _size(record: Record) -> int:
    headers = sum(len(name) + len(value or b"") for name, value in record.headers)
    return len(record.key or b"") + len(record.value or b"") + headers


def refused(
    topic: str, produced: ProducedBatch, kind: str, *, limit: int, outside: Callable[[int], bool]
) -> list[Refusal]:
    """The records of ``produced`` (refused for ``kind``) to blame.

    Those refused alone too; else, when they all share one key (the outputs of one consumed record
    may be too large only together), all of them; else none: a worker that splits them commits each.
    ``limit`` is the topic's ``max.message.bytes``; ``outside(timestamp)`` says whether the broker
    refuses a timestamp.
    """
    records = produced.records
    if kind == TIMESTAMP:
        guilty = [r for r in records if outside(r.timestamp)]
    else:
        guilty = [r for r in records if len(records) == 1 or _size(r) + ALONE_OVERHEAD > limit]
    if not guilty and len({r.key for r in records}) == 1:
        guilty = records
    return [Refusal(topic, r, kind) for r in guilty]


@dataclass
class Blame:
    """The refusals of a run, indexed by what they name."""

    by_position: dict[tuple[str, int, int], list[Refusal]]
    by_key: list[tuple[bytes, Refusal]]

    @classmethod
    def of(
        cls, refusals: Iterable[Refusal], *, audit: str, dlq: str, effects: str | None, consumed: str
    ) -> Blame:
        by_position: dict[tuple[str, int, int], list[Refusal]] = {}
        by_key: list[tuple[bytes, Refusal]] = []
        for refusal in refusals:
            record = refusal.record
            if record.key:
                by_key.append((record.key, refusal))
            if refusal.topic not in (audit, dlq) or not record.value:
                continue
            try:
                value = orjson.loads(record.value)
                if refusal.topic == dlq:
                    stage = value["topic"]
                else:
                    stage = effects if value.get("stage") == "effect" and effects else consumed
                where = (str(stage), int(value["partition"]), int(value["offset"]))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
            by_position.setdefault(where, []).append(refusal)
        return cls(by_position, by_key)

    def _found(self, where: tuple[str, int, int], keys: Iterable[str | bytes | None]) -> list[Refusal]:
        wanted = [k.encode() if isinstance(k, str) else k for k in keys if k]
        found = list(self.by_position.get(where, []))
        return found + [refusal for key, refusal in self.by_key if any(k in key for k in wanted)]

    def for_timestamp(self, where: tuple[str, int, int], keys: Iterable[str | bytes | None]) -> bool:
        """Whether an output of the record at ``where`` was refused for its timestamp."""
        return any(r.kind == TIMESTAMP for r in self._found(where, keys))

    def problem(self, where: tuple[str, int, int], keys: Iterable[str | bytes | None]) -> str | None:
        """Why a record at ``where`` (with these keys) did not earn ``unproducible``, or ``None``."""
        found = self._found(where, keys)
        if not found:
            return "the broker refused none of its outputs"
        if all(r.kind == TIMESTAMP for r in found) and len({r.record.timestamp for r in found}) < 2:
            return "its outputs were refused for their timestamp, and never redone stamped with another"
        return None


@dataclass(frozen=True)
class Bounds:
    """The audit topic's timestamp bounds, as a worker with any of the run's clocks may apply them.

    The worker stamps an output with its clock when the topic's bounds (read at its start) refuse
    the record's timestamp: legitimate when the original is outside them for the worker's clock at
    handling. The check takes the least (or greatest) clock of any worker and allows ``SLACK``
    between the handling and the append, so that it never fails a correct worker.
    """

    after: int
    before: int | None
    clock: tuple[int, int]  # the least and greatest wall clock offset of any worker, ms

    SLACK: ClassVar[int] = 15 * 60_000
    AFTER: ClassVar[int] = 3_600_000  # the bound a refuse-outputs fault sets, and Kafka 4's default

    @classmethod
    def of(cls, config: Any, offsets: tuple[int, int], *, unlimited: int) -> Bounds:
        """The bounds of a topic ``config`` (``unlimited``: the value that means no bound)."""
        before = config.timestamp_before_max_ms
        return cls(
            min(config.timestamp_after_max_ms, cls.AFTER), before if before != unlimited else None, offsets
        )

    def outside(self, original: int, appended: int) -> bool:
        """Whether some worker's clock near ``appended`` may have put ``original`` outside the bounds."""
        if original > appended + self.clock[0] + self.after - self.SLACK:
            return True
        return self.before is not None and original < appended + self.clock[1] - self.before + self.SLACK

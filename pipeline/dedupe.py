"""The dedupe decision: pure, deterministic, no Kafka and no RocksDB.

A key's state is an :class:`Entry`. :func:`decide` takes the state before a
copy arrives (from the store, or staged earlier in the same batch) and the
copy's record timestamp, and returns what happened and the state after.
Time is the record timestamp (stream time), never the wall clock, so
replaying a partition makes the same decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

import orjson


class Outcome(StrEnum):
    """What a delivery turned out to be (the audit topic's ``outcome``)."""

    FIRST = "first"  # first copy inside the TTL: the command is emitted
    DUPLICATE = "duplicate"  # a copy of a key seen within its TTL: nothing is emitted
    INVALID = "invalid"  # unusable: sent to the DLQ with the reason
    REROUTED = "rerouted"  # on the wrong partition: moved to the owning one


@dataclass(frozen=True, slots=True)
class Entry:
    """What the seen-set remembers about one key. Times are ms since the epoch."""

    first_seen: int
    expires_at: int
    partition: int
    offset: int
    duplicates: int = 0
    last_seen: int = 0
    command: str | None = None
    topic: str | None = None

    def encode(self) -> bytes:
        """The bytes stored in RocksDB and in the changelog."""
        return orjson.dumps(
            {
                "f": self.first_seen,
                "x": self.expires_at,
                "p": self.partition,
                "o": self.offset,
                "d": self.duplicates,
                "l": self.last_seen,
                "c": self.command,
                "t": self.topic,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> Entry:
        """Read what :meth:`encode` wrote; raises ``ValueError`` on anything else."""
        try:
            raw = orjson.loads(data)
            return cls(
                first_seen=int(raw["f"]),
                expires_at=int(raw["x"]),
                partition=int(raw["p"]),
                offset=int(raw["o"]),
                duplicates=int(raw.get("d", 0)),
                last_seen=int(raw.get("l", 0)),
                command=raw.get("c"),
                topic=raw.get("t"),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"not a seen-set entry: {exc}") from exc

    def alive_at(self, timestamp: int) -> bool:
        """Whether the key is still remembered at ``timestamp``."""
        return timestamp < self.expires_at


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one copy and the key's state after it."""

    outcome: Outcome
    entry: Entry
    previous: Entry | None  # the state before this copy (an expired one included)
    changelog: bool  # whether the new state must be written to the changelog


def decide(
    existing: Entry | None,
    *,
    timestamp: int,
    ttl_ms: int,
    sliding: bool,
    partition: int,
    offset: int,
    command: str | None = None,
    topic: str | None = None,
) -> Decision:
    """Decide one copy of a key seen at ``timestamp`` (its record timestamp).

    - no state, or state that expired before ``timestamp``: ``FIRST``; the key
      is (re)claimed with ``expires_at = timestamp + ttl`` and the claim goes to
      the changelog;
    - live state: ``DUPLICATE``; the duplicate count and last-seen time are
      updated locally, and with sliding expiry ``expires_at`` moves to
      ``timestamp + ttl`` (which the changelog must then carry).
    """
    if existing is None or not existing.alive_at(timestamp):
        entry = Entry(
            first_seen=timestamp,
            expires_at=timestamp + ttl_ms,
            partition=partition,
            offset=offset,
            last_seen=timestamp,
            command=command,
            topic=topic,
        )
        return Decision(Outcome.FIRST, entry, existing, changelog=True)
    expires_at = existing.expires_at
    if sliding:
        expires_at = max(expires_at, timestamp + ttl_ms)
    entry = replace(
        existing,
        duplicates=existing.duplicates + 1,
        last_seen=max(existing.last_seen, timestamp),
        expires_at=expires_at,
    )
    return Decision(Outcome.DUPLICATE, entry, existing, changelog=expires_at != existing.expires_at)

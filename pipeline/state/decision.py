"""The dedupe decision: pure, deterministic, no Kafka and no RocksDB.

A key's state is an :class:`Entry`. :func:`decide` takes the state before a
copy arrives (from the store, or staged earlier in the same batch) and the
copy's record timestamp, and returns what happened and the state after.
Time is the record timestamp (stream time), never the wall clock, so
replaying a partition makes the same decisions.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import Any, NamedTuple

import orjson
import xxhash


class Outcome(StrEnum):
    """What a delivery turned out to be (the audit topic's ``outcome``)."""

    FIRST = "first"  # first copy inside the TTL: the command is emitted
    DUPLICATE = "duplicate"  # a copy of a key seen within its TTL: nothing is emitted
    INVALID = "invalid"  # unusable: sent to the DLQ with the reason
    REROUTED = "rerouted"  # on the wrong partition: moved to the owning one
    CONFLICT = "conflict"  # a copy within the TTL whose body differs from the first copy's: not processed


class Entry(NamedTuple):
    """What the seen-set remembers about one key. Times are ms since the epoch."""

    first_seen: int
    expires_at: int
    partition: int
    offset: int
    duplicates: int = 0
    last_seen: int = 0
    command: str | None = None
    topic: str | None = None
    body_hash: str | None = None  # fingerprint of the first copy's body (see body_fingerprint)
    conflicts: int = 0

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
                "h": self.body_hash,
                "k": self.conflicts,
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
                body_hash=raw.get("h"),
                conflicts=int(raw.get("k", 0)),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"not a seen-set entry: {exc}") from exc

    def alive_at(self, timestamp: int) -> bool:
        """Whether the key is still remembered at ``timestamp``."""
        return timestamp < self.expires_at


class Decision(NamedTuple):
    """The outcome of one copy and the key's state after it."""

    outcome: Outcome
    entry: Entry
    previous: Entry | None  # the state before this copy (an expired one included)


def decide(
    existing: Entry | None,
    *,
    timestamp: int,
    ttl_ms: int,
    sliding: bool,
    partition: int,
    offset: int,
    stream_time: int,
    command: str | None = None,
    topic: str | None = None,
    body_hash: str | None = None,
) -> Decision:
    """Decide one copy of a key seen at ``timestamp`` (its record timestamp) when the partition's
    stream time is ``stream_time`` (the latest accepted record's time before this copy).

    - no state, or state that expired before ``timestamp``: ``FIRST``; the key
      is (re)claimed until ``max(timestamp, stream_time) + ttl``: a claim always
      lives one whole TTL in stream time from the moment it is made. A copy older
      than stream time (a redrive from the DLQ days later, a late redelivery)
      claimed only until ``timestamp + ttl`` would expire at once, in a bucket
      already dropped, and its next copy would be ``FIRST`` again;
    - live state: ``DUPLICATE``; the duplicate count and last-seen time move,
      and with sliding expiry ``expires_at`` moves to ``timestamp + ttl``;
    - live state whose first copy had another ``body_hash``: ``CONFLICT``, a
      duplicate that is still not processed but is counted, because two
      different bodies under one key usually mean a bad key.
    """
    if existing is None or not existing.alive_at(timestamp):
        entry = Entry(
            first_seen=timestamp,
            expires_at=max(timestamp, stream_time) + ttl_ms,
            partition=partition,
            offset=offset,
            last_seen=timestamp,
            command=command,
            topic=topic,
            body_hash=body_hash,
        )
        return Decision(Outcome.FIRST, entry, existing)
    expires_at = existing.expires_at
    if sliding and timestamp + ttl_ms > expires_at:
        expires_at = timestamp + ttl_ms
    conflict = body_hash is not None and existing.body_hash is not None and body_hash != existing.body_hash
    entry = Entry(  # built field by field: _replace costs more than the decision itself
        first_seen=existing.first_seen,
        expires_at=expires_at,
        partition=existing.partition,
        offset=existing.offset,
        duplicates=existing.duplicates + 1,
        last_seen=max(existing.last_seen, timestamp),
        command=existing.command,
        topic=existing.topic,
        body_hash=existing.body_hash,
        conflicts=existing.conflicts + 1 if conflict else existing.conflicts,
    )
    outcome = Outcome.CONFLICT if conflict else Outcome.DUPLICATE
    return Decision(outcome, entry, existing)


#: A fingerprint of the body's bytes (xxh3) starts with this.
RAW_FINGERPRINT = "x:"
#: The previous version's fingerprint of the body's bytes (blake2b): entries written by it hold one.
#: An entry with neither prefix holds a :func:`normalised_fingerprint`. A copy is compared with an
#: entry by the entry's kind (comparing two kinds would make every such duplicate a conflict).
BLAKE_FINGERPRINT = "b:"

# a JSON scalar: what a volatile field holds (Stripe's ``pending_webhooks`` is an integer)
_SCALAR = rb'(?:-?\d[\d.eE+-]*|"(?:[^"\\]|\\.)*"|true|false|null)'


def volatile_pattern(fields: Iterable[str]) -> re.Pattern[bytes] | None:
    """What :func:`body_fingerprint` blanks out of a body: each ``"field": <scalar>``; None for no fields."""
    names = [re.escape(name.encode()) for name in fields]
    if not names:
        return None
    return re.compile(rb'"(?:' + b"|".join(names) + rb')"\s*:\s*' + _SCALAR)


def body_fingerprint(body: bytes, volatile: re.Pattern[bytes] | None = None) -> str:
    """A short hash (xxh3, 64 bits) of the body's bytes, with the provider's per-attempt fields left out.

    Retries of one event carry the same bytes (only what the provider changes per
    attempt differs, and ``volatile`` removes exactly that), so no parse or
    re-serialisation is needed: a copy whose bytes differ otherwise (even only in
    key order or spacing) is a CONFLICT, which is never processed either. Not a
    cryptographic hash: a body made to collide with the first copy's is a DUPLICATE
    instead of a CONFLICT, and neither is processed.
    """
    if volatile is not None:
        body = volatile.sub(b"", body)
    return RAW_FINGERPRINT + xxhash.xxh3_64_hexdigest(body)


def blake_fingerprint(body: bytes, volatile: re.Pattern[bytes] | None = None) -> str:
    """The previous version's fingerprint of the body's bytes (blake2b), to compare a copy with its entries."""
    if volatile is not None:
        body = volatile.sub(b"", body)
    return BLAKE_FINGERPRINT + hashlib.blake2b(body, digest_size=8).hexdigest()


def fingerprint_like(
    held: str | None,
    body: bytes,
    volatile: re.Pattern[bytes] | None,
    volatile_names: Iterable[str],
    event: Callable[[], Mapping[str, Any]],
) -> str:
    """The copy's fingerprint, of the kind ``held`` (the stored entry's, None for a new key) is."""
    if held is None or held.startswith(RAW_FINGERPRINT):
        return body_fingerprint(body, volatile)
    if held.startswith(BLAKE_FINGERPRINT):
        return blake_fingerprint(body, volatile)
    return normalised_fingerprint(event(), volatile_names)


def normalised_fingerprint(event: Mapping[str, Any], volatile: Iterable[str] = ()) -> str:
    """The fingerprint entries held before :func:`body_fingerprint`: the parsed event re-serialised with
    sorted keys, volatile fields left out. Still used to compare a copy with such an entry."""
    present = [name for name in volatile if name in event]
    kept: Mapping[str, Any] = event
    if present:
        copy = dict(event)
        for name in present:
            del copy[name]
        kept = copy
    return hashlib.blake2b(orjson.dumps(kept, option=orjson.OPT_SORT_KEYS), digest_size=8).hexdigest()

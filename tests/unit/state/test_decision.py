"""The dedupe decision: first sight claims a key, copies inside the TTL are duplicates."""

from __future__ import annotations

import hashlib
import re

import orjson
import pytest
import xxhash

from pipeline.state import decision
from pipeline.state.decision import Decision, Entry, Outcome, decide

TTL = 1_000


def _decide(
    existing: Entry | None,
    ts: int,
    *,
    sliding: bool = False,
    offset: int = 0,
    stream_time: int = 0,
    body_hash: str | None = None,
) -> Decision:
    return decide(
        existing,
        timestamp=ts,
        ttl_ms=TTL,
        sliding=sliding,
        partition=0,
        offset=offset,
        stream_time=stream_time,
        command="c",
        topic="t",
        body_hash=body_hash,
    )


def test_first_sight_claims_the_key_until_timestamp_plus_ttl() -> None:
    """An unseen key is FIRST and expires TTL after its record timestamp."""
    decision = _decide(None, 100, offset=7)
    assert decision.outcome is Outcome.FIRST
    assert decision.entry.expires_at == 1_100
    assert decision.entry.offset == 7


def test_a_copy_inside_the_ttl_is_a_duplicate_and_counted() -> None:
    """A copy before expiry is DUPLICATE; the count and last-seen time move, fixed expiry does not."""
    first = _decide(None, 100).entry
    decision = _decide(first, 900)
    assert decision.outcome is Outcome.DUPLICATE
    assert decision.entry.duplicates == 1
    assert decision.entry.last_seen == 900
    assert decision.entry.expires_at == 1_100


def test_a_copy_with_the_first_copys_body_counts_no_conflict() -> None:
    """A duplicate whose body fingerprint is the first copy's is DUPLICATE and leaves the conflict count at 0."""
    first = _decide(None, 100, body_hash="x:1").entry
    again = _decide(first, 200, offset=1, stream_time=100, body_hash="x:1")
    assert again.outcome is Outcome.DUPLICATE
    assert again.entry.conflicts == 0
    assert again.entry.duplicates == 1


def test_a_copy_at_or_after_expiry_is_processed_again() -> None:
    """At expires_at the key is forgotten: the copy is FIRST again and remembers the expired state."""
    first = _decide(None, 100).entry
    decision = _decide(first, 1_100)
    assert decision.outcome is Outcome.FIRST
    assert decision.previous == first
    assert decision.entry.expires_at == 2_100


def test_a_copy_older_than_stream_time_is_claimed_for_a_whole_ttl_from_stream_time() -> None:
    """A redriven or late copy, dated before stream time, claims its key until stream time + TTL, not until
    its own timestamp + TTL (which stream time may have passed: the claim would be dropped at once)."""
    decision = _decide(None, 100, stream_time=5_000)
    assert decision.outcome is Outcome.FIRST
    assert decision.entry.first_seen == 100
    assert decision.entry.expires_at == 6_000
    again = _decide(decision.entry, 100, stream_time=5_000)
    assert again.outcome is Outcome.DUPLICATE


def test_a_copy_newer_than_stream_time_is_claimed_from_its_own_timestamp() -> None:
    """A copy ahead of stream time claims until its own timestamp + TTL."""
    assert _decide(None, 7_000, stream_time=5_000).entry.expires_at == 8_000


def test_sliding_expiry_extends_from_the_latest_copy() -> None:
    """With sliding expiry a duplicate moves expires_at."""
    first = _decide(None, 100, sliding=True).entry
    decision = _decide(first, 900, sliding=True)
    assert decision.outcome is Outcome.DUPLICATE
    assert decision.entry.expires_at == 1_900


def test_an_out_of_order_copy_never_shortens_sliding_expiry() -> None:
    """A late record with an older timestamp leaves a sliding expiry where it was."""
    entry = Entry(first_seen=100, expires_at=1_900, partition=0, offset=0)
    decision = _decide(entry, 200, sliding=True)
    assert decision.entry.expires_at == 1_900


def test_entries_round_trip_through_their_encoding() -> None:
    """What is stored and sent to the changelog decodes to the same entry."""
    entry = Entry(1, 2, 3, 4, duplicates=5, last_seen=6, command="fulfil", topic="orders")
    assert Entry.decode(entry.encode()) == entry


def test_decisions_hold_every_field_by_name() -> None:
    """Each field of a decision and its entries is where its name says."""
    first = decide(
        None,
        timestamp=100,
        ttl_ms=TTL,
        sliding=False,
        partition=3,
        offset=7,
        stream_time=0,
        command="c",
        topic="t",
        body_hash="h",
    )
    assert first == decision.Decision(
        outcome=Outcome.FIRST,
        entry=Entry(
            first_seen=100,
            expires_at=1_100,
            partition=3,
            offset=7,
            last_seen=100,
            command="c",
            topic="t",
            body_hash="h",
        ),
        previous=None,
    )
    assert type(first) is decision.Decision
    assert type(first.entry) is Entry
    later = decide(
        first.entry,
        timestamp=200,
        ttl_ms=TTL,
        sliding=True,
        partition=0,
        offset=9,
        stream_time=100,
        body_hash="other",
    )
    assert later == decision.Decision(
        outcome=Outcome.CONFLICT,
        entry=first.entry._replace(duplicates=1, last_seen=200, expires_at=1_200, conflicts=1),
        previous=first.entry,
    )
    decoded = Entry.decode(later.entry.encode())
    assert decoded == later.entry
    assert type(decoded) is Entry


def test_decisions_are_deterministic() -> None:
    """The same inputs always give the same decision (replays agree)."""
    assert _decide(None, 5) == _decide(None, 5)


def test_a_copy_with_another_body_is_a_conflict_and_still_not_processed() -> None:
    """Same key, different body fingerprint inside the TTL: CONFLICT, counted, never a second FIRST."""
    first = decide(
        None, timestamp=1, ttl_ms=TTL, sliding=False, partition=0, offset=0, stream_time=0, body_hash="aa"
    ).entry
    decision = decide(
        first, timestamp=2, ttl_ms=TTL, sliding=False, partition=0, offset=1, stream_time=1, body_hash="bb"
    )
    assert decision.outcome is Outcome.CONFLICT
    assert decision.entry.conflicts == 1
    assert decision.entry.duplicates == 1
    same = decide(
        decision.entry,
        timestamp=3,
        ttl_ms=TTL,
        sliding=False,
        partition=0,
        offset=2,
        stream_time=2,
        body_hash="aa",
    )
    assert same.outcome is Outcome.DUPLICATE


def test_normalised_fingerprints_ignore_volatile_fields_and_key_order() -> None:
    """The older fingerprint: fields a provider changes per attempt, and key order, do not change it."""
    a = {"id": "evt_1", "pending_webhooks": 1, "data": {"x": 1, "y": 2}}
    b = {"data": {"y": 2, "x": 1}, "pending_webhooks": 3, "id": "evt_1"}
    assert decision.normalised_fingerprint(a, ["pending_webhooks"]) == decision.normalised_fingerprint(
        b, ["pending_webhooks"]
    )
    assert decision.normalised_fingerprint(a) != decision.normalised_fingerprint(b)


def _stripe_volatile() -> re.Pattern[bytes] | None:
    """Stripe's volatile field, compiled in the test (not at import: mutation testing must see the call)."""
    return decision.volatile_pattern(["pending_webhooks"])


@pytest.mark.parametrize(
    "retry",
    [
        b'{"id": "evt_1", "data": {"x": 1}, "pending_webhooks": 3, "type": "a.b"}',
        b'{"id": "evt_1", "data": {"x": 1}, "pending_webhooks":0, "type": "a.b"}',
        b'{"id": "evt_1", "data": {"x": 1}, "pending_webhooks" :  -2, "type": "a.b"}',
        b'{"id": "evt_1", "data": {"x": 1}, "pending_webhooks": null, "type": "a.b"}',
        b'{"id": "evt_1", "data": {"x": 1}, "pending_webhooks": "7", "type": "a.b"}',
    ],
)
def test_body_fingerprints_ignore_only_the_providers_volatile_field(retry: bytes) -> None:
    """A retry whose bytes differ only in the volatile field's value has the first copy's fingerprint."""
    first = b'{"id": "evt_1", "data": {"x": 1}, "pending_webhooks": 1, "type": "a.b"}'
    assert decision.body_fingerprint(retry, _stripe_volatile()) == decision.body_fingerprint(
        first, _stripe_volatile()
    )
    assert decision.body_fingerprint(retry) != decision.body_fingerprint(first)


@pytest.mark.parametrize(
    "other",
    [
        b'{"id": "evt_1", "data": {"x": 2}, "pending_webhooks": 1, "type": "a.b"}',  # another value
        b'{"id": "evt_1", "data": {"x": 1}, "pending_webhooks": 1, "type": "a.c"}',  # another type
        b'{"data": {"x": 1}, "id": "evt_1", "pending_webhooks": 1, "type": "a.b"}',  # re-serialised
    ],
)
def test_body_fingerprints_differ_for_any_other_change_in_the_bytes(other: bytes) -> None:
    """Any change outside the volatile field, re-serialisation included, gives another fingerprint."""
    first = b'{"id": "evt_1", "data": {"x": 1}, "pending_webhooks": 1, "type": "a.b"}'
    assert decision.body_fingerprint(other, _stripe_volatile()) != decision.body_fingerprint(
        first, _stripe_volatile()
    )


def test_body_fingerprints_are_marked_as_such() -> None:
    """Each kind of fingerprint is told apart by its prefix, so an older entry's kind is recognised."""
    assert decision.body_fingerprint(b"{}").startswith(decision.RAW_FINGERPRINT)
    assert decision.blake_fingerprint(b"{}").startswith(decision.BLAKE_FINGERPRINT)
    normalised = decision.normalised_fingerprint({})
    assert not normalised.startswith((decision.RAW_FINGERPRINT, decision.BLAKE_FINGERPRINT))


def test_the_previous_versions_fingerprint_is_blake2b_of_the_body_without_its_volatile_fields() -> None:
    """``blake_fingerprint`` still gives what entries written by the previous version hold."""
    body = b'{"id": "evt_1", "pending_webhooks": 3, "type": "a.b"}'
    expected = hashlib.blake2b(b'{"id": "evt_1", , "type": "a.b"}', digest_size=8).hexdigest()
    assert decision.blake_fingerprint(body, _stripe_volatile()) == decision.BLAKE_FINGERPRINT + expected


def test_the_oldest_fingerprint_is_blake2b_of_the_event_with_sorted_keys_without_its_volatile_fields() -> (
    None
):
    """``normalised_fingerprint`` still gives what entries written before body fingerprints hold, bit for bit."""
    event = {"type": "a.b", "pending_webhooks": 3, "id": "evt_1"}
    expected = hashlib.blake2b(b'{"id":"evt_1","type":"a.b"}', digest_size=8).hexdigest()
    assert decision.normalised_fingerprint(event, ["pending_webhooks"]) == expected


@pytest.mark.parametrize("kind", ["raw", "blake", "normalised"])
def test_a_copy_is_fingerprinted_by_the_kind_its_entry_holds(kind: str) -> None:
    """A retry matches the stored fingerprint of every kind; a changed body matches none."""
    first = b'{"id": "evt_1", "data": {"x": 1}, "pending_webhooks": 1}'
    retry = b'{"id": "evt_1", "data": {"x": 1}, "pending_webhooks": 4}'
    changed = b'{"id": "evt_1", "data": {"x": 2}, "pending_webhooks": 1}'
    names = ["pending_webhooks"]
    held = {
        "raw": decision.body_fingerprint(first, _stripe_volatile()),
        "blake": decision.blake_fingerprint(first, _stripe_volatile()),
        "normalised": decision.normalised_fingerprint(orjson.loads(first), names),
    }[kind]

    def like(body: bytes) -> str:
        return decision.fingerprint_like(held, body, _stripe_volatile(), names, lambda: orjson.loads(body))

    assert like(retry) == held
    assert like(changed) != held
    assert not decision.normalised_fingerprint({}).startswith(decision.RAW_FINGERPRINT)


def test_a_volatile_pattern_blanks_each_named_scalar_field_and_no_fields_give_none() -> None:
    """Each named field's ``"name": scalar`` is cut from the body, whatever its spacing; no names, no pattern."""
    pattern = decision.volatile_pattern(["pending_webhooks", "attempt"])
    assert pattern is not None
    body = b'{"id": "evt_1", "pending_webhooks" : 3, "attempt":"2", "type": "a.b"}'
    assert pattern.sub(b"", body) == b'{"id": "evt_1", , , "type": "a.b"}'
    assert decision.volatile_pattern([]) is None


def test_a_body_fingerprint_is_xxh3_of_the_body_without_its_volatile_fields() -> None:
    """Stored entries hold this fingerprint: it is xxh3 of the bytes with each volatile field cut out, nothing
    put in its place, so a worker of any version compares a copy with the same value."""
    body = b'{"id": "evt_1", "pending_webhooks": 3, "type": "a.b"}'
    expected = xxhash.xxh3_64_hexdigest(b'{"id": "evt_1", , "type": "a.b"}')
    assert decision.body_fingerprint(body, _stripe_volatile()) == decision.RAW_FINGERPRINT + expected


def test_an_entry_without_its_optional_fields_decodes_them_as_zero_or_none() -> None:
    """An entry written before duplicates, last_seen, conflicts and the rest were kept decodes them as 0 (counts
    and times) and None: an older store's claims read as unseen again and conflict-free."""
    entry = Entry.decode(b'{"f": 5, "x": 9, "p": 1, "o": 2}')
    assert entry == Entry(first_seen=5, expires_at=9, partition=1, offset=2)
    assert (entry.duplicates, entry.last_seen, entry.conflicts) == (0, 0, 0)

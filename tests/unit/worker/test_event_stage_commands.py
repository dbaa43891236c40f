"""The event stage's decisions over the default topology: the command and audit record of a first copy, what
duplicates, conflicts and re-claims are audited with, where records are placed, the clock-skew horizon, the
DLQ records of poison and of unusable headers, and how a failure while handling a record is reported."""

from __future__ import annotations

import dataclasses
import logging
import types
from collections.abc import Iterator

import orjson
import pytest

from pipeline.headers import RECEIVED_AT_HEADER, REPLAYED_FROM_HEADER, SOURCE_HEADER
from pipeline.kafka.partitioner import owner_partition
from pipeline.state.decision import Entry, Outcome, normalised_fingerprint
from pipeline.topology import Expiry
from pipeline.worker import event_stage as event_stage_module
from pipeline.worker.stage import HandlerFailedError, Poison

from .event_world import HORIZON, SHOP, WALL_S, build_event_world, shop_record
from .fakes import INPUT, PARTITIONS, T0, TOPICS, TOPOLOGY, body, keys_for, record

K = keys_for(0, 4)  # owned by input partition 0: never rerouted
DAY_MS = 86_400_000
TTL_MS = 7 * DAY_MS  # the default topology's stripe ttl
STRIPE = [(SOURCE_HEADER, b"stripe"), (RECEIVED_AT_HEADER, str(T0).encode())]
HOSTILE = [(SOURCE_HEADER, b"stripe"), (RECEIVED_AT_HEADER, b"100000000000000000000")]
LOGGER = "pipeline.worker.event_stage"


# -- a first copy ------------------------------------------------------------------------------------


async def test_a_first_copy_makes_one_command_with_every_field_and_is_audited_and_claimed() -> None:
    """The command (default name, the event key as effect key, the body embedded), its audit record, the
    claim naming command and topic, and the counts by source."""
    world = build_event_world(TOPOLOGY)
    await world.run([record(3, K[0])])
    (command,) = world.sent(TOPICS.commands)
    assert (command.partition, command.key, command.headers, command.timestamp) == (
        0,
        K[0].encode(),
        (),
        T0 + 3,
    )
    assert command.json() == {
        "command": "handle",
        "key": K[0],
        "effect_key": K[0],
        "source": "stripe",
        "event_type": "charge.succeeded",
        "received_at": T0 + 3,
        "event": orjson.loads(body(K[0])),
    }
    assert world.audit() == [
        {
            "key": K[0],
            "outcome": "first",
            "partition": 0,
            "offset": 3,
            "received_at": T0 + 3,
            "first_seen_at": T0 + 3,
            "source": "stripe",
            "event_type": "charge.succeeded",
            "expires_at": T0 + 3 + TTL_MS,
        }
    ]
    claim = world.store.entries[K[0].encode()]
    assert (claim.command, claim.topic, claim.expires_at) == ("handle", TOPICS.commands, T0 + 3 + TTL_MS)
    assert world.recorder.commands == [TOPICS.commands]
    assert world.recorder.outcomes == {("stripe", Outcome.FIRST): 1}


async def test_the_command_and_audit_of_an_event_are_placed_by_its_keys_murmur2_hash() -> None:
    """The stage hashes the event key once for its command and audit record: they land where murmur2 puts
    the key, whatever the outputs' partitioner would say (here: always the last partition)."""
    world = build_event_world(TOPOLOGY, partitioner=lambda _key, partitions: partitions - 1)
    await world.run([record(3, K[0])])
    placed = owner_partition(K[0].encode(), PARTITIONS)
    assert placed != PARTITIONS - 1
    assert [s.partition for s in world.sent(TOPICS.commands)] == [placed]
    assert [s.partition for s in world.sent(TOPICS.audit)] == [placed]


async def test_a_replayed_first_copy_is_audited_with_where_it_was_replayed_from() -> None:
    """A record redriven from the DLQ: its audit record says replayed_from, and its command is made."""
    world = build_event_world(TOPOLOGY)
    await world.run([record(3, K[0], headers=[*STRIPE, (REPLAYED_FROM_HEADER, b"webhooks.dlq:2:8")])])
    (audit,) = world.audit()
    assert (audit["outcome"], audit["replayed_from"]) == ("first", "webhooks.dlq:2:8")
    assert len(world.sent(TOPICS.commands)) == 1


# -- later copies ---------------------------------------------------------------------------------


async def test_a_duplicate_is_audited_with_the_first_copys_claim_and_makes_no_command() -> None:
    """A later copy: outcome duplicate, first_seen_at and expires_at of the claim, nothing more."""
    world = build_event_world(TOPOLOGY)
    await world.run([record(3, K[0])])
    await world.run([record(4, K[0])])
    assert world.audit()[1] == {
        "key": K[0],
        "outcome": "duplicate",
        "partition": 0,
        "offset": 4,
        "received_at": T0 + 4,
        "first_seen_at": T0 + 3,
        "source": "stripe",
        "event_type": "charge.succeeded",
        "expires_at": T0 + 3 + TTL_MS,
    }
    assert len(world.sent(TOPICS.commands)) == 1


async def test_a_key_claimed_again_after_its_claim_expired_is_audited_with_when_that_claim_expired() -> None:
    """The claim over an expired one: a new command, an audit record with previous_expired_at, and the store
    told which entry it replaces (so the copy in the old expiry bucket is removed)."""
    world = build_event_world(TOPOLOGY)
    expired = Entry(
        first_seen=T0 - 8 * DAY_MS, expires_at=T0 - DAY_MS, partition=0, offset=1, last_seen=T0 - DAY_MS
    )
    world.store.entries[K[0].encode()] = expired
    await world.run([record(3, K[0])])
    (audit,) = world.audit()
    assert (audit["outcome"], audit["first_seen_at"], audit["previous_expired_at"]) == (
        "first",
        T0 + 3,
        T0 - DAY_MS,
    )
    assert len(world.sent(TOPICS.commands)) == 1
    (change,) = world.store.changes
    assert (change.entry.first_seen, change.previous) == (T0 + 3, expired)


async def test_a_conflict_is_logged_as_a_warning_naming_the_first_copy_and_a_first_copy_is_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A copy whose body differs from the first's: one warning line, about that copy only."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    world = build_event_world(TOPOLOGY)
    await world.run([record(1, K[0]), record(2, K[0], value=body(K[0], pad=5))])
    assert [a["outcome"] for a in world.audit()] == ["first", "conflict"]
    assert [m for m in caplog.messages if "conflict" in m] == [
        f"{INPUT}-0 key={K[0]} offset=2 conflict: body differs from the first copy's (offset 1); not processed"
    ]


async def test_with_sliding_expiry_a_duplicate_moves_the_claims_expiry_to_its_own_time_plus_the_ttl() -> None:
    """A source with expiry = "sliding": each copy keeps the key claimed one TTL past itself."""
    stripe = dataclasses.replace(TOPOLOGY.sources["stripe"], expiry=Expiry.SLIDING)
    world = build_event_world(dataclasses.replace(TOPOLOGY, sources={**TOPOLOGY.sources, "stripe": stripe}))
    await world.run([record(1, K[0])])
    await world.run([record(2, K[0], timestamp=T0 + 1_000_000)])
    assert [(a["outcome"], a["expires_at"]) for a in world.audit()] == [
        ("first", T0 + 1 + TTL_MS),
        ("duplicate", T0 + 1_000_000 + TTL_MS),
    ]


async def test_a_key_of_a_provider_without_volatile_fields_held_with_an_older_fingerprint_is_compared() -> (
    None
):
    """A GitHub key stored with the parsed-event fingerprint of older versions: the same body again is a
    duplicate (no volatile field to leave out), not a failure."""
    key = next(
        f"github:d{i}" for i in range(100) if owner_partition(f"github:d{i}".encode(), PARTITIONS) == 0
    )
    event = orjson.dumps({"action": "opened", "number": 7})
    held = normalised_fingerprint(orjson.loads(event))
    world = build_event_world(TOPOLOGY)
    world.store.entries[key.encode()] = Entry(
        first_seen=T0, expires_at=T0 + TTL_MS, partition=0, offset=1, last_seen=T0, body_hash=held
    )
    github = [(SOURCE_HEADER, b"github"), (RECEIVED_AT_HEADER, str(T0 + 3).encode())]
    await world.run([record(3, key, value=event, headers=github)])
    assert [(a["key"], a["outcome"]) for a in world.audit()] == [(key, "duplicate")]


# -- time -----------------------------------------------------------------------------------------


async def test_a_record_dated_exactly_at_the_skew_bound_is_decided_at_its_time_and_one_ms_later_at_the_bound() -> (
    None
):
    """The bound is the clock plus max_skew_ms (an hour by default), inclusive: only the later record is
    counted as skewed, and both are claimed from the bound."""
    world = build_event_world(TOPOLOGY)
    await world.run([record(1, K[0], timestamp=HORIZON), record(2, K[1], timestamp=HORIZON + 1)])
    assert [a["first_seen_at"] for a in world.audit()] == [HORIZON, HORIZON]
    assert world.recorder.skews == 1


async def test_the_first_record_past_the_bound_is_logged_even_on_a_monotonic_clock_under_a_minute_old(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker started right after boot still says the first time it bounds a record's time."""
    monkeypatch.setattr(event_stage_module, "time", types.SimpleNamespace(monotonic=lambda: 0.0))
    caplog.set_level(logging.WARNING, logger=LOGGER)
    world = build_event_world(TOPOLOGY)
    await world.run([record(1, K[0], timestamp=HORIZON + 1)])
    assert [m for m in caplog.messages if "ahead of this clock" in m] == [
        (
            f"{INPUT}-0 key={K[0]} offset=1 is dated 3600s ahead of this clock; handled at the bound of 3600s "
            "(--max-clock-skew; such records are counted in pipeline_clock_skewed_records_total)"
        )
    ]


async def test_the_skew_bound_is_read_from_the_clock_anew_for_each_chunk_of_250_records() -> None:
    """The 251st record is in a second chunk: decided against the clock as it is then (an hour on), it is
    not past the bound and keeps its own time."""
    later = HORIZON + 60_000  # past the first chunk's bound, within the second's
    clock: Iterator[float] = iter([WALL_S, WALL_S + 3600.0])
    world = build_event_world(TOPOLOGY, wall=lambda: next(clock))
    await world.run([*(record(i, K[0]) for i in range(250)), record(250, K[1], timestamp=later)])
    assert world.audit()[-1]["first_seen_at"] == later
    assert world.recorder.skews == 0


async def test_each_decision_is_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    """With DEBUG on, a line per record: partition, key, offset and outcome."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    world = build_event_world(TOPOLOGY)
    await world.run([record(1, K[0])])
    assert f"{INPUT}-0 key={K[0]} offset=1 outcome=first" in caplog.messages


# -- the DLQ before classifying ---------------------------------------------------------------------


async def test_a_poison_record_goes_to_the_dlq_with_its_reason_audited_under_its_key_and_source() -> None:
    """An offset marked poison by an earlier attempt: DLQ and invalid audit with its reason, key and source."""
    world = build_event_world(TOPOLOGY)
    world.poison[1] = Poison("handler-error", "offset 1: ValueError('boom')")
    await world.run([record(1, K[0])])
    assert [(d["reason"], d["error"]) for d in world.dlq()] == [
        ("handler-error", "offset 1: ValueError('boom')")
    ]
    (audit,) = world.audit()
    assert {k: audit[k] for k in ("key", "outcome", "source", "reason")} == {
        "key": K[0],
        "outcome": "invalid",
        "source": "stripe",
        "reason": "handler-error",
    }
    assert world.sent(TOPICS.commands) == []


async def test_a_record_with_a_bad_timestamp_is_stamped_with_stream_time_and_one_with_a_bad_header_keeps_its_own() -> (
    None
):
    """A timestamp out of range never reaches an output (nor moves stream time): its DLQ and audit records
    carry stream time; a bad header's records keep the record's timestamp; both are audited with the source."""
    world = build_event_world(TOPOLOGY)
    await world.run([record(1, K[0])])  # stream time: T0 + 1
    await world.run([record(2, K[1], timestamp=-5, headers=STRIPE), record(3, K[2], headers=HOSTILE)])
    stamped = [(s.json()["reason"], s.timestamp) for s in world.sent(TOPICS.dlq)]
    assert stamped == [("bad-timestamp", T0 + 1), ("bad-header", T0 + 3)]
    audits = [
        (a["reason"], a["source"], s.timestamp)
        for a, s in zip(world.audit()[1:], world.sent(TOPICS.audit)[1:], strict=False)
    ]
    assert audits == [("bad-timestamp", "stripe", T0 + 1), ("bad-header", "stripe", T0 + 3)]
    assert world.txn.stream_time == T0 + 1


# -- failures ------------------------------------------------------------------------------------


async def test_a_record_whose_classifying_raises_is_named_by_offset_with_its_error_cut_to_500_characters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug in the classifier: HandlerFailedError naming the offset and the error's repr (500 characters at
    most), chained to it, so the redo can send that record to the DLQ alone."""
    failure = ValueError("x" * 600)

    def classify(_delivery: object) -> None:
        raise failure

    world = build_event_world(TOPOLOGY)
    monkeypatch.setattr(world.stage.classifier, "classify", classify)
    with pytest.raises(HandlerFailedError) as raised:
        await world.stage.handle([record(7, K[0])], {})
    assert (raised.value.offset, raised.value.error, raised.value.__cause__) == (
        7,
        repr(failure)[:500],
        failure,
    )
    assert len(raised.value.error) == 500


async def test_a_record_whose_handling_raises_is_named_by_offset_with_its_error_cut_to_500_characters() -> (
    None
):
    """A failure while deciding and emitting a record (here: placing its effects record) raises
    HandlerFailedError naming that record's offset and the error's repr (at most 500 characters), chained;
    the record's restamp flag does not outlive it."""
    failure = ValueError("x" * 600)

    def partitioner(key: bytes, partitions: int) -> int:
        if key == b"fulfil-order:boom":
            raise failure
        return owner_partition(key, partitions)

    world = build_event_world(SHOP, partitioner=partitioner)
    records = [
        shop_record(5, K[0], "checkout.session.completed", payment_intent="pi_1"),
        shop_record(6, K[1], "checkout.session.completed", payment_intent="boom"),
    ]
    with pytest.raises(HandlerFailedError) as raised:
        await world.stage.handle(records, {})
    assert (raised.value.offset, raised.value.error, raised.value.__cause__) == (
        6,
        repr(failure)[:500],
        failure,
    )
    assert len(raised.value.error) == 500
    assert world.txn.restamp is False

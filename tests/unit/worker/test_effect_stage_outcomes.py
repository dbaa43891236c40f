"""What the effect stage writes for an effects-topic record it handles: command, audit, claim, log line and counts."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from pipeline.headers import (
    ORIGINAL_TIMESTAMP_HEADER,
)
from pipeline.kafka.partitioner import owner_partition
from pipeline.state.decision import Entry
from pipeline.worker.poison import RESTAMP
from pipeline.worker.stage import HandlerFailedError, Poison

from .effect_world import (
    ABSENT,
    EFFECTS,
    HORIZON,
    ORDERS,
    PARTITIONS,
    T0,
    TOPICS,
    TTL,
    Make,
    command_of,
    effect,
    key_on,
)

# -- the first copy, and the next ------------------------------------------------------------------


async def test_the_first_copy_of_an_effect_key_is_forwarded_audited_claimed_logged_and_counted(
    effect_world: Make, caplog: pytest.LogCaptureFixture
) -> None:
    """The first copy goes to its command topic as it is, and its audit record, claim, log line and counts all
    name the effect key, the event key and the command."""
    world = await effect_world()
    key = key_on(0)
    record = effect(5, key)
    with caplog.at_level(logging.INFO, logger="pipeline.worker.effect_stage"):
        await world.run([record])
    [command] = world.sent(ORDERS)
    assert (command.partition, command.key, command.value, command.timestamp) == (
        owner_partition(key, PARTITIONS),
        key,
        record.value,
        T0 + 5,
    )
    [audit] = world.sent(TOPICS.audit)
    assert (audit.key, audit.partition) == (key, owner_partition(key, PARTITIONS))
    assert audit.json() == {
        "key": key.decode(),
        "outcome": "first",
        "partition": 0,
        "offset": 5,
        "received_at": T0 - 995,
        "first_seen_at": T0 + 5,
        "source": "stripe",
        "event_type": "checkout.session.completed",
        "expires_at": T0 + 5 + TTL,
        "stage": "effect",
        "event_key": "stripe:evt_5",
        "command": "fulfil-order",
    }
    claim = Entry(T0 + 5, T0 + 5 + TTL, 0, 5, last_seen=T0 + 5, command="fulfil-order", topic=ORDERS)
    assert world.store.get_many([key]) == {key: claim}
    assert world.recorder.outcomes == {("stripe", "effect-first"): 1}
    assert (world.recorder.commands, world.recorder.dlqs, world.recorder.skews) == ([ORDERS], [], 0)
    assert [r.getMessage() for r in caplog.records if r.name == "pipeline.worker.effect_stage"] == [
        f"{EFFECTS}-0 effect_key={key.decode()} key=stripe:evt_5 outcome=first"
    ]


async def test_a_second_copy_of_an_effect_key_in_the_same_batch_is_a_duplicate_and_not_forwarded(
    effect_world: Make,
) -> None:
    """Two copies of one effect key in one batch: the second sees the first's claim staged in the
    transaction, so one command leaves and the second is audited as a duplicate of the first."""
    world = await effect_world()
    key = key_on(0)
    await world.run([effect(5, key), effect(6, key)])
    assert [s.key for s in world.sent(ORDERS)] == [key]
    audit = world.audit()
    assert [(a["offset"], a["outcome"], a["first_seen_at"]) for a in audit] == [
        (5, "first", T0 + 5),
        (6, "duplicate", T0 + 5),
    ]
    assert world.recorder.outcomes == {("stripe", "effect-first"): 1, ("stripe", "effect-duplicate"): 1}
    assert world.recorder.commands == [ORDERS]


@pytest.mark.parametrize(
    ("received_at", "audited"),
    [
        (T0 - 1000, T0 - 1000),
        (0, 0),
        (2**62 - 1, 2**62 - 1),
        (2**62, T0 + 5),
        (-1, T0 + 5),
        (True, T0 + 5),
        ("1700000000000", T0 + 5),
        (ABSENT, T0 + 5),
    ],
)
async def test_the_audit_received_at_is_the_commands_when_it_is_a_sane_integer_else_the_record_timestamp(
    effect_world: Make, received_at: object, audited: int
) -> None:
    """The audit record's `received_at` is the command's own (when the ingress received the event), unless that
    is not an integer in [0, 2**62): then the effects record's timestamp."""
    world = await effect_world()
    value = orjson.dumps(command_of(5, received_at=received_at))
    await world.run([effect(5, key_on(0), value=value)])
    [audit] = world.audit()
    assert (audit["outcome"], audit["received_at"]) == ("first", audited)


async def test_absent_command_fields_are_audited_as_null_and_counted_under_no_source(
    effect_world: Make,
) -> None:
    """A command without source, event type, event key or command name is still deduped; its audit
    record says null for each, and it is counted under no source."""
    world = await effect_world()
    bare = {"received_at": T0}
    await world.run([effect(5, key_on(0), value=orjson.dumps(bare))])
    [audit] = world.audit()
    assert (audit["outcome"], audit["source"], audit["event_type"]) == ("first", None, None)
    assert (audit["event_key"], audit["command"]) == (None, None)
    assert world.recorder.outcomes == {(None, "effect-first"): 1}


async def test_command_fields_that_are_not_text_are_audited_as_text_cut_to_1000_characters(
    effect_world: Make,
) -> None:
    """A non-string source, event type, event key or command is audited (and counted) as its text, cut to 1000
    characters."""
    world = await effect_world()
    odd = command_of(5, source=42, event_type="t" * 1500, key=7, command=["fulfil"])
    await world.run([effect(5, key_on(0), value=orjson.dumps(odd))])
    [audit] = world.audit()
    assert (audit["outcome"], audit["source"], audit["event_type"]) == ("first", "42", "t" * 1000)
    assert (audit["event_key"], audit["command"]) == ("7", "['fulfil']")
    assert world.recorder.outcomes == {("42", "effect-first"): 1}


async def test_an_effect_key_that_is_not_utf8_is_claimed_and_placed_by_its_bytes_and_audited_as_text(
    effect_world: Make,
) -> None:
    """An effect key of bytes that are not UTF-8 is deduped by its exact bytes: its command and audit record
    carry them, and only the audit record's text shows them decoded with replacement characters."""
    world = await effect_world()
    key = key_on(0, prefix=b"fulfil-order:\xff")
    await world.run([effect(5, key), effect(6, key)])
    assert [s.key for s in world.sent(ORDERS)] == [key]
    audit = world.sent(TOPICS.audit)
    assert [(s.key, s.partition) for s in audit] == [(key, owner_partition(key, PARTITIONS))] * 2
    assert [(a["key"], a["outcome"]) for a in (s.json() for s in audit)] == [
        (key.decode("utf-8", "replace"), "first"),
        (key.decode("utf-8", "replace"), "duplicate"),
    ]


# -- time ------------------------------------------------------------------------------------------


async def test_a_record_dated_past_the_clock_plus_an_hour_is_handled_at_that_bound_and_counted(
    effect_world: Make,
) -> None:
    """With the default skew bound (an hour), a record dated exactly at the clock plus an hour is taken at its
    time; one a millisecond later is claimed as of the bound and counted as skewed, its command keeping its
    own timestamp."""
    world = await effect_world()
    at, past = key_on(0), key_on(0, start=1000)
    await world.run([effect(5, at, timestamp=HORIZON), effect(6, past, timestamp=HORIZON + 1)])
    audit = {a["offset"]: (a["outcome"], a["first_seen_at"], a["expires_at"]) for a in world.audit()}
    assert audit == {5: ("first", HORIZON, HORIZON + TTL), 6: ("first", HORIZON, HORIZON + TTL)}
    assert [s.timestamp for s in world.sent(ORDERS)] == [HORIZON, HORIZON + 1]
    assert world.recorder.skews == 1


async def test_a_record_with_a_bad_timestamp_is_dead_lettered_at_stream_time_without_moving_it(
    effect_world: Make,
) -> None:
    """A record whose timestamp is out of range goes to the DLQ (bad-timestamp) dated at the partition's stream
    time, so it can neither move stream time nor expire anyone's claim."""
    world = await effect_world()
    await world.run([effect(5, key_on(0)), effect(6, key_on(0, start=1000), timestamp=-1)])
    [dead] = world.dlq()
    assert (dead["reason"], dead["offset"], dead["timestamp"]) == ("bad-timestamp", 6, T0 + 5)
    assert [s.timestamp for s in world.sent(TOPICS.dlq)] == [T0 + 5]
    assert world.txn.stream_time == T0 + 5


# -- poison ------------------------------------------------------------------------------------------


async def test_a_poison_record_is_dead_lettered_with_the_handlers_error_and_its_neighbours_handled(
    effect_world: Make,
) -> None:
    """A record handed back as poison (its handling raised) goes to the DLQ with the reason and error it was
    marked with, unclaimed; the records around it are handled as usual."""
    world = await effect_world()
    first, poisoned = key_on(0), key_on(0, start=1000)
    poison = {6: Poison("handler-error", "offset 6: ValueError('boom')")}
    await world.run([effect(5, first), effect(6, poisoned), effect(7, poisoned)], poison)
    [dead] = world.dlq()
    assert (dead["reason"], dead["error"], dead["offset"]) == (
        "handler-error",
        "offset 6: ValueError('boom')",
        6,
    )
    audit = {a["offset"]: (a["outcome"], a["key"], a["source"]) for a in world.audit()}
    assert audit == {
        5: ("first", first.decode(), "stripe"),
        6: ("invalid", poisoned.decode(), "stripe"),
        7: ("first", poisoned.decode(), "stripe"),
    }
    assert [s.key for s in world.sent(ORDERS)] == [first, poisoned]


async def test_a_record_marked_restamp_is_handled_with_its_outputs_stamped_now_and_only_its_own(
    effect_world: Make,
) -> None:
    """A record whose outputs the broker refused for their timestamp is handled again (not dead-lettered) with
    its command and audit record stamped with the current time, the original kept in a header; the next
    record's outputs keep their own time, and the part is left unstamped."""
    world = await effect_world()
    marked, plain = key_on(0), key_on(0, start=1000)
    poison = {5: Poison(RESTAMP, "refused for its timestamp", restamp=True)}
    await world.stage.handle([effect(5, marked), effect(6, plain)], poison)
    assert world.txn.restamp is False
    await world.txn.txn.commit()
    assert world.dlq() == []
    for topic in (ORDERS, TOPICS.audit):
        stamped = [dict(s.headers).get(ORIGINAL_TIMESTAMP_HEADER) for s in world.sent(topic)]
        assert stamped == [str(T0 + 5).encode(), None]
    assert [a["outcome"] for a in world.audit()] == ["first", "first"]


async def test_a_record_whose_handling_raises_is_named_by_offset_with_its_error_cut_to_500_characters(
    effect_world: Make,
) -> None:
    """When handling a record raises, the stage raises HandlerFailedError naming its offset and the error's
    repr (at most 500 characters), chained to the error, so the redo can send that record to the DLQ alone."""
    failure = ValueError("x" * 600)

    def partitioner(key: bytes, partitions: int) -> int:
        if key == b"boom":
            raise failure
        return owner_partition(key, partitions)

    world = await effect_world(partitioner=partitioner)
    with pytest.raises(HandlerFailedError) as raised:
        await world.stage.handle([effect(5, key_on(0)), effect(6, b"boom")], {})
    assert (raised.value.offset, raised.value.error) == (6, repr(failure)[:500])
    assert len(raised.value.error) == 500
    assert raised.value.__cause__ is failure
    assert world.txn.restamp is False


# -- chunks ----------------------------------------------------------------------------------------


async def test_a_batch_is_handled_250_records_at_a_time_with_the_loop_getting_a_turn_between(
    effect_world: Make,
) -> None:
    """By default the stage handles 250 records, then lets the loop run before the next chunk."""
    world = await effect_world()
    key = key_on(0)
    handling = asyncio.create_task(world.stage.handle([effect(i, key) for i in range(251)], {}))
    await asyncio.sleep(0)
    assert world.txn.next_offset == 250
    await handling
    assert world.txn.next_offset == 251

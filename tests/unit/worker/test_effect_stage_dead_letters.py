"""What the effect stage writes for an effects-topic record it dead-letters: the DLQ record, its audit and counts."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from pipeline.headers import (
    RECEIVED_AT_HEADER,
    REPLAYED_FROM_HEADER,
)
from pipeline.kafka.partitioner import owner_partition
from pipeline.kafka.record_size import RECORD_OVERHEAD
from pipeline.worker.effect_stage import MAX_EFFECT_TTL_MS

from .effect_world import (
    ABSENT,
    EFFECTS,
    ORDERS,
    PARTITIONS,
    T0,
    TOPICS,
    Make,
    command_of,
    effect,
    key_on,
)

# -- records that cannot be handled ------------------------------------------------------------------

NO_FIELDS = "an effects-topic record without key, command JSON or command topic"
LONG_TOPIC = "shop." + "t" * 300


def _ttl_error(ttl: str) -> str:
    """The DLQ error of an effects record whose TTL header is ``ttl``."""
    return f"effect TTL {ttl!r} is not a number of ms in range"


@pytest.mark.parametrize(
    ("changes", "reason", "error"),
    [
        ({"key": None}, "bad-effect-record", NO_FIELDS),
        ({"key": b""}, "bad-effect-record", NO_FIELDS),
        ({"value": b"not json"}, "bad-effect-record", NO_FIELDS),
        ({"value": b"[1, 2]"}, "bad-effect-record", NO_FIELDS),
        ({"topic": None}, "bad-effect-record", NO_FIELDS),
        ({"topic": b""}, "bad-effect-record", NO_FIELDS),
        ({"ttl": None}, "bad-effect-record", _ttl_error("")),
        ({"ttl": b"0"}, "bad-effect-record", _ttl_error("0")),
        ({"ttl": b"-5"}, "bad-effect-record", _ttl_error("-5")),
        ({"ttl": b"30d"}, "bad-effect-record", _ttl_error("30d")),
        (
            {"ttl": str(MAX_EFFECT_TTL_MS + 1).encode()},
            "bad-effect-record",
            _ttl_error(str(MAX_EFFECT_TTL_MS + 1)),
        ),
        ({"ttl": "٣٠٠٠".encode()}, "bad-effect-record", _ttl_error("٣٠٠٠")),
        ({"ttl": b"0000000000000001"}, "bad-effect-record", _ttl_error("0000000000000001")),
        ({"ttl": b"1" * 50}, "bad-effect-record", _ttl_error("1" * 40)),
        (
            {"topic": b"shop.nowhere"},
            "unknown-command-topic",
            "command topic 'shop.nowhere' is not one of the topology's",
        ),
        (
            {"topic": LONG_TOPIC.encode()},
            "unknown-command-topic",
            f"command topic {LONG_TOPIC[:200]!r} is not one of the topology's",
        ),
        (
            {"extra_headers": [(RECEIVED_AT_HEADER, b"yesterday")]},
            "bad-header",
            "header 'received-at' is not ms between 2000 and 2200: b'yesterday'",
        ),
    ],
    ids=[
        "no-key",
        "empty-key",
        "unparseable-command",
        "command-not-an-object",
        "no-command-topic",
        "empty-command-topic",
        "no-ttl",
        "zero-ttl",
        "negative-ttl",
        "ttl-not-digits",
        "ttl-over-ten-years",
        "ttl-non-ascii-digits",
        "ttl-over-15-digits",
        "ttl-shown-cut-to-40",
        "unknown-command-topic",
        "unknown-topic-shown-cut-to-200",
        "bad-received-at-header",
    ],
)
async def test_an_effects_record_that_cannot_be_handled_is_dead_lettered_with_its_reason_and_never_claimed(
    effect_world: Make, changes: dict[str, Any], reason: str, error: str
) -> None:
    """A record without key, command JSON, command topic or a TTL in (0, ten years] of at most 15 digits, or
    naming a command topic the topology lacks, or with a bad header, goes to the DLQ with its reason; its
    audit record is `invalid` (stage `effect`), nothing is forwarded or claimed, and it is counted."""
    world = await effect_world()
    fields: dict[str, Any] = {"key": key_on(0), **changes}
    key = fields.pop("key")
    await world.run([effect(5, key, **fields)])
    [dead] = world.dlq()
    text_key = key.decode() if key is not None else None
    assert (dead["reason"], dead["error"]) == (reason, error)
    assert (dead["topic"], dead["partition"], dead["offset"], dead["timestamp"], dead["key"]) == (
        EFFECTS,
        0,
        5,
        T0 + 5,
        text_key,
    )
    readable = fields.get("value") is None
    assert world.audit() == [
        {
            "key": text_key or None,
            "outcome": "invalid",
            "partition": 0,
            "offset": 5,
            "received_at": T0 + 5,
            "first_seen_at": None,
            "source": "stripe" if readable else None,
            "event_type": None,
            "expires_at": None,
            "reason": reason,
            "stage": "effect",
        }
    ]
    assert world.sent(ORDERS) == []
    assert world.store.get_many([key_on(0)]) == {}
    assert world.recorder.outcomes == {(None, "effect-invalid"): 1}
    assert (world.recorder.dlqs, world.recorder.commands) == ([reason], [])
    assert world.producer.committed_offset() == 6  # handled: the partition moves on


@pytest.mark.parametrize("ttl", [1, MAX_EFFECT_TTL_MS, "000000000000001"])
async def test_an_effect_ttl_at_either_end_of_its_range_is_taken(effect_world: Make, ttl: int | str) -> None:
    """A TTL of 1 ms, of exactly ten years, or of 15 digits with leading zeros is a TTL: the claim lives that long."""
    world = await effect_world()
    await world.run([effect(5, key_on(0), ttl=str(ttl).encode())])
    [audit] = world.audit()
    assert (audit["outcome"], audit["expires_at"]) == ("first", T0 + 5 + int(ttl))


async def test_a_dead_lettered_record_keeps_a_string_source_only_and_names_where_it_was_redriven_from(
    effect_world: Make,
) -> None:
    """The audit record of an effects record sent to the DLQ names the command's source only when it is a string,
    and a redriven record's `replayed_from`."""
    world = await effect_world()
    redriven = [(REPLAYED_FROM_HEADER, b"shop.dlq:0:7")]
    numeric = orjson.dumps(command_of(6, source=42))
    await world.run(
        [
            effect(5, key_on(0), ttl=b"x", extra_headers=redriven),
            effect(6, key_on(0), ttl=b"x", value=numeric),
        ]
    )
    audit = world.audit()
    assert [(a["offset"], a["source"], a.get("replayed_from")) for a in audit] == [
        (5, "stripe", "shop.dlq:0:7"),
        (6, None, None),
    ]


# -- too large -------------------------------------------------------------------------------------


async def test_a_command_too_large_for_its_command_topic_is_dead_lettered_unclaimed(
    effect_world: Make,
) -> None:
    """A first copy whose command (key and value) would be one byte over its command topic's limit goes to the
    DLQ (too-large) with its effect key and source, its key unclaimed so a replay later gives the effect."""
    key = key_on(0)
    record = effect(5, key, extra_headers=[(REPLAYED_FROM_HEADER, b"shop.dlq:0:7")])
    limit = RECORD_OVERHEAD + len(record.value) + len(key) - 1
    world = await effect_world(limits={ORDERS: limit})
    await world.run([record])
    [dead] = world.dlq()
    error = f"a command of {len(record.value)} bytes is larger than {ORDERS} takes"
    assert (dead["reason"], dead["error"], dead["offset"], dead["key"]) == (
        "too-large",
        error,
        5,
        key.decode(),
    )
    assert world.audit() == [
        {
            "key": key.decode(),
            "outcome": "invalid",
            "partition": 0,
            "offset": 5,
            "received_at": T0 + 5,
            "first_seen_at": None,
            "source": "stripe",
            "event_type": None,
            "expires_at": None,
            "reason": "too-large",
            "stage": "effect",
            "replayed_from": "shop.dlq:0:7",
        }
    ]
    assert world.sent(ORDERS) == []
    assert world.store.get_many([key]) == {}
    assert (world.recorder.dlqs, world.recorder.commands) == (["too-large"], [])


async def test_a_command_that_just_fits_its_command_topic_is_forwarded(effect_world: Make) -> None:
    """A command exactly at its command topic's limit (key included) is forwarded."""
    key = key_on(0)
    record = effect(5, key)
    world = await effect_world(limits={ORDERS: RECORD_OVERHEAD + len(record.value) + len(key)})
    await world.run([record])
    assert [s.key for s in world.sent(ORDERS)] == [key]
    assert world.dlq() == []


async def test_a_command_too_large_for_its_command_topic_is_counted_as_an_invalid_effect(
    effect_world: Make,
) -> None:
    """Every effects record is counted in the effect outcomes, as every input record is in the event outcomes:
    one dead-lettered because its command is too large is an invalid one."""
    key = key_on(0)
    record = effect(5, key)
    world = await effect_world(limits={ORDERS: RECORD_OVERHEAD + len(record.value)})
    await world.run([record])
    assert [d["reason"] for d in world.dlq()] == ["too-large"]
    assert sum(world.recorder.outcomes.values()) == 1


async def test_a_command_too_large_without_a_source_is_audited_with_no_source(effect_world: Make) -> None:
    """A command without a source that is too large for its command topic is audited with a null source, as every
    other effect-stage audit record of a command without one is, not the text 'None'."""
    key = key_on(0)
    record = effect(5, key, value=orjson.dumps(command_of(5, source=ABSENT)))
    world = await effect_world(limits={ORDERS: RECORD_OVERHEAD + len(record.value)})
    await world.run([record])
    [audit] = world.audit()
    assert (audit["reason"], audit["source"]) == ("too-large", None)


# -- rerouted ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "shown"), [("stripe", "stripe"), (ABSENT, None), (7, "7")])
async def test_a_rerouted_record_is_audited_and_counted_with_its_source_and_destination(
    effect_world: Make, source: object, shown: str | None
) -> None:
    """A record on a partition its effect key does not hash to is moved to the owner, audited as `rerouted`
    (stage `effect`, `to_partition`, its source as text) and counted under that source."""
    world = await effect_world()
    theirs = key_on(2)
    value = orjson.dumps(command_of(6, source=source))
    await world.run([effect(6, theirs, value=value, extra_headers=[(REPLAYED_FROM_HEADER, b"shop.dlq:0:7")])])
    assert [(s.partition, s.key, s.value) for s in world.sent(EFFECTS)] == [(2, theirs, value)]
    [audit] = world.sent(TOPICS.audit)
    assert (audit.key, audit.partition) == (theirs, owner_partition(theirs, PARTITIONS))
    assert audit.json() == {
        "key": theirs.decode(),
        "outcome": "rerouted",
        "partition": 0,
        "offset": 6,
        "received_at": T0 + 6,
        "first_seen_at": None,
        "source": shown,
        "event_type": None,
        "expires_at": None,
        "stage": "effect",
        "to_partition": 2,
        "replayed_from": "shop.dlq:0:7",
    }
    assert world.recorder.outcomes == {(shown, "effect-rerouted"): 1}
    assert world.sent(ORDERS) == []


async def test_a_rerouted_copy_too_large_for_the_effects_topic_is_dead_lettered(effect_world: Make) -> None:
    """A record to reroute whose copy the effects topic no longer takes (its limit was lowered) goes to the DLQ
    (too-large) with its effect key and source, and nothing is moved."""
    world = await effect_world(limits={EFFECTS: 300})
    theirs = key_on(2)
    record = effect(6, theirs)
    await world.run([record])
    [dead] = world.dlq()
    moved = f"a record of {len(record.value)} bytes is larger than {EFFECTS} takes (300 bytes)"
    assert (dead["reason"], dead["error"], dead["offset"]) == ("too-large", f"its rerouted copy: {moved}", 6)
    [audit] = world.audit()
    assert (audit["outcome"], audit["reason"], audit["key"], audit["source"]) == (
        "invalid",
        "too-large",
        theirs.decode(),
        "stripe",
    )
    assert world.sent(EFFECTS) == []
    assert world.recorder.dlqs == ["too-large"]


async def test_a_rerouted_copy_too_large_is_audited_and_counted_as_an_effect_stage_record(
    effect_world: Make,
) -> None:
    """The audit record of an effects record dead-lettered because its rerouted copy is too large says
    `stage: effect` and where it was redriven from, as every other effect-stage audit record does, and it
    is counted as an invalid effect."""
    world = await effect_world(limits={EFFECTS: 300})
    await world.run([effect(6, key_on(2), extra_headers=[(REPLAYED_FROM_HEADER, b"shop.dlq:0:7")])])
    [audit] = world.audit()
    assert (audit["stage"], audit["replayed_from"]) == ("effect", "shop.dlq:0:7")
    assert world.recorder.outcomes == {("stripe", "effect-invalid"): 1}

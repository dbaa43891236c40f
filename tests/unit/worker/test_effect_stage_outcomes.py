"""What the effect stage writes for each effects-topic record: command, audit, DLQ record, claim and counts."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from pipeline import topology as topology_module
from pipeline.headers import (
    COMMAND_TOPIC_HEADER,
    EFFECT_TTL_HEADER,
    ORIGINAL_TIMESTAMP_HEADER,
    RECEIVED_AT_HEADER,
    REPLAYED_FROM_HEADER,
)
from pipeline.kafka.partitioner import KeyPartitioner, owner_partition
from pipeline.kafka.record_size import RECORD_OVERHEAD
from pipeline.state.decision import Entry
from pipeline.state.partition_transaction import PartitionTransaction
from pipeline.state.store import Change
from pipeline.worker.effect_stage import MAX_EFFECT_TTL_MS, EffectStage
from pipeline.worker.emitter import OutputTopics
from pipeline.worker.poison import RESTAMP
from pipeline.worker.stage import HandlerFailedError, Poison

from .fakes import ROOT, FakeProducer, Sent, part_transaction

TOPOLOGY = topology_module.load(ROOT / "topologies" / "stripe-fulfilment.toml")
TOPICS = TOPOLOGY.topics
EFFECTS = TOPICS.effects
PARTITIONS = 4
T0 = 1_700_000_000_000  # record timestamps (ms)
WALL_S = 1_700_000_010.0  # the stage's clock: ten seconds after T0
HORIZON = 1_700_000_010_000 + 3_600_000  # the clock plus the default max skew
TTL = 2_592_000_000  # 30 days, the route's effect_ttl
ORDERS = "shop.orders"


def key_on(partition: int, *, prefix: bytes = b"fulfil-order:pi_", start: int = 0) -> bytes:
    """An effect key murmur2 places on effects ``partition``."""
    i = start
    while owner_partition(prefix + str(i).encode(), PARTITIONS) != partition:
        i += 1
    return prefix + str(i).encode()


def command_of(offset: int, **fields: Any) -> dict[str, Any]:
    """The command JSON the event stage writes for event ``stripe:evt_<offset>`` (``fields`` override)."""
    command: dict[str, Any] = {
        "command": "fulfil-order",
        "key": f"stripe:evt_{offset}",
        "effect_key": "ignored",
        "source": "stripe",
        "event_type": "checkout.session.completed",
        "received_at": T0 - 1000 + offset,
        "event": {"id": f"evt_{offset}"},
    }
    command.update(fields)
    return {name: value for name, value in command.items() if value is not _ABSENT}


_ABSENT: Any = object()  # a field left out of a command


def effect(
    offset: int,
    key: bytes | None,
    *,
    partition: int = 0,
    value: bytes | None = None,
    ttl: bytes | None = str(TTL).encode(),
    topic: bytes | None = ORDERS.encode(),
    extra_headers: list[tuple[str, bytes]] | None = None,
    timestamp: int | None = None,
) -> ConsumerRecord[bytes, bytes]:
    """An effects-topic record as the event stage writes it (``None`` leaves a header out)."""
    body = orjson.dumps(command_of(offset)) if value is None else value
    headers = [(EFFECT_TTL_HEADER, ttl), (COMMAND_TOPIC_HEADER, topic), *(extra_headers or [])]
    kept = [(name, raw) for name, raw in headers if raw is not None]
    return ConsumerRecord(
        topic=EFFECTS,
        partition=partition,
        offset=offset,
        timestamp=T0 + offset if timestamp is None else timestamp,
        timestamp_type=0,
        key=key,
        value=body,
        checksum=None,
        serialized_key_size=len(key) if key else -1,
        serialized_value_size=len(body),
        headers=kept,
    )


@dataclass
class Recorded:
    """A recorder that keeps every count it is given."""

    outcomes: Counter[tuple[str | None, str]] = field(default_factory=Counter)
    commands: list[str] = field(default_factory=list)
    dlqs: list[str] = field(default_factory=list)
    skews: int = 0

    def outcome(self, source: str | None, outcome: str, count: int = 1) -> None:
        """Count an outcome."""
        self.outcomes[(source, outcome)] += count

    def command(self, topic: str, count: int = 1) -> None:
        """Note a command."""
        self.commands.extend([topic] * count)

    def dlq(self, reason: str, count: int = 1) -> None:
        """Note a DLQ record."""
        self.dlqs.extend([reason] * count)

    def skewed(self, count: int = 1) -> None:
        """Count a record dated past the skew bound."""
        self.skews += count


class MemoryStore:
    """A partition's seen-set in a dict, as the store holds it after each commit (no RocksDB: fast)."""

    def __init__(self) -> None:
        self.entries: dict[bytes, Entry] = {}
        self.stream_time = 0

    def get_many(self, keys: list[bytes]) -> dict[bytes, Entry]:
        """The entries of ``keys`` held."""
        return {key: self.entries[key] for key in keys if key in self.entries}

    def write(
        self, changes: Mapping[bytes, Change], *, changelog_offset: int | None, stream_time: int
    ) -> None:
        """Apply a committed part's changes."""
        self.entries.update({key: change.entry for key, change in changes.items()})
        self.stream_time = max(self.stream_time, stream_time)

    def expire(self) -> int:
        """Nothing expires here."""
        return 0


@dataclass
class World:
    """Effects partition 0's stage over a fake producer's transaction and a real store."""

    stage: EffectStage
    txn: PartitionTransaction
    producer: FakeProducer
    store: MemoryStore
    recorder: Recorded

    async def run(
        self, records: list[ConsumerRecord[bytes, bytes]], poison: dict[int, Poison] | None = None
    ) -> None:
        """Handle ``records`` and commit."""
        await self.stage.handle(records, poison or {})
        await self.txn.txn.commit()

    def sent(self, topic: str) -> list[Sent]:
        """The committed records of ``topic``."""
        return self.producer.committed_to(topic)

    def audit(self) -> list[dict[str, Any]]:
        """The committed audit records, as JSON."""
        return [s.json() for s in self.sent(TOPICS.audit)]

    def dlq(self) -> list[dict[str, Any]]:
        """The committed DLQ records, as JSON."""
        return [s.json() for s in self.sent(TOPICS.dlq)]


Make = Callable[..., Awaitable[World]]


@pytest.fixture
def make() -> Make:
    """Build effects partition 0's stage: ``limits`` override 4 MiB, ``partitioner`` murmur2, the rest go to the stage."""

    async def build(
        *,
        limits: dict[str, int] | None = None,
        partitioner: Callable[[bytes, int], int] | None = None,
        **kwargs: Any,
    ) -> World:
        names = [*TOPOLOGY.command_topics(), EFFECTS, TOPICS.effects_changelog, TOPICS.audit, TOPICS.dlq]
        all_limits = {**dict.fromkeys(names, 1 << 22), **(limits or {})}
        outputs = OutputTopics(dict.fromkeys(names, PARTITIONS), partitioner or KeyPartitioner(), all_limits)
        store = MemoryStore()
        producer = FakeProducer("effects-0")
        txn = part_transaction(
            producer,
            TopicPartition(EFFECTS, 0),
            store=store,
            changelog=TopicPartition(TOPICS.effects_changelog, 0),
            limits=outputs.limits,
        )
        recorder = Recorded()
        stage = EffectStage(
            tp=TopicPartition(EFFECTS, 0),
            topology=TOPOLOGY,
            txn=txn,
            outputs=outputs,
            recorder=recorder,
            wall=lambda: WALL_S,
            **kwargs,
        )
        return World(stage, txn, producer, store, recorder)

    return build


# -- the first copy, and the next ------------------------------------------------------------------


async def test_the_first_copy_of_an_effect_key_is_forwarded_audited_claimed_logged_and_counted(
    make: Make, caplog: pytest.LogCaptureFixture
) -> None:
    """The first copy goes to its command topic as it is, and its audit record, claim, log line and counts all
    name the effect key, the event key and the command."""
    world = await make()
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
    make: Make,
) -> None:
    """Two copies of one effect key in one batch: the second sees the first's claim staged in the
    transaction, so one command leaves and the second is audited as a duplicate of the first."""
    world = await make()
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
        (_ABSENT, T0 + 5),
    ],
)
async def test_the_audit_received_at_is_the_commands_when_it_is_a_sane_integer_else_the_record_timestamp(
    make: Make, received_at: object, audited: int
) -> None:
    """The audit record's `received_at` is the command's own (when the ingress received the event), unless that
    is not an integer in [0, 2**62): then the effects record's timestamp."""
    world = await make()
    value = orjson.dumps(command_of(5, received_at=received_at))
    await world.run([effect(5, key_on(0), value=value)])
    [audit] = world.audit()
    assert (audit["outcome"], audit["received_at"]) == ("first", audited)


async def test_absent_command_fields_are_audited_as_null_and_counted_under_no_source(make: Make) -> None:
    """A command without source, event type, event key or command name is still deduped; its audit
    record says null for each, and it is counted under no source."""
    world = await make()
    bare = {"received_at": T0}
    await world.run([effect(5, key_on(0), value=orjson.dumps(bare))])
    [audit] = world.audit()
    assert (audit["outcome"], audit["source"], audit["event_type"]) == ("first", None, None)
    assert (audit["event_key"], audit["command"]) == (None, None)
    assert world.recorder.outcomes == {(None, "effect-first"): 1}


async def test_command_fields_that_are_not_text_are_audited_as_text_cut_to_1000_characters(
    make: Make,
) -> None:
    """A non-string source, event type, event key or command is audited (and counted) as its text, cut to 1000
    characters."""
    world = await make()
    odd = command_of(5, source=42, event_type="t" * 1500, key=7, command=["fulfil"])
    await world.run([effect(5, key_on(0), value=orjson.dumps(odd))])
    [audit] = world.audit()
    assert (audit["outcome"], audit["source"], audit["event_type"]) == ("first", "42", "t" * 1000)
    assert (audit["event_key"], audit["command"]) == ("7", "['fulfil']")
    assert world.recorder.outcomes == {("42", "effect-first"): 1}


async def test_an_effect_key_that_is_not_utf8_is_claimed_and_placed_by_its_bytes_and_audited_as_text(
    make: Make,
) -> None:
    """An effect key of bytes that are not UTF-8 is deduped by its exact bytes: its command and audit record
    carry them, and only the audit record's text shows them decoded with replacement characters."""
    world = await make()
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
    make: Make,
) -> None:
    """With the default skew bound (an hour), a record dated exactly at the clock plus an hour is taken at its
    time; one a millisecond later is claimed as of the bound and counted as skewed, its command keeping its
    own timestamp."""
    world = await make()
    at, past = key_on(0), key_on(0, start=1000)
    await world.run([effect(5, at, timestamp=HORIZON), effect(6, past, timestamp=HORIZON + 1)])
    audit = {a["offset"]: (a["outcome"], a["first_seen_at"], a["expires_at"]) for a in world.audit()}
    assert audit == {5: ("first", HORIZON, HORIZON + TTL), 6: ("first", HORIZON, HORIZON + TTL)}
    assert [s.timestamp for s in world.sent(ORDERS)] == [HORIZON, HORIZON + 1]
    assert world.recorder.skews == 1


async def test_a_record_with_a_bad_timestamp_is_dead_lettered_at_stream_time_without_moving_it(
    make: Make,
) -> None:
    """A record whose timestamp is out of range goes to the DLQ (bad-timestamp) dated at the partition's stream
    time, so it can neither move stream time nor expire anyone's claim."""
    world = await make()
    await world.run([effect(5, key_on(0)), effect(6, key_on(0, start=1000), timestamp=-1)])
    [dead] = world.dlq()
    assert (dead["reason"], dead["offset"], dead["timestamp"]) == ("bad-timestamp", 6, T0 + 5)
    assert [s.timestamp for s in world.sent(TOPICS.dlq)] == [T0 + 5]
    assert world.txn.stream_time == T0 + 5


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
    make: Make, changes: dict[str, Any], reason: str, error: str
) -> None:
    """A record without key, command JSON, command topic or a TTL in (0, ten years] of at most 15 digits, or
    naming a command topic the topology lacks, or with a bad header, goes to the DLQ with its reason; its
    audit record is `invalid` (stage `effect`), nothing is forwarded or claimed, and it is counted."""
    world = await make()
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
async def test_an_effect_ttl_at_either_end_of_its_range_is_taken(make: Make, ttl: int | str) -> None:
    """A TTL of 1 ms, of exactly ten years, or of 15 digits with leading zeros is a TTL: the claim lives that long."""
    world = await make()
    await world.run([effect(5, key_on(0), ttl=str(ttl).encode())])
    [audit] = world.audit()
    assert (audit["outcome"], audit["expires_at"]) == ("first", T0 + 5 + int(ttl))


async def test_a_dead_lettered_record_keeps_a_string_source_only_and_names_where_it_was_redriven_from(
    make: Make,
) -> None:
    """The audit record of an effects record sent to the DLQ names the command's source only when it is a string,
    and a redriven record's `replayed_from`."""
    world = await make()
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


# -- poison ------------------------------------------------------------------------------------------


async def test_a_poison_record_is_dead_lettered_with_the_handlers_error_and_its_neighbours_handled(
    make: Make,
) -> None:
    """A record handed back as poison (its handling raised) goes to the DLQ with the reason and error it was
    marked with, unclaimed; the records around it are handled as usual."""
    world = await make()
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
    make: Make,
) -> None:
    """A record whose outputs the broker refused for their timestamp is handled again (not dead-lettered) with
    its command and audit record stamped with the current time, the original kept in a header; the next
    record's outputs keep their own time, and the part is left unstamped."""
    world = await make()
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
    make: Make,
) -> None:
    """When handling a record raises, the stage raises HandlerFailedError naming its offset and the error's
    repr (at most 500 characters), chained to the error, so the redo can send that record to the DLQ alone."""
    failure = ValueError("x" * 600)

    def partitioner(key: bytes, partitions: int) -> int:
        if key == b"boom":
            raise failure
        return owner_partition(key, partitions)

    world = await make(partitioner=partitioner)
    with pytest.raises(HandlerFailedError) as raised:
        await world.stage.handle([effect(5, key_on(0)), effect(6, b"boom")], {})
    assert (raised.value.offset, raised.value.error) == (6, repr(failure)[:500])
    assert len(raised.value.error) == 500
    assert raised.value.__cause__ is failure
    assert world.txn.restamp is False


# -- too large -------------------------------------------------------------------------------------


async def test_a_command_too_large_for_its_command_topic_is_dead_lettered_unclaimed(make: Make) -> None:
    """A first copy whose command (key and value) would be one byte over its command topic's limit goes to the
    DLQ (too-large) with its effect key and source, its key unclaimed so a replay later gives the effect."""
    key = key_on(0)
    record = effect(5, key, extra_headers=[(REPLAYED_FROM_HEADER, b"shop.dlq:0:7")])
    limit = RECORD_OVERHEAD + len(record.value) + len(key) - 1
    world = await make(limits={ORDERS: limit})
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


async def test_a_command_that_just_fits_its_command_topic_is_forwarded(make: Make) -> None:
    """A command exactly at its command topic's limit (key included) is forwarded."""
    key = key_on(0)
    record = effect(5, key)
    world = await make(limits={ORDERS: RECORD_OVERHEAD + len(record.value) + len(key)})
    await world.run([record])
    assert [s.key for s in world.sent(ORDERS)] == [key]
    assert world.dlq() == []


async def test_a_command_too_large_for_its_command_topic_is_counted_as_an_invalid_effect(make: Make) -> None:
    """Every effects record is counted in the effect outcomes, as every input record is in the event outcomes:
    one dead-lettered because its command is too large is an invalid one."""
    key = key_on(0)
    record = effect(5, key)
    world = await make(limits={ORDERS: RECORD_OVERHEAD + len(record.value)})
    await world.run([record])
    assert [d["reason"] for d in world.dlq()] == ["too-large"]
    assert sum(world.recorder.outcomes.values()) == 1


async def test_a_command_too_large_without_a_source_is_audited_with_no_source(make: Make) -> None:
    """A command without a source that is too large for its command topic is audited with a null source, as every
    other effect-stage audit record of a command without one is, not the text 'None'."""
    key = key_on(0)
    record = effect(5, key, value=orjson.dumps(command_of(5, source=_ABSENT)))
    world = await make(limits={ORDERS: RECORD_OVERHEAD + len(record.value)})
    await world.run([record])
    [audit] = world.audit()
    assert (audit["reason"], audit["source"]) == ("too-large", None)


# -- rerouted ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "shown"), [("stripe", "stripe"), (_ABSENT, None), (7, "7")])
async def test_a_rerouted_record_is_audited_and_counted_with_its_source_and_destination(
    make: Make, source: object, shown: str | None
) -> None:
    """A record on a partition its effect key does not hash to is moved to the owner, audited as `rerouted`
    (stage `effect`, `to_partition`, its source as text) and counted under that source."""
    world = await make()
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


async def test_a_rerouted_copy_too_large_for_the_effects_topic_is_dead_lettered(make: Make) -> None:
    """A record to reroute whose copy the effects topic no longer takes (its limit was lowered) goes to the DLQ
    (too-large) with its effect key and source, and nothing is moved."""
    world = await make(limits={EFFECTS: 300})
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


async def test_a_rerouted_copy_too_large_is_audited_and_counted_as_an_effect_stage_record(make: Make) -> None:
    """The audit record of an effects record dead-lettered because its rerouted copy is too large says
    `stage: effect` and where it was redriven from, as every other effect-stage audit record does, and it
    is counted as an invalid effect."""
    world = await make(limits={EFFECTS: 300})
    await world.run([effect(6, key_on(2), extra_headers=[(REPLAYED_FROM_HEADER, b"shop.dlq:0:7")])])
    [audit] = world.audit()
    assert (audit["stage"], audit["replayed_from"]) == ("effect", "shop.dlq:0:7")
    assert world.recorder.outcomes == {("stripe", "effect-invalid"): 1}


# -- chunks ----------------------------------------------------------------------------------------


async def test_a_batch_is_handled_250_records_at_a_time_with_the_loop_getting_a_turn_between(
    make: Make,
) -> None:
    """By default the stage handles 250 records, then lets the loop run before the next chunk."""
    world = await make()
    key = key_on(0)
    handling = asyncio.create_task(world.stage.handle([effect(i, key) for i in range(251)], {}))
    await asyncio.sleep(0)
    assert world.txn.next_offset == 250
    await handling
    assert world.txn.next_offset == 251

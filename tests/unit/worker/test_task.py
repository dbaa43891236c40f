"""One served partition's task in the worker's transaction, between pure units and the broker: a real
RocksDB store, a stand-in producer.

Each test is one rule of docs/design.md sections 5-7 (the commit order, the lifecycle, the failure
policy) as the task and the executor carry it out: what is committed, what goes to the DLQ and why,
what the store holds, where the consumer is sent back to, and which state the task ends in.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    ConcurrentTransactions,
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    ProducerFenced,
    RequestTimedOutError,
)
from aiokafka.structs import ConsumerRecord

from pipeline.errors import PartitionUnservedError, StoreError
from pipeline.headers import RECEIVED_AT_HEADER, REPLAYED_FROM_HEADER, SOURCE_HEADER
from pipeline.kafka.partitioner import owner_partition
from pipeline.state import directory
from pipeline.state.decision import Entry, blake_fingerprint, normalised_fingerprint, volatile_pattern
from pipeline.state.directory import store_path
from pipeline.state.store import Change, PartitionStore, bucket_width
from pipeline.state.store_meta import StoreIdentity
from pipeline.worker.health import partition_health
from pipeline.worker.lifecycle import PartitionState
from pipeline.worker.opening import BACKOFF_FIRST
from pipeline.worker.task import ActiveTask

from .fakes import (
    INPUT,
    PARTITIONS,
    T0,
    TOPICS,
    TOPOLOGY,
    FakeProducer,
    Harness,
    Sent,
    body,
    keys_for,
    record,
    records,
    tp,
)

S = PartitionState
GROUP = "webhooks"  # the default topology's app name: the default group
TP0 = tp(0)
K = keys_for(0, 12)  # keys owned by input partition 0: never rerouted
Opener = Callable[..., Awaitable[Harness]]


async def _open(h: Harness, task: ActiveTask) -> None:
    await task.open(h.txn, time.monotonic() + h.settings.open_timeout)


def _explode_on(monkeypatch: pytest.MonkeyPatch, h: Harness, offset: int) -> list[int]:
    """Make classifying the record at ``offset`` raise, as a bug would; the offsets classified so far."""
    classifier = h.context.classifier
    classify = classifier.classify
    calls: list[int] = []

    def exploding(delivery: Any) -> Any:
        calls.append(delivery.offset)
        if delivery.offset == offset:
            raise ValueError("a bug in classify")
        return classify(delivery)

    monkeypatch.setattr(classifier, "classify", exploding)
    return calls


def _claimed(h: Harness, *keys: str) -> set[str]:
    """Which of ``keys`` the partition's store holds."""
    store = h.task().store
    assert store is not None
    return {k.decode() for k in store.get_many([k.encode() for k in keys])}


def _limit(part: ActiveTask) -> int | None:
    """The bisecting limit: the most records one transaction may hold now (None: no limit)."""
    return part.poison.limit


def _poison(part: ActiveTask) -> Mapping[int, Any]:
    """The offsets the partition sends to the DLQ without handling them again, with why."""
    return part.poison.poison


def _state(part: ActiveTask) -> PartitionState:
    """The partition's state, read anew: mypy keeps ``part.state`` narrowed by an earlier assert
    across the awaits that change it (python/mypy#11969)."""
    return part.state


def _command_keys(producer: FakeProducer) -> list[str]:
    return [k.decode() for k in producer.committed_keys(TOPICS.commands) if k is not None]


async def _pump(
    h: Harness, batch: list[ConsumerRecord[bytes, bytes]], *, rounds: int = 40
) -> list[int | None]:
    """Drive the partition as the loop does, over a log holding ``batch``; return ``limit`` after each round.

    Each round fetches from the consumer's position, handles, and commits unless
    the handling rewound; a seek moves the position back. Stops once the whole
    log is committed.
    """
    position, end = batch[0].offset, batch[-1].offset + 1
    limits: list[int | None] = []
    for _ in range(rounds):
        assert h.task().state is S.READY
        seeks = len(h.seeks)
        fetched = [r for r in batch if r.offset >= position]
        position = end
        if fetched:
            h.feed(fetched)
        await h.work()
        if len(h.seeks) == seeks:
            await h.commit()
        limits.append(_limit(h.task()))
        if len(h.seeks) > seeks:
            position = h.seeks[-1][1]
        elif not h.task().queue and h.producer.committed_offset() == end:
            return limits
    raise AssertionError(f"the log was not committed in {rounds} rounds: {h.producer.calls}")


def _command_with(key: str, error: BaseException) -> Callable[[list[Sent]], BaseException | None]:
    """A broker that refuses any batch or transaction holding a command keyed ``key``."""

    def refuse(sent: list[Sent]) -> BaseException | None:
        hit = any(s.topic == TOPICS.commands and s.key == key.encode() for s in sent)
        return error if hit else None

    return refuse


# -- opening, and the commit order --------------------------------------------------------


async def test_open_restores_and_is_ready(open_partition: Opener) -> None:
    """open() goes OPENING → RESTORING → READY: the store opened and level with its changelog, a stage set;
    nothing is sent (the worker's producer is the worker's)."""
    h = await open_partition()
    assert h.task().state is S.READY
    assert h.task().serving
    store = h.task().store
    assert store is not None
    assert store.changelog_offset == -1
    assert h.task().part is not None
    assert h.task().stage is not None
    assert h.reader.entered == [TopicPartition(TOPICS.changelog, 0)]  # its changelog's end was read
    assert h.producer.calls == []


async def test_opening_a_level_store_opens_it_once_to_be_served(tmp_path: Path) -> None:
    """A store level with its changelog is opened once, served: no RocksDB open to follow and a second to
    serve (each holds the event loop; a rebalance of 48 partitions paid 96 opens)."""
    opened: list[bool] = []

    def counting(
        path: Path, *, bucket_ms: int, identity: StoreIdentity | None = None, follow: bool = False
    ) -> PartitionStore:
        opened.append(follow)
        return PartitionStore.open(path, bucket_ms=bucket_ms, identity=identity, follow=follow)

    h = Harness(tmp_path)
    h.context = dataclasses.replace(h.context, open_store=counting)  # the worker's one opener of stores
    try:
        await h.open(0)
        assert opened == [False]
        assert h.task().serving
    finally:
        h.close()


async def test_a_batch_commits_commands_for_new_keys_audit_for_every_record_and_changelog_for_staged_keys(
    open_partition: Opener,
) -> None:
    """One transaction: a command per new key, an audit record per input record, a changelog record per staged change, offset last+1."""
    h = await open_partition()
    batch = [record(10, K[0]), record(11, K[1]), record(12, K[0])]  # the third is a copy of the first
    await h.handle_and_commit(batch)

    p = h.producer
    assert p.violations == []
    assert [c for c in p.calls if not c.startswith("send")] == ["begin", f"offsets {INPUT}-0:13", "commit"]
    assert p.generations == [1]  # the offsets carry the group's generation (TxnOffsetCommit v3)
    assert p.offsets == [(TP0, 13, GROUP)]
    commands = p.committed_to(TOPICS.commands)
    assert [s.key for s in commands] == [K[0].encode(), K[1].encode()]
    assert all(s.partition == owner_partition(s.key or b"", PARTITIONS) for s in commands)
    assert [s.json()["key"] for s in commands] == [K[0], K[1]]
    audit = [s.json() for s in p.committed_to(TOPICS.audit)]
    assert [(a["offset"], a["outcome"]) for a in audit] == [(10, "first"), (11, "first"), (12, "duplicate")]
    changelog = p.committed_to(TOPICS.changelog)
    assert [s.key for s in changelog] == [K[0].encode(), K[1].encode(), K[0].encode()]
    assert {s.partition for s in changelog} == {0}  # the changelog partition is the input's
    assert {s.timestamp for s in commands} == {T0 + 10, T0 + 11}  # outputs keep the input's timestamp
    assert p.dlq() == []


async def test_the_store_is_written_only_after_the_kafka_commit(open_partition: Opener) -> None:
    """Nothing is claimed in RocksDB while the transaction is open or as it commits; after it, the keys and the changelog offset are."""
    h = await open_partition()
    seen_at_commit: list[set[str]] = []
    h.producer.on_commit = lambda: seen_at_commit.append(_claimed(h, K[0], K[1]))
    h.feed([record(10, K[0]), record(11, K[1])])
    await h.work()
    assert _claimed(h, K[0], K[1]) == set()
    await h.commit()
    assert seen_at_commit == [set()]
    assert _claimed(h, K[0], K[1]) == {K[0], K[1]}
    store = h.task().store
    assert store is not None
    assert store.changelog_offset == 1  # the last of the two changelog records (offsets 0 and 1)
    assert h.task().state is S.READY


async def test_a_copy_in_a_later_transaction_is_a_duplicate_and_makes_no_command(
    open_partition: Opener,
) -> None:
    """A key committed in one transaction suppresses its copy in the next: the store is what the next batch sees."""
    h = await open_partition()
    await h.handle_and_commit([record(10, K[0])])
    await h.handle_and_commit([record(11, K[0])])
    assert _command_keys(h.producer) == [K[0]]
    assert [s.json()["outcome"] for s in h.producer.committed_to(TOPICS.audit)] == ["first", "duplicate"]
    assert h.producer.offsets[-1] == (TP0, 12, GROUP)


DAY_MS = 86_400_000


async def test_a_redriven_record_older_than_its_ttl_claims_its_key_once_however_often_it_comes_again(
    open_partition: Opener,
) -> None:
    """A record redriven weeks after its time (stream time far past its TTL and every bucket of it) makes one
    command; its second redrive and a copy from the provider are duplicates."""
    h = await open_partition()
    await h.handle_and_commit([record(10, K[1], timestamp=T0 + 30 * DAY_MS)])  # stream time: 30 days on
    replayed = [*record(11, K[0]).headers, (REPLAYED_FROM_HEADER, b"webhooks.dlq:0:5")]
    for offset in (11, 12):  # the same DLQ record redriven twice, with its original timestamp
        await h.handle_and_commit([record(offset, K[0], timestamp=T0, headers=replayed)])
    await h.handle_and_commit([record(13, K[0], timestamp=T0 + 1)])  # and the provider's own copy
    assert _command_keys(h.producer) == [K[1], K[0]]
    audit = [s.json()["outcome"] for s in h.producer.committed_to(TOPICS.audit)]
    assert audit == ["first", "first", "duplicate", "duplicate"]
    assert _claimed(h, K[0]) == {K[0]}


async def test_changelog_records_are_stamped_when_written_so_retention_runs_from_the_claim_not_the_input(
    open_partition: Opener,
) -> None:
    """Records days old (a backlog) are claimed with changelog records stamped now: the changelog's
    retention.ms, on the broker's clock, counts from the claim; commands keep the input's time."""
    h = await open_partition()
    before = int(time.time() * 1000)
    await h.handle_and_commit([record(10, K[0], timestamp=T0), record(11, K[1], timestamp=T0 + 1)])
    after = int(time.time() * 1000)
    changelog = h.producer.committed_to(TOPICS.changelog)
    assert len(changelog) == 2
    assert all(before <= s.timestamp <= after for s in changelog)
    assert {s.timestamp for s in h.producer.committed_to(TOPICS.commands)} == {T0, T0 + 1}
    assert [Entry.decode(s.value).last_seen for s in changelog] == [T0, T0 + 1]  # stream time travels here


def _stripe_body(key: str, *, pending: int, amount: int = 100) -> bytes:
    """A Stripe event as Stripe sends it: ``pending_webhooks`` changes from one attempt to the next."""
    event_id = key.split(":", 1)[1]
    return (
        b'{"id": "%s", "object": "event", "data": {"object": {"amount": %d}}, '
        b'"pending_webhooks": %d, "type": "charge.succeeded"}' % (event_id.encode(), amount, pending)
    )


async def test_a_retry_differing_only_in_a_volatile_field_is_a_duplicate_and_another_body_a_conflict(
    open_partition: Opener,
) -> None:
    """Stripe's retry (another pending_webhooks) is a duplicate; a copy whose body differs otherwise is a conflict; neither makes a command."""
    h = await open_partition()
    await h.handle_and_commit([record(10, K[0], value=_stripe_body(K[0], pending=1))])
    await h.handle_and_commit([record(11, K[0], value=_stripe_body(K[0], pending=3))])
    await h.handle_and_commit([record(12, K[0], value=_stripe_body(K[0], pending=3, amount=999))])
    assert _command_keys(h.producer) == [K[0]]
    outcomes = [s.json()["outcome"] for s in h.producer.committed_to(TOPICS.audit)]
    assert outcomes == ["first", "duplicate", "conflict"]


@pytest.mark.parametrize("kind", ["normalised", "blake2b"])
async def test_a_key_stored_with_an_older_kind_of_fingerprint_is_compared_by_that_kind(
    open_partition: Opener, kind: str
) -> None:
    """An entry written by an earlier version: a retry is still a duplicate, a changed body still a conflict."""
    h = await open_partition()
    store = h.task().store
    assert store is not None
    first = _stripe_body(K[0], pending=1)
    if kind == "normalised":
        legacy = normalised_fingerprint(orjson.loads(first), ["pending_webhooks"])
    else:
        legacy = blake_fingerprint(first, volatile_pattern(["pending_webhooks"]))
    entry = Entry(T0, T0 + 86_400_000, 0, 5, last_seen=T0, command="handle", topic="t", body_hash=legacy)
    store.write({K[0].encode(): Change.of(entry)}, changelog_offset=None, stream_time=T0)
    event_id = K[0].split(":", 1)[1]
    reordered = (  # the same event, another pending_webhooks, keys in another order
        f'{{"type": "charge.succeeded", "pending_webhooks": 2, "data": {{"object": {{"amount": 100}}}}, '
        f'"object": "event", "id": "{event_id}"}}'
    ).encode()
    assert orjson.loads(reordered) == {**orjson.loads(first), "pending_webhooks": 2}
    # a normalised fingerprint ignores key order; one of the bytes sees only the volatile field change
    retry = reordered if kind == "normalised" else _stripe_body(K[0], pending=2)
    await h.handle_and_commit([record(10, K[0], value=retry)])
    await h.handle_and_commit([record(11, K[0], value=_stripe_body(K[0], pending=1, amount=5))])
    assert _command_keys(h.producer) == []
    outcomes = [s.json()["outcome"] for s in h.producer.committed_to(TOPICS.audit)]
    assert outcomes == ["duplicate", "conflict"]


# -- bad input ---------------------------------------------------------------------------


async def test_a_record_whose_handling_raises_aborts_the_batch_and_goes_to_the_dlq_alone_on_the_redo(
    open_partition: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Handling raises: abort (never commit), seek back to the batch's first offset; the redo DLQs that record (handler-error) and commands the rest."""
    h = await open_partition()
    batch = records(0, 10, K[:3])
    calls = _explode_on(monkeypatch, h, 11)

    h.feed(batch)
    await h.work()
    assert "abort" in h.producer.calls
    assert "commit" not in h.producer.calls
    assert h.producer.committed == []
    assert h.seeks == [(TP0, 10)]
    assert h.task().state is S.READY
    assert h.task().queue == []
    assert _poison(h.task())[11].reason == "handler-error"

    calls.clear()
    await h.handle_and_commit(batch)  # the consumer, moved back to 10, fetches the same records
    assert 11 not in calls  # the poison record is not classified again
    assert 10 in calls
    dlq = h.producer.dlq()
    assert [(d["offset"], d["reason"]) for d in dlq] == [(11, "handler-error")]
    assert "a bug in classify" in dlq[0]["error"]
    assert _command_keys(h.producer) == [K[0], K[2]]
    audit = [s.json() for s in h.producer.committed_to(TOPICS.audit)]
    assert [(a["offset"], a["outcome"]) for a in audit] == [(10, "first"), (11, "invalid"), (12, "first")]
    assert _claimed(h, *K[:3]) == {K[0], K[2]}
    assert h.producer.committed_offset() == 13
    assert dict(_poison(h.task())) == {}  # forgotten once committed past it
    assert h.producer.violations == []


async def test_a_hostile_received_at_goes_to_the_dlq_as_bad_header_without_raising(
    open_partition: Opener,
) -> None:
    """received-at far out of range is a bad-header DLQ record in the same transaction; its key is not claimed."""
    h = await open_partition()
    hostile = record(
        11,
        K[1],
        headers=[(SOURCE_HEADER, b"stripe"), (RECEIVED_AT_HEADER, b"100000000000000000000")],
    )
    await h.handle_and_commit([record(10, K[0]), hostile, record(12, K[2])])
    assert "abort" not in h.producer.calls
    dlq = h.producer.dlq()
    assert [(d["offset"], d["reason"]) for d in dlq] == [(11, "bad-header")]
    assert _command_keys(h.producer) == [K[0], K[2]]
    assert _claimed(h, *K[:3]) == {K[0], K[2]}
    assert h.producer.committed_offset() == 13
    assert h.task().state is S.READY


async def test_a_command_larger_than_its_topic_takes_goes_to_the_dlq_as_too_large_and_its_key_stays_unclaimed(
    open_partition: Opener,
) -> None:
    """A command over the topic's limit: DLQ (too-large), no command, no claim; the partition goes on with the next record."""
    h = await open_partition(limits={TOPICS.commands: 5000})
    big = record(10, K[0], value=body(K[0], pad=6000))
    await h.handle_and_commit([big, record(11, K[1])])
    dlq = h.producer.dlq()
    assert [(d["offset"], d["reason"]) for d in dlq] == [(10, "too-large")]
    assert _command_keys(h.producer) == [K[1]]
    assert K[0].encode() not in h.producer.committed_keys(TOPICS.changelog)
    assert _claimed(h, K[0], K[1]) == {K[1]}
    assert h.producer.committed_offset() == 12
    assert h.task().state is S.READY
    await h.handle_and_commit([record(12, K[2])])
    assert _command_keys(h.producer) == [K[1], K[2]]


# -- commits the broker refuses ------------------------------------------------------------


@pytest.mark.parametrize("where", ["commit", "send"])
async def test_a_commit_refused_twice_from_one_offset_bisects_until_the_offending_record_goes_to_the_dlq(
    open_partition: Opener, where: str
) -> None:
    """A non-retriable refusal that repeats halves the transaction until one record is alone; it goes to the DLQ (unproducible), the others commit."""
    h = await open_partition()
    batch = records(0, 10, K[:8])
    bad = K[3]  # offset 13
    refuse = _command_with(bad, MessageSizeTooLargeError())
    if where == "commit":
        h.producer.fail_commit_if = refuse
    else:
        h.producer.fail_send_if = refuse

    limits = await _pump(h, batch)

    halvings = [limit for previous, limit in zip([None, *limits], limits, strict=False) if limit != previous]
    assert halvings == [
        4,
        2,
        1,
        2,
        4,
        None,
    ]  # 8 records fail twice → 4 → 2 → 1 alone → to the DLQ → 2 → 4 → 8: no limit
    assert _limit(h.task()) is None  # grown back to whole transactions
    dlq = h.producer.dlq()
    assert [(d["offset"], d["reason"]) for d in dlq] == [(13, "unproducible")]
    assert "MessageSizeTooLargeError" in dlq[0]["error"]
    assert sorted(_command_keys(h.producer)) == sorted(k for k in K[:8] if k != bad)
    assert _claimed(h, *K[:8]) == set(K[:8]) - {bad}
    assert h.producer.committed_offset() == 18
    assert {offset for _, offset in h.seeks} == {10, 12, 13}  # every redo starts at a batch's first offset
    assert h.producer.violations == []


async def test_after_a_record_is_isolated_a_run_of_refused_records_costs_two_attempts_each_not_a_bisection(
    open_partition: Opener,
) -> None:
    """Once one record is dead-lettered, transactions grow back from one record: each refused record after it fails twice (at 2, then alone), never from a full batch."""
    h = await open_partition()
    batch = records(0, 10, K[:12])
    bad = set(K[2:9])  # offsets 12-18: seven refused records in a row
    h.producer.fail_commit_if = lambda sent: (
        MessageSizeTooLargeError()
        if any(s.topic == TOPICS.commands and s.key is not None and s.key.decode() in bad for s in sent)
        else None
    )

    limits = await _pump(h, batch, rounds=80)

    # the first bad record costs the bisection from the full batch of 12: twice at 12, then 6, 3, and twice
    # alone (once may be chance); each of the six after it fails once at 2 and once alone
    assert h.producer.calls.count("abort") == 6 + 6 * 2
    assert (
        max(limit or 0 for limit in limits[limits.index(1) : -3]) <= 2
    )  # never a full batch while they last
    assert limits[-3:] == [2, 4, 8]  # once they end, the limit doubles on each commit (to 12: none)
    assert [d["offset"] for d in h.producer.dlq()] == list(range(12, 19))
    assert sorted(_command_keys(h.producer)) == sorted(set(K[:12]) - bad)
    assert h.producer.committed_offset() == 22
    assert h.producer.violations == []


async def test_a_single_non_retriable_refusal_is_redone_whole_before_bisecting(
    open_partition: Opener,
) -> None:
    """Once may be chance: the first refusal is redone from the same offset with the whole batch, no limit, no DLQ."""
    h = await open_partition()
    h.producer.fail["commit"].append(MessageSizeTooLargeError())
    limits = await _pump(h, records(0, 10, K[:4]))
    assert set(limits) == {None}
    assert h.seeks == [(TP0, 10)]
    assert h.producer.calls.count("abort") == 1
    assert h.producer.dlq() == []
    assert _command_keys(h.producer) == K[:4]


@pytest.mark.parametrize(
    "error",
    # aiokafka calls KafkaTimeoutError and ConcurrentTransactions final; neither is a record's fault
    [KafkaTimeoutError, RequestTimedOutError, KafkaConnectionError, ConcurrentTransactions],
    ids=lambda e: e.__name__,
)
async def test_a_retriable_commit_failure_is_redone_and_never_bisects_or_dlqs(
    open_partition: Opener, error: type[Exception]
) -> None:
    """A timeout, a lost connection or a busy coordinator, however often it repeats from one offset, is redone whole: no limit, no DLQ."""
    h = await open_partition()
    h.producer.fail["commit"].extend(error() for _ in range(4))
    limits = await _pump(h, records(0, 10, K[:4]))
    assert set(limits) == {None}
    assert h.seeks == [(TP0, 10)] * 4
    assert h.producer.calls.count("abort") == 4
    assert h.producer.dlq() == []
    assert _command_keys(h.producer) == K[:4]
    assert h.producer.committed_offset() == 14


# -- fenced, broken ----------------------------------------------------------------------


@pytest.mark.parametrize("at", ["begin", "offsets"])
async def test_a_fence_before_the_commit_is_sent_aborts_and_asks_for_a_new_producer_and_a_rejoin(
    open_partition: Opener, at: str
) -> None:
    """ProducerFenced (the broker timed the transaction out, or another process took the id): nothing committed,
    the task back at its first record, a new producer and a rejoin asked; the task stays READY."""
    h = await open_partition()
    h.producer.fail[at].append(ProducerFenced())
    h.feed(records(0, 10, K[:2]))
    await h.work()
    await h.commit()
    assert h.producer.committed == []
    assert h.seeks == [(TP0, 10)]
    asked = [o for o in h.outcomes if o.replace_producer]
    assert len(asked) == 1
    assert asked[0].rejoin
    assert h.task().state is S.READY
    assert not h.txn.open


@pytest.mark.parametrize("took", [True, False], ids=["commit-took", "commit-lost"])
async def test_a_fence_as_the_commit_is_answered_reopens_the_task_instead_of_redoing_its_records(
    open_partition: Opener, *, took: bool
) -> None:
    """Fenced once EndTxn was sent (seed 23108): the commit may have taken, so the records are not redone from
    memory; the task is BROKEN (reopened from the group's committed offset and its changelog), no seek, and a
    new producer and a rejoin are asked."""
    h = await open_partition()
    (h.producer.fail_after if took else h.producer.fail)["commit"].append(ProducerFenced())
    h.feed(records(0, 10, K[:2]))
    await h.work()
    await h.commit()
    assert h.producer.committed_offset() == (12 if took else None)
    assert h.seeks == []
    assert h.task().state is S.BROKEN
    asked = [o for o in h.outcomes if o.replace_producer]
    assert len(asked) == 1
    assert asked[0].rejoin
    assert not h.txn.open


async def test_a_failed_store_write_after_the_kafka_commit_makes_the_partition_broken(
    open_partition: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka committed but RocksDB refused: BROKEN (reopen and restore), the store's changelog offset unchanged."""
    h = await open_partition()
    store = h.task().store
    assert store is not None

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise StoreError("disk full")

    monkeypatch.setattr(store, "write", refuse)
    await h.handle_and_commit(records(0, 10, K[:2]))
    assert h.producer.calls[-1] == "commit"
    assert h.producer.committed_offset() == 12
    assert h.task().state is S.BROKEN
    assert store.changelog_offset == -1
    assert _claimed(h, *K[:2]) == set()
    h.task().close()
    assert _state(h.task()) is S.CLOSED


# -- open failures and closing -----------------------------------------------------------


async def test_a_store_of_another_identity_refuses_to_open_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store copied from partition 1 to partition 0's place: PartitionUnservedError without retrying, CLOSED, the store left alone."""
    path = store_path(tmp_path, TOPOLOGY, GROUP, TP0)
    bucket_ms = bucket_width(int(TOPOLOGY.max_ttl.total_seconds() * 1000))
    theirs = StoreIdentity(TOPOLOGY.app, GROUP, INPUT, 1, TOPICS.changelog)
    PartitionStore.open(path, bucket_ms=bucket_ms, identity=theirs).close()
    h = Harness(tmp_path, {"open_timeout": 30.0})
    part = h.task(0)

    began = time.monotonic()
    with pytest.raises(PartitionUnservedError, match="belongs to"):
        await _open(h, part)
    assert time.monotonic() - began < BACKOFF_FIRST  # no backoff: not retried
    assert part.state is S.CLOSED
    assert part.store is None
    assert h.reader.entered == []  # never got as far as the restore
    PartitionStore.open(path, bucket_ms=bucket_ms, identity=theirs).close()  # still theirs, not wiped


async def test_an_unusable_state_dir_is_retried_until_open_timeout_then_the_partition_is_unserved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state dir that is a regular file is retried with backoff until open_timeout, then PartitionUnservedError and CLOSED."""
    state_dir = tmp_path / "state"
    state_dir.write_text("not a directory")
    h = Harness(state_dir, {"open_timeout": 1.0})
    part = h.task(0)
    attempts: list[float] = []
    real_open_store = directory.open_store

    def counted(*args: Any, **kwargs: Any) -> PartitionStore:
        attempts.append(time.monotonic())
        return real_open_store(*args, **kwargs)

    monkeypatch.setattr(directory, "open_store", counted)

    began = time.monotonic()
    with pytest.raises(PartitionUnservedError, match="cannot be served"):
        await _open(h, part)
    elapsed = time.monotonic() - began
    assert len(attempts) >= 2  # retried
    assert BACKOFF_FIRST <= elapsed <= 1.0 + 0.5  # within the deadline
    assert part.state is S.CLOSED
    assert part.store is None


async def test_an_abort_on_stop_after_an_exception_commits_nothing_and_close_releases_the_store(
    open_partition: Opener,
) -> None:
    """A stop after an exception aborts the open transaction: nothing committed or claimed; closing the task
    releases its store's lock."""
    h = await open_partition()
    h.feed(records(0, 10, K[:3]))
    await h.work()
    held = h.task().store
    store_dir = held.path if held else None
    await h.executor.abort()
    h.task().close()
    assert h.producer.calls[-1] == "abort"
    assert "commit" not in h.producer.calls
    assert h.producer.committed == []
    assert h.task().state is S.CLOSED
    assert h.task().store is None
    assert store_dir is not None
    bucket_ms = bucket_width(int(TOPOLOGY.max_ttl.total_seconds() * 1000))
    reopened = PartitionStore.open(store_dir, bucket_ms=bucket_ms)  # its lock was released
    try:
        assert reopened.get_many([k.encode() for k in K[:3]]) == {}
    finally:
        reopened.close()


FATAL = "Invalid state transition TransactionState.FATAL_ERROR -> TransactionState.IN_TRANSACTION"


@pytest.mark.parametrize("at", ["begin", "commit"])
async def test_a_producer_gone_fatal_is_replaced_and_nothing_is_committed(
    open_partition: Opener, at: str
) -> None:
    """aiokafka asserts on its state machine once its sender died: a new producer is asked for, nothing committed
    or claimed; at begin the task goes back to its first record, still READY; at the commit, where a sender
    dying may have sent EndTxn first, it is reopened (BROKEN) from the group's committed offset."""
    h = await open_partition()
    h.producer.fail[at].append(AssertionError(FATAL))
    h.feed(records(0, 10, K[:2]))
    await h.work()
    await h.commit()
    assert [o.replace_producer for o in h.outcomes if o.replace_producer] == [True]
    assert h.producer.committed == []
    assert h.producer.offsets == []
    assert _claimed(h, *K[:2]) == set()
    assert not h.txn.open
    if at == "begin":
        assert h.seeks == [(TP0, 10)]
        assert h.task().state is S.READY
    else:
        assert h.seeks == []
        assert h.task().state is S.BROKEN


def _events(h: Any) -> dict[str, float]:
    """pipeline_events_total by outcome, as Prometheus would scrape it."""
    counts: dict[str, float] = {}
    for family in h.metrics.registry.collect():
        if family.name == "pipeline_events":
            for sample in family.samples:
                if sample.name == "pipeline_events_total":
                    outcome = sample.labels["outcome"]
                    counts[outcome] = counts.get(outcome, 0) + sample.value
    return counts


async def test_records_of_an_aborted_transaction_are_counted_once_when_redone(
    open_partition: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metrics count what was committed: a batch aborted (handler error, then a refused commit) and redone counts once."""
    h = await open_partition()
    batch = records(0, 10, K[:3])
    _explode_on(monkeypatch, h, 11)
    h.feed(batch)
    await h.work()  # 10 handled, 11 raises: aborted
    h.producer.fail["commit"].append(KafkaTimeoutError())
    await h.handle_and_commit(batch)  # redone, then the commit is refused: aborted again
    assert h.producer.committed == []
    await h.handle_and_commit(batch)
    assert h.producer.committed_offset() == 13
    assert _events(h) == {"first": 2, "invalid": 1}


async def test_a_store_held_by_another_owner_is_waited_for_store_lock_wait_then_the_partition_is_unserved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store whose RocksDB lock another owner keeps: retried for store_lock_wait (not the whole open_timeout), then unserved."""
    path = store_path(tmp_path, TOPOLOGY, GROUP, TP0)
    bucket_ms = bucket_width(int(TOPOLOGY.max_ttl.total_seconds() * 1000))
    ours = StoreIdentity(TOPOLOGY.app, GROUP, INPUT, 0, TOPICS.changelog)
    holder = PartitionStore.open(path, bucket_ms=bucket_ms, identity=ours)
    try:
        h = Harness(tmp_path, {"open_timeout": 30.0, "store_lock_wait": 1.0})
        part = h.task(0)
        began = time.monotonic()
        with pytest.raises(PartitionUnservedError, match="lock"):
            await _open(h, part)
        elapsed = time.monotonic() - began
        assert BACKOFF_FIRST <= elapsed < 3.0  # waited, but for the lock wait, not the 30 s open timeout
        assert part.state is S.CLOSED
    finally:
        holder.close()


async def test_a_partition_with_work_and_no_commit_for_stuck_after_is_stuck_and_unhealthy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records waiting and no commit for stuck_after seconds: stuck, neither alive nor ready; idle is never stuck."""
    h = Harness(tmp_path, {"stuck_after": 5.0})
    part = await h.open(0)
    now = time.monotonic()
    assert not part.stuck(now + 60)  # idle: nothing waits
    part.feed(records(0, 10, K[:1]))
    assert not part.stuck(now + 1)
    assert part.stuck(now + 60)
    health = partition_health([TP0], {TP0: part}, failed=False)
    assert health.ready  # within stuck_after of the last progress
    assert health.live
    part.progress_at = now - 60
    health = partition_health([TP0], {TP0: part}, failed=False)
    assert not health.ready
    assert not health.live  # a restart is what helps a stuck partition
    assert health.detail["status"] == "unhealthy"
    assert health.detail["partitions"] == {f"{INPUT}-0": "stuck"}
    part.close()

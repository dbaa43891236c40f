"""Downstream consumers against the real broker and PostgreSQL: read_committed, apply once, both offset policies."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from pipeline.downstream import (
    Command,
    CommandStream,
    Origin,
    PostgresOffsets,
    apply_once,
    apply_once_async,
    ensure_schema,
    ensure_schema_async,
    load_offsets_async,
)
from tests.conftest import TopicFactory

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def stripe_command(
    command: str, effect_key: str, event_id: str, event_type: str, obj: dict[str, Any]
) -> Command:
    """A contract-shaped command carrying a Stripe event."""
    event = {
        "id": event_id,
        "object": "event",
        "type": event_type,
        "created": 1_700_000_000,
        "data": {"object": obj},
    }
    return Command(command, f"stripe:{event_id}", effect_key, "stripe", event_type, 1_700_000_000_500, event)


@dataclass
class Scenario:
    """Commands produced to a topic: committed (in order, duplicates included) and aborted."""

    topic: str
    orders: list[str]
    invoice: str
    committed: list[Command]
    aborted: list[Command]

    @property
    def effect_keys(self) -> set[str]:
        return {c.effect_key for c in self.committed}


def make_scenario(topic: str, token: str) -> tuple[Scenario, list[list[Command]]]:
    """As stripe-fulfilment.toml emits them: three orders (one by both payment events), one invoice twice."""
    o1, o2, o3, o4 = (f"ord_{token}_{i}" for i in range(1, 5))
    invoice = f"in_{token}"

    def fulfil(order: str, event_id: str, event_type: str) -> Command:
        obj = {"id": f"cs_{event_id}", "amount_total": 4200, "metadata": {"order_id": order}}
        return stripe_command("fulfil-order", f"fulfil-order:pi_{order}", event_id, event_type, obj)

    def close(event_id: str, event_type: str, obj: dict[str, Any]) -> Command:
        return stripe_command("close-invoice", f"close-invoice:{invoice}", event_id, event_type, obj)

    a = fulfil(o1, f"evt_{token}_a", "checkout.session.completed")
    b = fulfil(o1, f"evt_{token}_b", "payment_intent.succeeded")  # same effect key as a
    c = fulfil(o2, f"evt_{token}_c", "checkout.session.completed")
    d = fulfil(o3, f"evt_{token}_d", "checkout.session.completed")
    e = close(f"evt_{token}_e", "invoice.paid", {"id": invoice, "amount_paid": 900})
    aborted = [
        fulfil(o4, f"evt_{token}_x", "checkout.session.completed"),
        close(f"evt_{token}_y", "invoice.voided", {"id": invoice}),
    ]
    batches = [[a, c, c, e], aborted, [b, d, e]]
    scenario = Scenario(topic, [o1, o2, o3], invoice, [*batches[0], *batches[2]], aborted)
    return scenario, batches


async def produce(bootstrap: str, topic: str, transactional_id: str, batches: list[list[Command]]) -> None:
    """Produce the batches in transactions: the second one aborted, the others committed."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id, acks="all")
    await producer.start()
    try:
        for i, batch in enumerate(batches):
            await producer.begin_transaction()
            # wait for each record to reach the log, so the aborted ones are really there to skip
            for command in batch:
                await (await producer.send(topic, command.to_json(), key=command.effect_key.encode()))
            if i == 1:
                await producer.abort_transaction()
            else:
                await producer.commit_transaction()
    finally:
        await producer.stop()


@pytest.fixture
async def scenario(bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]) -> Scenario:
    """A fresh one-partition command topic holding the scenario's committed and aborted commands."""
    topic = await make_topic("commands", partitions=1)
    made, batches = make_scenario(topic, unique("t").rsplit("-", 1)[1])
    await produce(bootstrap, topic, unique("txn"), batches)
    return made


def run_example(*args: str, timeout: float = 90.0) -> dict[str, int]:
    """Run an example script; its JSON summary line, or fail with its output if it exits non-zero."""
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"{args[0]} exited with {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}")
    result: dict[str, int] = orjson.loads(done.stdout.strip().splitlines()[-1])
    return result


def count_effects(cursor: psycopg.Cursor[Any], command: Command) -> None:
    """A deliberately non-idempotent effect: count how many times each effect key was applied."""
    cursor.execute(
        "INSERT INTO effects (effect_key, n) VALUES (%s, 1)"
        " ON CONFLICT (effect_key) DO UPDATE SET n = effects.n + 1",
        (command.effect_key,),
    )


async def count_effects_async(cursor: psycopg.AsyncCursor[Any], command: Command) -> None:
    """count_effects for an async cursor."""
    await cursor.execute(
        "INSERT INTO effects (effect_key, n) VALUES (%s, 1) ON CONFLICT (effect_key) DO UPDATE SET n = effects.n + 1",
        (command.effect_key,),
    )


def test_apply_once_applies_each_effect_key_once(postgres_db: str, unique: Callable[[str], str]) -> None:
    """Repeats and commands sharing an effect key are not applied again; a failed apply leaves no claim."""
    scenario, _ = make_scenario("unused", unique("t").rsplit("-", 1)[1])
    with psycopg.connect(postgres_db) as conn, psycopg.connect(postgres_db) as other:
        ensure_schema(conn, service="orders")
        with conn.transaction():
            conn.execute("CREATE TABLE effects (effect_key text PRIMARY KEY, n int NOT NULL)")
        results = [
            apply_once(conn, command, count_effects, service="orders") for command in scenario.committed
        ]
        # a, c, c, e, b, d, e: the second c, b (a's effect key) and the second e are repeats
        assert results == [True, True, False, True, False, True, False]
        assert apply_once(conn, scenario.committed[0], count_effects, service="orders") is False

        failing = scenario.aborted[0]

        def fail(cursor: psycopg.Cursor[Any], command: Command) -> None:
            count_effects(cursor, command)
            raise RuntimeError("downstream failed")

        with pytest.raises(RuntimeError, match="downstream failed"):
            apply_once(conn, failing, fail, service="orders")
        assert apply_once(conn, failing, count_effects, service="orders") is True

        # a second consumer racing on a key that is claimed but not yet committed waits, then sees a repeat
        racing = dataclasses.replace(scenario.aborted[1], effect_key=f"close-invoice:in_race_{failing.key}")
        outcome: list[bool] = []
        with conn.transaction():
            assert apply_once(conn, racing, count_effects, service="orders") is True
            thread = threading.Thread(
                target=lambda: outcome.append(apply_once(other, racing, count_effects, service="orders"))
            )
            thread.start()
            time.sleep(0.5)
            assert thread.is_alive(), "the racing claim should wait for the first transaction"
        thread.join(timeout=10)
        assert outcome == [False]

        counts: dict[str, int] = dict(conn.execute("SELECT effect_key, n FROM effects").fetchall())
        applied = {r[0] for r in conn.execute("SELECT effect_key FROM orders_applied_commands").fetchall()}
    expected = scenario.effect_keys | {failing.effect_key, racing.effect_key}
    assert counts == dict.fromkeys(expected, 1)
    assert applied == expected


async def test_two_services_on_one_database_each_apply_a_fresh_command(
    postgres_db: str, unique: Callable[[str], str]
) -> None:
    """The issue's bug: a second service's fresh command is applied, not a 'repeat' of the first service's claim."""
    scenario, _ = make_scenario("unused", unique("t").rsplit("-", 1)[1])
    command = scenario.committed[0]
    async with await psycopg.AsyncConnection.connect(postgres_db) as conn:
        for service in ("orders", "emails"):
            await ensure_schema_async(conn, service=service)
        async with conn.transaction():
            await conn.execute("CREATE TABLE effects (effect_key text PRIMARY KEY, n int NOT NULL)")
        assert await apply_once_async(conn, command, count_effects_async, service="orders") is True
        assert await apply_once_async(conn, command, count_effects_async, service="emails") is True
        assert await apply_once_async(conn, command, count_effects_async, service="emails") is False
        assert await apply_once_async(conn, command, count_effects_async, service="orders") is False
        row = await (await conn.execute("SELECT n FROM effects")).fetchone()
    assert row == (2,)


async def test_stored_offsets_move_in_the_effects_transaction(
    postgres_db: str, unique: Callable[[str], str]
) -> None:
    """store_offset writes the next offset with the claim: repeats move it, a failed apply moves nothing."""
    scenario, _ = make_scenario("unused", unique("t").rsplit("-", 1)[1])
    read = [dataclasses.replace(c, origin=Origin("t", 2, i)) for i, c in enumerate(scenario.committed)]
    async with await psycopg.AsyncConnection.connect(postgres_db) as conn:
        await ensure_schema_async(conn, service="orders")
        async with conn.transaction():
            await conn.execute("CREATE TABLE effects (effect_key text PRIMARY KEY, n int NOT NULL)")
        for command in read[:3]:  # a, c, c (the second c a repeat)
            await apply_once_async(conn, command, count_effects_async, service="orders", store_offset=True)
        assert await load_offsets_async(conn, [("t", 2), ("t", 0)], service="orders") == {("t", 2): 3}

        async def fail(cursor: psycopg.AsyncCursor[Any], command: Command) -> None:
            await count_effects_async(cursor, command)
            raise RuntimeError("downstream failed")

        with pytest.raises(RuntimeError):
            await apply_once_async(conn, read[3], fail, service="orders", store_offset=True)
        assert await load_offsets_async(conn, [("t", 2)], service="orders") == {("t", 2): 3}
        await apply_once_async(conn, read[1], count_effects_async, service="orders", store_offset=True)
        assert await load_offsets_async(conn, [("t", 2)], service="orders") == {("t", 2): 3}  # never back
    assert await PostgresOffsets(postgres_db, service="orders").load([("t", 2)]) == {("t", 2): 3}
    assert await PostgresOffsets(postgres_db, service="billing").load([("t", 2)]) == {}


async def committed_offset(bootstrap: str, group: str, topic: str) -> int | None:
    """The group's committed offset of partition 0 of ``topic``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        offset: int | None = await consumer.committed(TopicPartition(topic, 0))
        return offset
    finally:
        await consumer.stop()


async def consume(
    stream: CommandStream,
    conn: psycopg.AsyncConnection[Any],
    seen: list[Command],
    *,
    store_offset: bool,
    crash_at: int | None = None,
) -> None:
    """Apply the stream's commands once each, raising in the loop body at the ``crash_at``-th command."""
    async with stream as commands:
        async for command in commands:
            if len(seen) == crash_at:
                raise RuntimeError("crash")
            seen.append(command)
            await apply_once_async(
                conn, command, count_effects_async, service="orders", store_offset=store_offset
            )


@pytest.mark.parametrize("policy", ["kafka", "database"])
async def test_command_stream_resumes_after_the_last_done_command(
    policy: str, bootstrap: str, scenario: Scenario, postgres_db: str, unique: Callable[[str], str]
) -> None:
    """A body that raises on the 4th command: a restart resumes at it, from Kafka's or the database's offsets."""
    group = unique("stream")
    in_db = policy == "database"

    def stream() -> CommandStream:
        offsets = PostgresOffsets(postgres_db, service="orders") if in_db else None
        return CommandStream(bootstrap, [scenario.topic], group=group, offsets=offsets, idle_timeout=3)

    seen: list[Command] = []
    async with await psycopg.AsyncConnection.connect(postgres_db) as conn:
        await ensure_schema_async(conn, service="orders")
        async with conn.transaction():
            await conn.execute("CREATE TABLE effects (effect_key text PRIMARY KEY, n int NOT NULL)")
        with pytest.raises(RuntimeError, match="crash"):
            await consume(stream(), conn, seen, store_offset=in_db, crash_at=3)
        assert [c.origin.offset for c in seen if c.origin] == [0, 1, 2]
        assert seen[0].origin == Origin(scenario.topic, 0, 0, seen[0].origin.timestamp)  # type: ignore[union-attr]
        assert seen[0].idempotency_key == scenario.committed[0].key
        assert await committed_offset(bootstrap, group, scenario.topic) == (None if in_db else 3)

        rest: list[Command] = []
        await consume(stream(), conn, rest, store_offset=in_db)
        cursor = await conn.execute("SELECT effect_key, n FROM effects")
        effects: dict[str, int] = dict(await cursor.fetchall())
    assert [c.key for c in seen + rest] == [
        c.key for c in scenario.committed
    ]  # none lost, the aborted unseen
    assert effects == dict.fromkeys(scenario.effect_keys, 1)
    if not in_db:
        assert await committed_offset(bootstrap, group, scenario.topic) == rest[-1].origin.offset + 1  # type: ignore[union-attr]


@pytest.mark.parametrize("policy", ["kafka", "database"])
async def test_postgres_orders_applies_once_across_a_replay(
    policy: str, bootstrap: str, scenario: Scenario, postgres_db: str, unique: Callable[[str], str]
) -> None:
    """The PostgreSQL example applies each effect once; a second run (a new group) applies nothing."""
    runs = [
        await asyncio.to_thread(
            run_example,
            str(EXAMPLES / "postgres_orders.py"),
            *("--bootstrap", bootstrap, "--topic", scenario.topic, "--dsn", postgres_db),
            *("--group", group, "--offsets", policy, "--max-idle", "3", "--timeout", "60"),
        )
        for group in (unique("orders-a"), unique("orders-b"))
    ]
    total, distinct = len(scenario.committed), len(scenario.effect_keys)
    assert runs[0] == {
        "seen": total,
        "applied": distinct,
        "repeats": total - distinct,
        "skipped": 0,
        "invalid": 0,
    }
    if policy == "kafka":  # the new group replays the topic: every command is a repeat
        assert runs[1] == {"seen": total, "applied": 0, "repeats": total, "skipped": 0, "invalid": 0}
    else:  # the offsets belong to the service, in its database: the new group starts after them
        assert runs[1] == {"seen": 0, "applied": 0, "repeats": 0, "skipped": 0, "invalid": 0}

    with psycopg.connect(postgres_db) as conn:
        rows = conn.execute("SELECT id, status, amount FROM orders ORDER BY id").fetchall()
        emails = conn.execute("SELECT order_id FROM order_emails ORDER BY order_id").fetchall()
        applied = {r[0] for r in conn.execute("SELECT effect_key FROM orders_applied_commands").fetchall()}
        offsets = conn.execute("SELECT kafka_topic, next_offset FROM orders_kafka_offsets").fetchall()
    assert sorted(rows) == sorted(
        [*((o, "fulfilled", 4200) for o in scenario.orders), (scenario.invoice, "paid", 900)]
    )
    assert emails == [(o,) for o in sorted(scenario.orders)]
    assert applied == scenario.effect_keys
    # 4 records and a commit marker, 2 aborted records and the abort marker, then 3: the last is offset 10
    assert offsets == ([(scenario.topic, 11)] if policy == "database" else [])

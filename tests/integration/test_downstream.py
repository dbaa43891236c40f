"""Downstream consumers against the real broker and PostgreSQL: read_committed, apply once, replay."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from aiokafka import AIOKafkaProducer

from pipeline.downstream import Command, apply_once, apply_once_async, ensure_schema, ensure_schema_async
from tests.conftest import TopicFactory
from tests.integration.harness import read_committed

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
    """Three orders (one fulfilled by two events sharing an effect key, one redelivered), one invoice twice."""
    o1, o2, o3, o4 = (f"ord_{token}_{i}" for i in range(1, 5))
    invoice = f"in_{token}"

    def fulfil(order: str, event_id: str, event_type: str) -> Command:
        obj = {"id": f"cs_{event_id}", "amount_total": 4200, "metadata": {"order_id": order}}
        return stripe_command("fulfil-order", f"order:{order}:fulfil", event_id, event_type, obj)

    a = fulfil(o1, f"evt_{token}_a", "checkout.session.completed")
    b = fulfil(o1, f"evt_{token}_b", "payment_intent.succeeded")  # same effect key as a
    c = fulfil(o2, f"evt_{token}_c", "checkout.session.completed")
    d = fulfil(o3, f"evt_{token}_d", "checkout.session.completed")
    e = stripe_command(
        "invoice-final",
        f"stripe:evt_{token}_e",
        f"evt_{token}_e",
        "invoice.paid",
        {"id": invoice, "amount_paid": 900},
    )
    aborted = [
        fulfil(o4, f"evt_{token}_x", "checkout.session.completed"),
        stripe_command(
            "invoice-final", f"stripe:evt_{token}_y", f"evt_{token}_y", "invoice.voided", {"id": invoice}
        ),
    ]
    batches = [[a, c, c, e], aborted, [b, d, e]]
    scenario = Scenario(topic, [o1, o2, o3], invoice, [*batches[0], *batches[2]], aborted)
    return scenario, batches


async def produce(bootstrap: str, topic: str, transactional_id: str, batches: list[list[Command]]) -> None:
    """Produce the batches in transactions: the first and last committed, the middle one aborted."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id, acks="all")
    await producer.start()
    try:
        for i, batch in enumerate(batches):
            commit = i != 1
            await producer.begin_transaction()
            # wait for each record to reach the log, so the aborted ones are really there to skip
            for command in batch:
                await (await producer.send(topic, command.to_json(), key=command.effect_key.encode()))
            if commit:
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
    finally:
        await producer.stop()


@pytest.fixture
async def scenario(bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]) -> Scenario:
    """A fresh two-partition command topic holding the scenario's committed and aborted commands."""
    topic = await make_topic("commands", partitions=2)
    made, batches = make_scenario(topic, unique("t").rsplit("-", 1)[1])
    await produce(bootstrap, topic, unique("txn"), batches)
    return made


def run_example(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run an example script; fail with its output if it exits non-zero."""
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"{args[0]} exited with {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}")
    return done


async def test_faust_consumer_sees_each_committed_command_once(
    bootstrap: str, scenario: Scenario, tmp_path: Path
) -> None:
    """The faust example reads every committed command exactly once and nothing of the aborted transaction."""
    assert len(await read_committed(bootstrap, scenario.topic)) == len(scenario.committed)
    out = tmp_path / "seen.jsonl"
    # stop early only if it saw too much: a read_uncommitted consumer would see the aborted records too
    expect = len(scenario.committed) + len(scenario.aborted)
    await asyncio.to_thread(
        run_example,
        str(EXAMPLES / "faust_consumer.py"),
        "--broker",
        bootstrap,
        "--topic",
        scenario.topic,
        "--out",
        str(out),
        "--expect",
        str(expect),
        "--max-idle",
        "4",
        "--data-dir",
        str(tmp_path / "faust"),
    )
    seen = [orjson.loads(line) for line in out.read_text().splitlines()]
    assert Counter(s["effect_key"] for s in seen) == Counter(c.effect_key for c in scenario.committed)
    assert len({(s["partition"], s["offset"]) for s in seen}) == len(seen) == len(scenario.committed)
    assert not {c.effect_key for c in scenario.aborted} & {s["effect_key"] for s in seen}


def count_effects(cursor: psycopg.Cursor[Any], command: Command) -> None:
    """A deliberately non-idempotent effect: count how many times each effect key was applied."""
    cursor.execute(
        "INSERT INTO effects (effect_key, n) VALUES (%s, 1)"
        " ON CONFLICT (effect_key) DO UPDATE SET n = effects.n + 1",
        (command.effect_key,),
    )


def test_apply_once_applies_each_effect_key_once(postgres_db: str, unique: Callable[[str], str]) -> None:
    """Repeats and commands sharing an effect key are not applied again; a failed apply leaves no claim."""
    scenario, _ = make_scenario("unused", unique("t").rsplit("-", 1)[1])
    with psycopg.connect(postgres_db) as conn, psycopg.connect(postgres_db) as other:
        ensure_schema(conn)
        with conn.transaction():
            conn.execute("CREATE TABLE effects (effect_key text PRIMARY KEY, n int NOT NULL)")
        results = [apply_once(conn, command, count_effects) for command in scenario.committed]
        # a, c, c, e, b, d, e: the second c, b (a's effect key) and the second e are repeats
        assert results == [True, True, False, True, False, True, False]
        assert apply_once(conn, scenario.committed[0], count_effects) is False

        failing = scenario.aborted[0]

        def fail(cursor: psycopg.Cursor[Any], command: Command) -> None:
            count_effects(cursor, command)
            raise RuntimeError("downstream failed")

        with pytest.raises(RuntimeError, match="downstream failed"):
            apply_once(conn, failing, fail)
        assert apply_once(conn, failing, count_effects) is True

        # a second consumer racing on a key that is claimed but not yet committed waits, then sees a repeat
        racing = scenario.aborted[1]
        outcome: list[bool] = []
        with conn.transaction():
            assert apply_once(conn, racing, count_effects) is True
            thread = threading.Thread(target=lambda: outcome.append(apply_once(other, racing, count_effects)))
            thread.start()
            time.sleep(0.5)
            assert thread.is_alive(), "the racing claim should wait for the first transaction"
        thread.join(timeout=10)
        assert outcome == [False]

        counts = dict(conn.execute("SELECT effect_key, n FROM effects").fetchall())
        applied = {row[0] for row in conn.execute("SELECT effect_key FROM applied_commands").fetchall()}
    expected = scenario.effect_keys | {failing.effect_key, racing.effect_key}
    assert counts == dict.fromkeys(expected, 1)
    assert applied == expected


async def test_apply_once_async(postgres_db: str, unique: Callable[[str], str]) -> None:
    """The async variant claims and applies in one transaction, once per effect key."""
    scenario, _ = make_scenario("unused", unique("t").rsplit("-", 1)[1])

    async def count(cursor: psycopg.AsyncCursor[Any], command: Command) -> None:
        await cursor.execute(
            "INSERT INTO effects (effect_key, n) VALUES (%s, 1) ON CONFLICT (effect_key) DO UPDATE SET n = effects.n + 1",
            (command.effect_key,),
        )

    async with await psycopg.AsyncConnection.connect(postgres_db) as conn:
        await ensure_schema_async(conn, table="public.applied_async")
        async with conn.transaction():
            await conn.execute("CREATE TABLE effects (effect_key text PRIMARY KEY, n int NOT NULL)")
        results = [
            await apply_once_async(conn, command, count, table="public.applied_async")
            for command in scenario.committed
        ]
        assert results == [True, True, False, True, False, True, False]
        cursor = await conn.execute("SELECT effect_key, n FROM effects")
        assert dict(await cursor.fetchall()) == dict.fromkeys(scenario.effect_keys, 1)


async def test_postgres_orders_applies_once_across_a_replay(
    bootstrap: str,
    scenario: Scenario,
    postgres_db: str,
    unique: Callable[[str], str],
) -> None:
    """The PostgreSQL example applies each effect once; a replay by a new group applies nothing."""
    runs = []
    for group in (unique("orders-a"), unique("orders-b")):
        done = await asyncio.to_thread(
            run_example,
            str(EXAMPLES / "postgres_orders.py"),
            "--bootstrap",
            bootstrap,
            "--topic",
            scenario.topic,
            "--dsn",
            postgres_db,
            "--group",
            group,
            "--max",
            str(len(scenario.committed)),
            "--max-idle",
            "5",
            "--timeout",
            "40",
        )
        runs.append(orjson.loads(done.stdout.strip().splitlines()[-1]))
    total, distinct = len(scenario.committed), len(scenario.effect_keys)
    assert runs[0] == {
        "seen": total,
        "applied": distinct,
        "repeats": total - distinct,
        "skipped": 0,
        "invalid": 0,
    }
    assert runs[1] == {"seen": total, "applied": 0, "repeats": total, "skipped": 0, "invalid": 0}

    with psycopg.connect(postgres_db) as conn:
        rows = conn.execute("SELECT id, status, amount FROM orders ORDER BY id").fetchall()
        applied = {row[0] for row in conn.execute("SELECT effect_key FROM applied_commands").fetchall()}
    assert sorted(rows) == sorted(
        [*((o, "fulfilled", 4200) for o in scenario.orders), (scenario.invoice, "paid", 900)]
    )
    assert applied == scenario.effect_keys

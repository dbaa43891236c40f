"""A service applying commands to PostgreSQL with idempotent writes, using ``pipeline.downstream``.

It consumes a command topic with aiokafka and ``consumer_settings``
(read_committed, manual commits), applies each command with
``apply_once_async`` (the effect key is claimed in the same database
transaction as the effect), and commits the Kafka offsets of a batch only
after its database transactions have committed. A crash anywhere re-delivers
commands; none is applied twice.

    python examples/postgres_orders.py --bootstrap 127.0.0.1:19092 --topic webhooks.events \\
        --dsn postgresql://postgres@127.0.0.1:15432/pipeline --max-idle 5

Commands handled (the others are skipped, unclaimed, so a later version of
the service can still apply them on a replay):

- ``fulfil-order`` (Stripe ``checkout.session.completed`` or
  ``payment_intent.succeeded``; order id in ``data.object.metadata.order_id``):
  insert the order if absent (``INSERT … ON CONFLICT (id) DO NOTHING``), then
  move it from ``pending`` to ``fulfilled`` with a guarded update
  (``UPDATE … WHERE id = %s AND status = 'pending'``).
- ``invoice-final`` (``invoice.paid`` / ``invoice.voided`` /
  ``invoice.marked_uncollectible``; row id = the invoice id): set a final
  state with a conditional upsert that never leaves a final state
  (``ON CONFLICT (id) DO UPDATE … WHERE orders.status NOT IN (finals)``).

Both writes are idempotent on their own; ``apply_once`` is what makes the
non-idempotent parts of an effect (a counter, a ledger row, an e-mail queued
in the same database) safe, and records which effect keys were applied.

It prints one JSON summary line on stdout when it stops: after ``--max``
commands or ``--max-idle`` seconds without one.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import psycopg
from aiokafka import AIOKafkaConsumer, TopicPartition

from pipeline.downstream import (
    Command,
    CommandRecordError,
    apply_once_async,
    consumer_settings,
    ensure_schema_async,
)

log = logging.getLogger("postgres_orders")

ORDERS_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    id text PRIMARY KEY,
    status text NOT NULL,
    amount bigint,
    updated_at timestamptz NOT NULL
)
"""

FINAL_STATES = {
    "invoice.paid": "paid",
    "invoice.voided": "void",
    "invoice.marked_uncollectible": "uncollectible",
}

Handler = Callable[[psycopg.AsyncCursor[Any], Command], Awaitable[None]]


def _object(command: Command) -> dict[str, Any]:
    """The event's ``data.object`` (Stripe's shape), or an empty dict."""
    data = command.event.get("data")
    obj = data.get("object") if isinstance(data, dict) else None
    return obj if isinstance(obj, dict) else {}


def _event_seconds(command: Command) -> float:
    """When the provider created the event (Stripe ``created``), else when the ingress received it."""
    created = command.event.get("created")
    if isinstance(created, int | float) and not isinstance(created, bool):
        return float(created)
    return command.received_at / 1000


async def fulfil_order(cursor: psycopg.AsyncCursor[Any], command: Command) -> None:
    """Create the order if absent, then move it from pending to fulfilled."""
    obj = _object(command)
    metadata = obj.get("metadata")
    order_id = (metadata.get("order_id") if isinstance(metadata, dict) else None) or obj.get("id")
    if not isinstance(order_id, str):
        raise CommandRecordError("event.data.object.metadata.order_id", "is missing")
    amount = obj.get("amount_total", obj.get("amount_received", obj.get("amount")))
    when = _event_seconds(command)
    # idiom 1: insert-if-absent; a second copy (or another event for the same order) changes nothing
    await cursor.execute(
        "INSERT INTO orders (id, status, amount, updated_at) VALUES (%s, 'pending', %s, to_timestamp(%s))"
        " ON CONFLICT (id) DO NOTHING",
        (order_id, amount, when),
    )
    # idiom 2: a guarded state transition; only a pending order can become fulfilled
    await cursor.execute(
        "UPDATE orders SET status = 'fulfilled', updated_at = to_timestamp(%s) WHERE id = %s AND status = 'pending'",
        (when, order_id),
    )


async def invoice_final(cursor: psycopg.AsyncCursor[Any], command: Command) -> None:
    """Set the invoice's final state; a row already in a final state is never changed."""
    status = FINAL_STATES.get(command.event_type or "")
    if status is None:
        raise CommandRecordError("event_type", f"{command.event_type!r} is not a final invoice event")
    obj = _object(command)
    invoice_id = obj.get("id")
    if not isinstance(invoice_id, str):
        raise CommandRecordError("event.data.object.id", "is missing")
    amount = obj.get("amount_paid", obj.get("amount_due"))
    await cursor.execute(
        "INSERT INTO orders (id, status, amount, updated_at) VALUES (%s, %s, %s, to_timestamp(%s))"
        " ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, amount = EXCLUDED.amount,"
        " updated_at = EXCLUDED.updated_at"
        " WHERE orders.status NOT IN ('paid', 'void', 'uncollectible')",
        (invoice_id, status, amount, _event_seconds(command)),
    )


HANDLERS: dict[str, Handler] = {"fulfil-order": fulfil_order, "invoice-final": invoice_final}


async def ensure_tables(conn: psycopg.AsyncConnection[Any]) -> None:
    """Create ``orders`` and the table of applied effect keys."""
    await ensure_schema_async(conn)
    async with conn.transaction():
        await conn.execute(ORDERS_SCHEMA)


async def run(args: argparse.Namespace) -> dict[str, int]:
    """Consume until ``--max`` commands or ``--max-idle`` idle seconds; return the counts."""
    counts = {"seen": 0, "applied": 0, "repeats": 0, "skipped": 0, "invalid": 0}
    conn = await psycopg.AsyncConnection.connect(args.dsn)
    consumer = AIOKafkaConsumer(args.topic, **consumer_settings(args.bootstrap, args.group))
    try:
        await ensure_tables(conn)
        await consumer.start()
        idle_since: float | None = None
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=200)
            if not batch:
                if consumer.assignment():
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since > args.max_idle:
                        break
                continue
            idle_since = None
            offsets: dict[TopicPartition, int] = {}
            for tp, records in batch.items():
                for record in records:
                    counts["seen"] += 1
                    await apply_record(conn, record.key, record.value, counts)
                offsets[tp] = records[-1].offset + 1
            # every database transaction of the batch has committed: now the offsets may be
            await consumer.commit(offsets)
            if args.max and counts["seen"] >= args.max:
                break
    finally:
        await consumer.stop()
        await conn.close()
    return counts


async def apply_record(
    conn: psycopg.AsyncConnection[Any], key: bytes | None, value: bytes, counts: dict[str, int]
) -> None:
    """Parse one record and apply it once; invalid or unknown commands are counted and skipped."""
    try:
        command = Command.from_record(key, value)
    except CommandRecordError as exc:
        # a real service would send the record to its own dead-letter topic here
        log.warning("skipping an invalid command record: %s", exc)
        counts["invalid"] += 1
        return
    handler = HANDLERS.get(command.command)
    if handler is None:
        counts["skipped"] += 1
        return
    try:
        applied = await apply_once_async(conn, command, handler)
    except CommandRecordError as exc:
        log.warning("skipping command %s: %s", command.effect_key, exc)
        counts["invalid"] += 1
        return
    counts["applied" if applied else "repeats"] += 1
    log.info("%s %s (%s)", "applied" if applied else "repeat", command.effect_key, command.command)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"))
    parser.add_argument("--topic", default=os.environ.get("PIPELINE_COMMAND_TOPIC", "webhooks.events"))
    parser.add_argument(
        "--group", default="postgres-orders", help="consumer group (default: postgres-orders)"
    )
    parser.add_argument(
        "--dsn", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:15432/pipeline")
    )
    parser.add_argument("--max", type=int, default=0, help="stop after this many commands (0: no limit)")
    parser.add_argument(
        "--max-idle", type=float, default=5.0, help="stop after this many seconds without a command"
    )
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="stop after this many seconds in any case"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO"), stream=sys.stderr, format="%(name)s %(message)s"
    )
    counts = asyncio.run(run(args))
    print(orjson.dumps(counts).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

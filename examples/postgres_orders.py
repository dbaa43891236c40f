"""An order service applying the pipeline's commands to PostgreSQL exactly once, with ``pipeline.downstream``.

It reads typed commands with ``CommandStream`` (read_committed) and applies
each with ``apply_once_async`` under its service name (``--service``, default
``orders``): the effect key is claimed in ``<service>_applied_commands`` in
the SAME database transaction as the effect. Offsets (``--offsets``):
``kafka`` commits them to Kafka after the database commit; ``database`` stores
them in ``<service>_kafka_offsets`` in that same transaction and seeks there
on every assignment. A crash anywhere re-delivers commands; none is applied twice.

    python examples/postgres_orders.py --bootstrap 127.0.0.1:19092 \\
        --topology topologies/stripe-fulfilment.toml \\
        --dsn postgresql://postgres@127.0.0.1:15432/pipeline --max-idle 5

It fits the shipped topologies (``--topology``; it subscribes to the topics
that carry the commands it handles, or to ``--topic``):

- ``stripe-fulfilment.toml``: ``fulfil-order`` on ``shop.orders`` (Stripe
  ``checkout.session.completed`` or ``payment_intent.succeeded``, one command
  per payment: the effect stage keeps the first to arrive) and
  ``close-invoice`` on ``shop.invoices`` (``invoice.paid`` / ``invoice.voided``
  / ``invoice.marked_uncollectible``, one per invoice: the first final state).
- ``default.toml``: ``handle`` on ``webhooks.events`` for every event; the
  Stripe ones are dispatched by event type to the same two effects. Without
  effect keys both payment events of one payment arrive, so ``fulfil_order``
  is written to collapse them itself (a guarded transition per order).
- Other commands (``github.toml``'s ``build`` and ``review``, other sources'
  ``handle``) are skipped without a claim, so a later version can still apply
  them on a replay.

The effects: ``orders(id, status, amount, updated_at)`` and an outbox row in
``order_emails`` per fulfilment (a write that is not idempotent by itself:
``apply_once`` and the guarded transition keep it to one). It prints one JSON
summary line when it stops: after ``--max`` commands or ``--max-idle`` seconds
without one: ``{"seen", "applied", "repeats", "skipped", "invalid"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from pipeline import topology
from pipeline.downstream import (
    Command,
    CommandRecordError,
    CommandStream,
    PostgresOffsets,
    apply_once_async,
    ensure_schema_async,
    store_offset_async,
)
from pipeline.resources import resolve_topology

try:  # the postgres extra: one line naming it, not a traceback
    import psycopg
except ImportError:
    sys.exit("examples/postgres_orders.py needs psycopg: pip install 'webhook-pipeline[postgres]'")

log = logging.getLogger("postgres_orders")

SCHEMA = (
    (
        "CREATE TABLE IF NOT EXISTS orders ("
        " id text PRIMARY KEY, status text NOT NULL, amount bigint, updated_at timestamptz NOT NULL)"
    ),
    (
        "CREATE TABLE IF NOT EXISTS order_emails ("
        " id bigserial PRIMARY KEY, order_id text NOT NULL, kind text NOT NULL, effect_key text NOT NULL)"
    ),
)

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
    """Create the order if absent, move it from pending to fulfilled, and queue one e-mail if it moved."""
    obj = _object(command)
    metadata = obj.get("metadata")
    order_id = metadata.get("order_id") if isinstance(metadata, dict) else None
    if not isinstance(order_id, str):
        raise CommandRecordError("event.data.object.metadata.order_id", "is missing")
    amount = obj.get("amount_total", obj.get("amount_received", obj.get("amount")))
    when = _event_seconds(command)
    await cursor.execute(
        "INSERT INTO orders (id, status, amount, updated_at) VALUES (%s, 'pending', %s, to_timestamp(%s))"
        " ON CONFLICT (id) DO NOTHING",
        (order_id, amount, when),
    )
    await cursor.execute(
        "UPDATE orders SET status = 'fulfilled', updated_at = to_timestamp(%s)"
        " WHERE id = %s AND status = 'pending' RETURNING id",
        (when, order_id),
    )
    if await cursor.fetchone() is not None:
        await cursor.execute(
            "INSERT INTO order_emails (order_id, kind, effect_key) VALUES (%s, 'fulfilled', %s)",
            (order_id, command.effect_key),
        )


async def close_invoice(cursor: psycopg.AsyncCursor[Any], command: Command) -> None:
    """Set the invoice's final state; a row already in a final state is never changed."""
    status = FINAL_STATES.get(command.event_type or "")
    if status is None:
        raise CommandRecordError("event_type", f"{command.event_type!r} is not a final invoice event")
    obj = _object(command)
    invoice_id = obj.get("id")
    if not isinstance(invoice_id, str):
        raise CommandRecordError("event.data.object.id", "is missing")
    await cursor.execute(
        "INSERT INTO orders (id, status, amount, updated_at) VALUES (%s, %s, %s, to_timestamp(%s))"
        " ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, amount = EXCLUDED.amount,"
        " updated_at = EXCLUDED.updated_at"
        " WHERE orders.status NOT IN ('paid', 'void', 'uncollectible')",
        (invoice_id, status, obj.get("amount_paid", obj.get("amount_due")), _event_seconds(command)),
    )


# the command names of the shipped topologies this service applies (tests/integration check them)
HANDLERS: dict[str, Handler] = {"fulfil-order": fulfil_order, "close-invoice": close_invoice}
# the default topology's `handle` commands of Stripe events, by event type
STRIPE_EVENTS: dict[str, Handler] = {
    "checkout.session.completed": fulfil_order,
    "payment_intent.succeeded": fulfil_order,
    **dict.fromkeys(FINAL_STATES, close_invoice),
}
DEFAULT_COMMAND = "handle"


def handler_for(command: Command) -> Handler | None:
    """The effect of a command, or ``None`` when this service does not apply it."""
    if command.command == DEFAULT_COMMAND and command.source == "stripe":
        return STRIPE_EVENTS.get(command.event_type or "")
    return HANDLERS.get(command.command)


def topics_for(topo: topology.Topology) -> list[str]:
    """The topics of ``topo`` that carry a command this service handles."""
    topics = {r.topic for r in topo.routes if r.command in HANDLERS and r.topic}
    if "stripe" in topo.sources and any(topo.route("stripe", t) is None for t in STRIPE_EVENTS):
        topics.add(topo.topics.commands)  # unrouted Stripe events arrive as `handle` commands
    return sorted(topics)


async def run(args: argparse.Namespace) -> dict[str, int]:
    """Consume until ``--max`` commands or ``--max-idle`` idle seconds; return the counts."""
    counts = {"seen": 0, "applied": 0, "repeats": 0, "skipped": 0, "invalid": 0}
    topics = args.topic or topics_for(topology.load(resolve_topology(args.topology)))
    if not topics:
        raise SystemExit(f"postgres_orders: topology {args.topology} carries no command this service applies")
    in_db = args.offsets == "database"
    offsets = PostgresOffsets(args.dsn, service=args.service) if in_db else None
    async with await psycopg.AsyncConnection.connect(args.dsn) as conn:
        await ensure_schema_async(conn, service=args.service)
        async with conn.transaction():
            for statement in SCHEMA:
                await conn.execute(statement)
        stream = CommandStream(
            args.bootstrap,
            topics,
            group=args.group or args.service,
            offsets=offsets,
            idle_timeout=args.max_idle,
        )
        async with stream:
            try:
                async with asyncio.timeout(args.timeout):
                    async for command in stream:
                        counts["seen"] += 1
                        outcome = await apply(conn, command, service=args.service, store_offset=in_db)
                        counts[outcome] += 1
                        if args.max and counts["seen"] >= args.max:
                            break
            except TimeoutError:
                log.warning("stopping after --timeout %ss", args.timeout)
        counts["invalid"] += stream.invalid
    return counts


async def apply(
    conn: psycopg.AsyncConnection[Any], command: Command, *, service: str, store_offset: bool
) -> str:
    """Apply one command once; the outcome's name in the summary."""
    handler = handler_for(command)
    if handler is None:
        if store_offset:
            await store_offset_async(conn, command, service=service)
        return "skipped"
    try:
        applied = await apply_once_async(conn, command, handler, service=service, store_offset=store_offset)
    except CommandRecordError as exc:  # rolled back: not claimed; a real service would dead-letter it
        log.warning("skipping command %s: %s", command.effect_key, exc)
        if store_offset:
            await store_offset_async(conn, command, service=service)
        return "invalid"
    log.info("%s %s (%s)", "applied" if applied else "repeat", command.effect_key, command.command)
    return "applied" if applied else "repeats"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"))
    parser.add_argument(
        "--topology",
        default="stripe-fulfilment",
        help="whose command topics to read (default: stripe-fulfilment)",
    )
    parser.add_argument("--topic", action="append", help="read this topic instead (repeatable)")
    parser.add_argument("--service", default="orders", help="names the service's tables (default: orders)")
    parser.add_argument("--group", default=None, help="consumer group (default: the service name)")
    parser.add_argument("--offsets", choices=("kafka", "database"), default="kafka")
    parser.add_argument(
        "--dsn", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:15432/pipeline")
    )
    parser.add_argument("--max", type=int, default=0, help="stop after this many commands (0: no limit)")
    parser.add_argument("--max-idle", type=float, default=5.0, help="stop after this many idle seconds")
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

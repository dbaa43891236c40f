"""End-to-end helpers: a multi-provider topology, pipeline subprocesses, signed senders, a downstream consumer.

The downstream consumer is this module run as a script
(``python -m tests.integration.e2e consume ...``): ``CommandStream`` plus
``apply_once_async`` under the service ``e2e``, writing one row per applied
effect into ``e2e_effects`` and one per fulfilment into ``e2e_fulfilments``.
Neither table has a unique key, so an effect applied twice shows as two rows.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psycopg

from pipeline.downstream import Command, CommandStream, apply_once_async, ensure_schema_async
from pipeline.providers.signing import sign

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "e2e"
SECRETS = {
    "STRIPE_WEBHOOK_SECRET": "whsec_e2e_stripe_secret",
    "GITHUB_WEBHOOK_SECRET": "e2e-github-secret",
    "SVIX_WEBHOOK_SECRET": "whsec_" + base64.b64encode(b"e2e-svix-secret-32-bytes-long!!!").decode(),
}
TABLES = (
    (
        "CREATE TABLE IF NOT EXISTS e2e_effects (id bigserial PRIMARY KEY, effect_key text NOT NULL,"
        " command text NOT NULL, event_key text NOT NULL, event_type text)"
    ),
    (
        "CREATE TABLE IF NOT EXISTS e2e_fulfilments (id bigserial PRIMARY KEY, order_id text NOT NULL,"
        " payment_intent text NOT NULL, event_type text NOT NULL)"
    ),
)

log = logging.getLogger("e2e_consumer")


# --- the topology -------------------------------------------------------------------------------


def e2e_topology(path: Path, app: str, *, partitions: int = 3) -> Path:
    """topologies/stripe-fulfilment.toml with unique names, plus a GitHub and a Standard Webhooks source.

    Signatures are verified at the ingress with the secrets of :data:`SECRETS`. GitHub
    pushes become ``build`` commands on ``<app>.pushes`` (pings are dropped); the svix
    source has no route, so its events are ``handle`` commands on ``<app>.commands``.
    """
    text = (ROOT / "topologies" / "stripe-fulfilment.toml").read_text()
    text = text.replace('name = "shop"', f'name = "{app}"').replace('"shop.', f'"{app}.')
    text = text.replace("partitions = 6", f"partitions = {partitions}")
    text += f"""
[sources.github]
provider = "github"
secrets = ["GITHUB_WEBHOOK_SECRET"]
ttl = "7d"

[sources.svix]
provider = "standard-webhooks"
secrets = ["SVIX_WEBHOOK_SECRET"]
ttl = "7d"

[[routes]]
source = "github"
event = "push"
topic = "{app}.pushes"
command = "build"

[[routes]]
source = "github"
event = "ping"
drop = true
"""
    path.write_text(text)
    return path


def command_topics(app: str) -> list[str]:
    """The topics the downstream consumer reads."""
    return [f"{app}.orders", f"{app}.invoices", f"{app}.pushes", f"{app}.commands"]


# --- the events ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One provider event: where it is posted, its body, and the effect key it must produce (if any)."""

    source: str
    provider: str
    event_id: str
    body: bytes
    event_type: str | None = None  # sent in a header by header-typed providers (GitHub)
    effect_key: str | None = None


def _stripe(event_id: str, event_type: str, obj: dict[str, Any], effect: str | None) -> Event:
    body = {"id": event_id, "object": "event", "type": event_type, "created": 1_700_000_000}
    body["data"] = {"object": obj}
    return Event("stripe", "stripe", event_id, orjson.dumps(body), event_type, effect)


@dataclass
class Plan:
    """Every event of the run, and the order of each payment's two events."""

    events: list[Event] = field(default_factory=list)
    payments: list[tuple[Event, Event]] = field(default_factory=list)  # in sending order
    fulfilments: list[tuple[str, str]] = field(default_factory=list)  # (order id, PaymentIntent id)

    @property
    def effect_keys(self) -> set[str]:
        return {e.effect_key for e in self.events if e.effect_key}


def make_plan(
    rng: random.Random, token: str, *, payments: int, invoices: int, pushes: int, messages: int
) -> Plan:
    """Stripe payments (both events, random order), invoices (two final states), GitHub pushes and pings,
    Standard Webhooks messages, and Stripe events the topology drops."""
    plan = Plan()
    for i in range(payments):
        pi, order = f"pi_{token}_{i}", f"order_{token}_{i}"
        effect = f"fulfil-order:{pi}"
        session = {"id": f"cs_{token}_{i}", "payment_intent": pi, "amount_total": 4200}
        session["metadata"] = {"order_id": order}
        intent = {"id": pi, "amount_received": 4200, "metadata": {"order_id": order}}
        pair = [
            _stripe(f"evt_cs_{token}_{i}", "checkout.session.completed", session, effect),
            _stripe(f"evt_pi_{token}_{i}", "payment_intent.succeeded", intent, effect),
        ]
        rng.shuffle(pair)
        plan.payments.append((pair[0], pair[1]))
        plan.events += pair
        plan.fulfilments.append((order, pi))
    for i in range(invoices):
        invoice = f"in_{token}_{i}"
        finals = ["invoice.paid", "invoice.voided"]
        rng.shuffle(finals)
        for j, kind in enumerate(finals):
            obj = {"id": invoice, "amount_paid": 900}
            plan.events.append(_stripe(f"evt_in_{token}_{i}_{j}", kind, obj, f"close-invoice:{invoice}"))
        plan.events.append(_stripe(f"evt_cus_{token}_{i}", "customer.created", {"id": f"cus_{i}"}, None))
    for i in range(pushes):
        guid = f"{token}-push-{i}"
        body = orjson.dumps({"ref": "refs/heads/main", "after": f"{i:040x}", "repository": {"id": 1}})
        plan.events.append(Event("github", "github", guid, body, "push", f"github:{guid}"))
        if i % 7 == 0:
            ping = f"{token}-ping-{i}"
            plan.events.append(Event("github", "github", ping, b'{"zen": "Keep it simple."}', "ping"))
    for i in range(messages):
        msg = f"msg_{token}_{i}"
        body = orjson.dumps({"type": "invoice.created", "data": {"n": i}})
        plan.events.append(Event("svix", "standard-webhooks", msg, body, effect_key=f"svix:{msg}"))
    return plan


# --- senders ------------------------------------------------------------------------------------


@dataclass
class SendStats:
    """What the senders saw."""

    deliveries: int = 0
    attempts: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # status or error -> count

    def count(self, what: str) -> None:
        self.refused[what] = self.refused.get(what, 0) + 1


async def deliver(
    session: aiohttp.ClientSession, url: str, event: Event, stats: SendStats, *, deadline: float = 60.0
) -> None:
    """POST one delivery of ``event``, freshly signed each attempt, until a 2xx; at most ``deadline`` s."""
    stop = time.monotonic() + deadline
    backoff = 0.2
    while True:
        stats.attempts += 1
        headers = sign(
            event.provider,
            event.body,
            SECRETS[f"{event.source.upper()}_WEBHOOK_SECRET"],
            timestamp=time.time(),
            msg_id=event.event_id,
            event_type=event.event_type,
        )
        headers["Content-Type"] = "application/json"
        try:
            async with session.post(
                f"{url}/webhooks/{event.source}",
                data=event.body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=10),
            ) as response:
                await response.read()
                if 200 <= response.status < 300:
                    stats.deliveries += 1
                    return
                stats.count(str(response.status))
        except (aiohttp.ClientError, TimeoutError) as exc:
            stats.count(type(exc).__name__)
        if time.monotonic() + backoff > stop:
            raise AssertionError(f"{event.source} {event.event_id}: no 2xx within {deadline:g}s ({stats})")
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 1.0)


async def send_all(
    url: str, plan: Plan, rng: random.Random, stats: SendStats, *, span: float, copies: tuple[int, int]
) -> None:
    """Deliver every event ``copies`` times (1-3), spread over ``span`` seconds, each delivery retried.

    A payment's second event is sent only once its first one was acknowledged, so the
    ingress receives them in the plan's order.
    """

    async def copies_of(event: Event, start: float) -> None:
        """The first delivery (returns once acknowledged) and 0-2 more copies, concurrent with it."""
        await asyncio.sleep(start)
        for _ in range(rng.randint(*copies) - 1):
            group.create_task(delayed(event, rng.uniform(0.0, 3.0)))
        await deliver(session, url, event, stats)

    async def delayed(event: Event, delay: float) -> None:
        await asyncio.sleep(delay)
        await deliver(session, url, event, stats)

    async def payment(first: Event, second: Event, start: float) -> None:
        await copies_of(first, start)
        await copies_of(second, rng.uniform(0.0, 1.5))

    paired = {e.event_id for pair in plan.payments for e in pair}
    async with aiohttp.ClientSession() as session, asyncio.TaskGroup() as group:
        for a, b in plan.payments:
            group.create_task(payment(a, b, rng.uniform(0.0, span)))
        for event in plan.events:
            if event.event_id not in paired:
                group.create_task(copies_of(event, rng.uniform(0.0, span)))


# --- subprocesses -------------------------------------------------------------------------------


@dataclass
class Processes:
    """Named subprocesses of one test, logging to ``<logs>/<name>.log``; all killed at the end."""

    logs: Path
    environ: Mapping[str, str]
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        with self.log_path(name).open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**os.environ, **self.environ},
            )
        self.running[name] = process
        self.started.append(process)
        return process

    def log_path(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def log(self, name: str) -> str:
        path = self.log_path(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def tail(self, name: str, lines: int = 30) -> str:
        return f"--- {name}:\n" + "\n".join(self.log(name).splitlines()[-lines:])

    def kill(self, name: str) -> None:
        """SIGKILL ``name`` and reap it."""
        process = self.running[name]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)

    def alive(self, name: str) -> None:
        """Fail if ``name`` exited."""
        code = self.running[name].poll()
        if code is not None:
            raise AssertionError(f"{name} exited with {code}\n{self.tail(name)}")

    def stop_all(self) -> None:
        """SIGTERM everything still running, SIGKILL after 20 s."""
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.started:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=20)


async def wait_ready(url: str, processes: Processes, name: str, *, timeout: float = 60.0) -> None:
    """Wait until the ingress answers ``/readyz`` with 200."""
    stop = time.monotonic() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while time.monotonic() < stop:
            processes.alive(name)
            try:
                async with session.get(f"{url}/readyz") as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(f"the ingress was not ready within {timeout:g}s\n{processes.tail(name)}")


async def wait_log(processes: Processes, name: str, text: str, before: int, *, timeout: float = 60.0) -> None:
    """Wait until ``name``'s log holds more than ``before`` lines with ``text``."""
    stop = time.monotonic() + timeout
    while processes.log(name).count(text) <= before:
        processes.alive(name)
        if time.monotonic() > stop:
            raise AssertionError(f"no {text!r} from {name} within {timeout:g}s\n{processes.tail(name)}")
        await asyncio.sleep(0.2)


# --- the downstream consumer --------------------------------------------------------------------


def create_tables(dsn: str) -> None:
    """The service's tables (claims, offsets) and its two effect tables."""

    async def create() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await ensure_schema_async(conn, service=SERVICE)
            async with conn.transaction():
                for statement in TABLES:
                    await conn.execute(statement)

    asyncio.run(create())


async def record_effect(cursor: psycopg.AsyncCursor[Any], command: Command) -> None:
    """One row per applied command, and a fulfilment row for ``fulfil-order`` (from either event type)."""
    await cursor.execute(
        "INSERT INTO e2e_effects (effect_key, command, event_key, event_type) VALUES (%s, %s, %s, %s)",
        (command.effect_key, command.command, command.key, command.event_type),
    )
    if command.command == "fulfil-order":
        obj = command.event["data"]["object"]
        intent = obj["id"] if command.event_type == "payment_intent.succeeded" else obj["payment_intent"]
        await cursor.execute(
            "INSERT INTO e2e_fulfilments (order_id, payment_intent, event_type) VALUES (%s, %s, %s)",
            (obj["metadata"]["order_id"], intent, command.event_type),
        )


async def consume(args: argparse.Namespace) -> dict[str, int]:
    """Apply every command once under the service ``e2e``; offsets in Kafka after the database commit."""
    counts = {"seen": 0, "applied": 0, "repeats": 0}
    stream = CommandStream(
        args.bootstrap,
        args.topic,
        group=args.group,
        idle_timeout=args.idle,
        commit_interval=args.commit_interval,
    )
    async with await psycopg.AsyncConnection.connect(args.dsn) as conn, stream as commands:
        async for command in commands:
            counts["seen"] += 1
            applied = await apply_once_async(conn, command, record_effect, service=SERVICE)
            counts["applied" if applied else "repeats"] += 1
            log.info("%s %s", "applied" if applied else "repeat", command.effect_key)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the end-to-end test's downstream consumer")
    parser.add_argument("action", choices=["consume"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", action="append", required=True)
    parser.add_argument("--idle", type=float, default=None, help="stop after this many idle seconds")
    parser.add_argument("--commit-interval", type=float, default=1.0, help="seconds between offset commits")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    counts = asyncio.run(consume(args))
    print(orjson.dumps(counts).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

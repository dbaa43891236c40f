"""``pipeline up --demo``: a realistic stream of signed webhooks with duplicates, and live counts.

The stream mixes the topology's signed sources (Stripe, GitHub, Standard
Webhooks, …): every event once, about a third of them retried (the same event
re-signed later, as a provider retry is), one dashboard redelivery of an
early event at the end, and a few forgeries that the ingress must refuse.
The display shows what was sent and what the worker decided; the summary
says what to expect and whether it matched.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

import aiohttp
import orjson
from prometheus_client import CollectorRegistry

from pipeline.providers.signing import sign
from pipeline.topology import Source, Topology, Verify

EVENT_TYPES = {
    "stripe": ["checkout.session.completed", "payment_intent.succeeded", "invoice.paid", "customer.created"],
    "github": ["push", "pull_request", "issues"],
    "standard-webhooks": ["user.created", "invoice.paid"],
    "shopify": ["orders/create", "orders/paid"],
    "paddle": ["transaction.completed", "subscription.created"],
}


@dataclass(frozen=True)
class Delivery:
    """One HTTP delivery of the demo stream."""

    source: Source
    event_id: str
    body: bytes
    forged: bool = False


@dataclass
class Plan:
    """The stream and what it should produce."""

    deliveries: list[Delivery] = field(default_factory=list)
    unique: int = 0
    retries: int = 0
    forged: int = 0


def _body(provider: str, event_id: str, event_type: str) -> bytes:
    data = {
        "object": {"id": f"obj_{uuid.uuid4().hex[:10]}", "amount": 100 * (len(event_id) + len(event_type))}
    }
    if provider == "stripe":
        return orjson.dumps(
            {"id": event_id, "object": "event", "type": event_type, "pending_webhooks": 1, "data": data}
        )
    if provider == "paddle":
        return orjson.dumps({"event_id": event_id, "event_type": event_type, "data": data})
    return orjson.dumps({"type": event_type, "id": event_id, "data": data})


def plan(topology: Topology, events: int, *, seed: int | None = None) -> Plan:
    """A demo stream over the topology's signed sources (fresh event ids unless ``seed`` is given)."""
    rng = random.Random(seed)  # noqa: S311  (demo data, not secrets)
    sources = [
        s for s in topology.sources.values() if s.verify is not Verify.NONE and s.provider in EVENT_TYPES
    ]
    result = Plan()
    if not sources:
        return result
    originals: list[Delivery] = []
    for index in range(events):
        source = sources[index % len(sources)]
        event_id = f"evt_demo_{uuid.UUID(int=rng.getrandbits(128)).hex[:16]}"
        body = _body(source.provider, event_id, rng.choice(EVENT_TYPES[source.provider]))
        originals.append(Delivery(source, event_id, body))
    stream = list(originals)
    for original in rng.sample(originals, k=events // 3):  # provider retries, later in the stream
        stream.insert(rng.randrange(stream.index(original) + 1, len(stream) + 1), original)
    forgeries = [
        Delivery(o.source, o.event_id, o.body, forged=True)
        for o in rng.sample(originals, k=max(events // 50, 1))
    ]
    for forged in forgeries:
        stream.insert(rng.randrange(len(stream) + 1), forged)
    stream.append(originals[0])  # a manual redelivery from the dashboard, at the very end
    result.deliveries = stream
    result.unique = len(originals)
    result.retries = len(stream) - len(originals) - len(forgeries)
    result.forged = len(forgeries)
    return result


@dataclass
class Counts:
    """What was sent and what happened."""

    sent: int = 0
    accepted: int = 0
    refused: int = 0
    first: int = 0
    duplicate: int = 0
    invalid: int = 0
    commands: int = 0

    def line(self, total: int) -> str:
        """The live display line."""
        width = 24
        done = int(width * self.sent / max(total, 1))
        bar = "#" * done + "." * (width - done)
        return (
            f"[{bar}] sent {self.sent}/{total}  accepted {self.accepted}  refused {self.refused}  |  "
            f"first {self.first}  duplicate {self.duplicate}  invalid {self.invalid}  commands {self.commands}"
        )


def worker_counts(registry: CollectorRegistry, counts: Counts, baseline: Counts | None = None) -> None:
    """Read the worker's decisions from its metrics (minus ``baseline``: what it did before the demo)."""
    totals = {"first": 0.0, "duplicate": 0.0, "invalid": 0.0, "conflict": 0.0}
    commands = 0.0
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == "pipeline_events_total" and sample.labels.get("outcome") in totals:
                totals[sample.labels["outcome"]] += sample.value
            if sample.name == "pipeline_commands_total":
                commands += sample.value
    base = baseline or Counts()
    counts.first = int(totals["first"]) - base.first
    counts.duplicate = int(totals["duplicate"] + totals["conflict"]) - base.duplicate
    counts.invalid = int(totals["invalid"]) - base.invalid
    counts.commands = int(commands) - base.commands


async def run_demo(
    topology: Topology,
    base_url: str,
    registry: CollectorRegistry,
    *,
    events: int = 120,
    rate: float = 40.0,
    out: IO[str] = sys.stdout,
    secrets: Callable[[Source], list[str]] = lambda s: s.secrets(),
) -> bool:
    """Send the stream, show live counts, print the summary; return whether it matched."""
    stream = plan(topology, events)
    if not stream.deliveries:
        out.write("demo: the topology has no signed source to send to\n")
        return False
    counts, baseline = Counts(), Counts()
    worker_counts(registry, baseline)
    tty = out.isatty()
    async with aiohttp.ClientSession() as session:
        for delivery in stream.deliveries:
            secret = "whsec_forged_secret" if delivery.forged else secrets(delivery.source)[0]
            headers = sign(
                delivery.source.provider,
                delivery.body,
                secret,
                timestamp=time.time(),
                msg_id=delivery.event_id,
            )
            headers["Content-Type"] = "application/json"
            async with session.post(
                f"{base_url}/webhooks/{delivery.source.name}", data=delivery.body, headers=headers
            ) as response:
                counts.sent += 1
                if 200 <= response.status < 300:
                    counts.accepted += 1
                else:
                    counts.refused += 1
            worker_counts(registry, counts, baseline)
            out.write(counts.line(len(stream.deliveries)) + ("\r" if tty else "\n"))
            await asyncio.sleep(1 / rate)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and counts.first + counts.duplicate < counts.accepted:
            await asyncio.sleep(0.2)
            worker_counts(registry, counts, baseline)
    out.write(counts.line(len(stream.deliveries)) + "\n")
    ok = (
        counts.first == stream.unique
        and counts.commands == stream.unique
        and counts.duplicate == stream.retries
        and counts.refused == stream.forged
    )
    rows = [
        ("unique events", stream.unique, counts.first, "first (one command each)"),
        ("retries + 1 redelivery", stream.retries, counts.duplicate, "duplicate (no command)"),
        ("forgeries", stream.forged, counts.refused, "refused by the ingress (401)"),
        ("commands", stream.unique, counts.commands, "emitted to the command topics"),
    ]
    out.write("\nsummary                   expected   seen   meaning\n")
    for name, expected, seen, meaning in rows:
        mark = "ok" if expected == seen else "MISMATCH"
        out.write(f"  {name:<23} {expected:>8} {seen:>6}   {meaning}  [{mark}]\n")
    out.write("Every duplicate was suppressed.\n" if ok else "Counts do not match: see above.\n")
    return ok

"""``pipeline up --demo``: a realistic stream of signed webhooks with duplicates, and live counts.

The stream mixes the topology's signed sources (Stripe, GitHub, Standard
Webhooks, …): every event once, about a third of them retried (the same event
re-signed later, as a provider retry is), one dashboard redelivery of an
early event at the end, and a few forgeries that the ingress must refuse.
The display shows what was sent and what the worker decided; the summary
says what to expect and whether it matched.

The worker's decisions are counted from the audit and command topics, read
from their ends as they were when the demo began and only for the demo's own
event keys: records left over from an earlier run, or anything else sent to
the pipeline meanwhile, do not change the counts.
"""

from __future__ import annotations

import asyncio
import binascii
import random
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import aiohttp
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from pipeline.cancelling import cancel_and_wait
from pipeline.credentials import source_secrets
from pipeline.errors import BrokerUnavailableError, PipelineError
from pipeline.kafka.admin import partition_count
from pipeline.kafka.internals import stop_consumer
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
    forged: int = 0  # forgeries the ingress refuses (401)
    forged_in_worker: int = 0  # forgeries to ``verify = "worker"`` sources: accepted, then invalid

    def keys(self) -> set[bytes]:
        """The event keys of the stream (``<source>:<event id>``)."""
        return {f"{d.source.name}:{d.event_id}".encode() for d in self.deliveries}


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
    result.forged_in_worker = sum(1 for f in forgeries if f.source.verify is Verify.WORKER)
    result.forged = len(forgeries) - result.forged_in_worker
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

    def count(self, topic: str, value: bytes | None, audit: str, keys: set[bytes], key: bytes | None) -> None:
        """Count one committed audit or command record when it belongs to the demo's events."""
        if value is None:
            return
        try:
            record: Any = orjson.loads(value)
        except orjson.JSONDecodeError:
            return
        if not isinstance(record, dict):
            return
        if topic == audit:
            if key not in keys or record.get("stage") == "effect":
                return
            outcome = record.get("outcome")
            if outcome == "first":
                self.first += 1
            elif outcome in {"duplicate", "conflict"}:
                self.duplicate += 1
            elif outcome == "invalid":
                self.invalid += 1
        elif str(record.get("key", "")).encode() in keys:
            self.commands += 1


class Observer:
    """Reads the audit and command topics from where they ended when the demo began."""

    def __init__(self, bootstrap: str, topology: Topology, keys: set[bytes], counts: Counts) -> None:
        self.bootstrap, self.topology, self.keys, self.counts = bootstrap, topology, keys, counts
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Assign every partition of the audit and command topics at their current end."""
        topics = [self.topology.topics.audit, *self.topology.command_topics()]
        tps = []
        for topic in topics:
            count = await partition_count(self.bootstrap, topic)
            if count is None:
                raise PipelineError(f"the demo cannot read topic {topic}: it does not exist")
            tps += [TopicPartition(topic, p) for p in range(count)]
        try:
            await self._consumer.start()
        except KafkaError as exc:
            await self._consumer.stop()
            raise BrokerUnavailableError(f"the demo cannot reach Kafka at {self.bootstrap}: {exc}") from None
        await asyncio.sleep(0)  # let aiokafka's coordinator task start before any stop()
        self._consumer.assign(tps)
        await self._consumer.seek_to_end(*tps)
        for tp in tps:  # fix the start now: records committed from here on are the demo's
            await self._consumer.position(tp)
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        audit = self.topology.topics.audit
        while True:
            batch = await self._consumer.getmany(timeout_ms=200)
            for tp, records in batch.items():
                for record in records:
                    self.counts.count(tp.topic, record.value, audit, self.keys, record.key)

    async def stop(self) -> None:
        """Stop reading."""
        if self._task is not None:
            await cancel_and_wait(self._task)
        await stop_consumer(self._consumer)


async def run_demo(
    topology: Topology,
    base_url: str,
    bootstrap: str,
    *,
    events: int = 120,
    rate: float = 40.0,
    out: IO[str] = sys.stdout,
    secrets: Callable[[Source], list[str]] = source_secrets,
    settle: float = 30.0,
) -> bool:
    """Send the stream, show live counts, print the summary; return whether it matched.

    Raises PipelineError when the stream cannot be sent (no secret, the ingress
    unreachable, a signature that cannot be made).
    """
    stream = plan(topology, events)
    if not stream.deliveries:
        raise PipelineError("the demo needs a signed source (stripe, github, …) in the topology")
    counts = Counts()
    observer = Observer(bootstrap, topology, stream.keys(), counts)
    await observer.start()
    tty = out.isatty()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            for delivery in stream.deliveries:
                await _send(session, base_url, delivery, secrets, counts)
                out.write(counts.line(len(stream.deliveries)) + ("\r" if tty else "\n"))
                out.flush()
                await asyncio.sleep(1 / rate)
        total = len(stream.deliveries)
        for _ in range(int(settle / 0.2)):  # wait for the worker to decide every accepted copy
            handled = counts.first + counts.duplicate + counts.invalid
            if handled >= counts.accepted and counts.commands >= stream.unique:
                break
            await asyncio.sleep(0.2)
            if tty:
                out.write(counts.line(total) + "\r")
                out.flush()
        await asyncio.sleep(0.5)  # anything extra (a second command for one event) shows up too
    finally:
        await observer.stop()
    return summary(stream, counts, out)


async def _send(
    session: aiohttp.ClientSession,
    base_url: str,
    delivery: Delivery,
    secrets: Callable[[Source], list[str]],
    counts: Counts,
) -> None:
    name = delivery.source.name
    if delivery.forged:
        # deliberately wrong, and base64 as Standard Webhooks secrets are
        secret = "whsec_Zm9yZ2VkLWJ5LXRoZS1kZW1vLXNlY3JldA=="  # noqa: S105
    else:
        found = secrets(delivery.source)
        if not found:
            names = ", ".join(delivery.source.secret_env)
            raise PipelineError(f"the demo cannot sign for source {name}: set {names}")
        secret = found[0]
    try:
        headers = sign(
            delivery.source.provider,
            delivery.body,
            secret,
            timestamp=time.time(),
            msg_id=delivery.event_id,
            **delivery.source.options,
        )
    except (PipelineError, ValueError, binascii.Error) as exc:
        raise PipelineError(f"the demo cannot sign for source {name}: {exc}") from None
    headers["Content-Type"] = "application/json"
    url = f"{base_url}/webhooks/{name}"
    try:
        async with session.post(url, data=delivery.body, headers=headers) as response:
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise PipelineError(f"the demo could not post to {url}: {exc or type(exc).__name__}") from None
    counts.sent += 1
    if 200 <= status < 300:
        counts.accepted += 1
    elif status == 401:
        counts.refused += 1
    else:
        raise PipelineError(f"the ingress answered {status} to the demo's delivery for source {name}")


def summary(stream: Plan, counts: Counts, out: IO[str]) -> bool:
    """Print the final counts against what the stream should produce; return whether they match."""
    out.write(counts.line(len(stream.deliveries)) + "\n")
    rows = [
        ("unique events", stream.unique, counts.first, "first (one command each)"),
        ("retries + 1 redelivery", stream.retries, counts.duplicate, "duplicate (no command)"),
        ("forgeries", stream.forged, counts.refused, "refused by the ingress (401)"),
        ("commands", stream.unique, counts.commands, "emitted to the command topics"),
    ]
    if stream.forged_in_worker:
        rows.insert(3, ("forgeries (worker)", stream.forged_in_worker, counts.invalid, "invalid: to the DLQ"))
    elif counts.invalid:
        rows.append(("invalid", 0, counts.invalid, "sent to the DLQ"))
    ok = all(expected == seen for _, expected, seen, _ in rows)
    out.write("\nsummary                   expected   seen   meaning\n")
    for name, expected, seen, meaning in rows:
        mark = "ok" if expected == seen else "MISMATCH"
        out.write(f"  {name:<23} {expected:>8} {seen:>6}   {meaning}  [{mark}]\n")
    out.write("Every duplicate was suppressed.\n" if ok else "Counts do not match: see above.\n")
    out.flush()
    return ok

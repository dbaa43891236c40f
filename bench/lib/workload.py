"""The benches' workload: Stripe-like webhook bodies (1-2 KB, nested objects, line items), a stream with re-sent copies, preload keys."""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[2]


ALNUM = string.ascii_letters + string.digits


EVENT_TYPES = (
    "invoice.paid",
    "invoice.payment_failed",
    "payment_intent.succeeded",
    "payment_intent.created",
    "charge.succeeded",
    "checkout.session.completed",
    "customer.subscription.updated",
    "customer.created",
)


WORDS = [
    "premium",
    "plan",
    "annual",
    "monthly",
    "seat",
    "usage",
    "metered",
    "addon",
    "support",
    "priority",
    "storage",
    "bandwidth",
    "api",
    "calls",
    "overage",
    "credit",
    "refund",
    "proration",
    "discount",
    "coupon",
    "trial",
    "renewal",
    "upgrade",
    "downgrade",
    "team",
    "enterprise",
]


def stripe_id(rng: random.Random, prefix: str) -> str:
    return prefix + "".join(rng.choices(ALNUM, k=24))


def _line_item(rng: random.Random, currency: str) -> dict[str, Any]:
    amount = rng.randrange(100, 500_000)
    return {
        "id": stripe_id(rng, "il_"),
        "object": "line_item",
        "amount": amount,
        "currency": currency,
        "description": " ".join(rng.choices(WORDS, k=rng.randrange(2, 6))),
        "period": {
            "start": 1_700_000_000 + rng.randrange(10**6),
            "end": 1_702_592_000 + rng.randrange(10**6),
        },
        "price": {
            "id": stripe_id(rng, "price_"),
            "object": "price",
            "unit_amount": amount,
            "recurring": {"interval": rng.choice(("month", "year")), "interval_count": 1},
            "product": stripe_id(rng, "prod_"),
        },
        "quantity": rng.randrange(1, 20),
        "metadata": {},
    }


def stripe_body(rng: random.Random, event_id: str, target: int) -> bytes:
    """A Stripe-like event of about ``target`` bytes: nested objects, line items, metadata."""
    currency = rng.choice(("usd", "eur", "gbp"))
    customer = stripe_id(rng, "cus_")
    event: dict[str, Any] = {
        "id": event_id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": 1_700_000_000 + rng.randrange(10**7),
        "livemode": False,
        "pending_webhooks": rng.randrange(1, 4),
        "request": {"id": stripe_id(rng, "req_"), "idempotency_key": stripe_id(rng, "")},
        "type": rng.choice(EVENT_TYPES),
        "data": {
            "object": {
                "id": stripe_id(rng, "in_"),
                "object": "invoice",
                "amount_due": rng.randrange(100, 10**6),
                "amount_paid": rng.randrange(100, 10**6),
                "currency": currency,
                "customer": customer,
                "customer_details": {
                    "email": f"{stripe_id(rng, '')[:10].lower()}@example.com",
                    "address": {
                        "city": rng.choice(("Berlin", "Austin", "Lyon", "Leeds", "Osaka")),
                        "country": rng.choice(("DE", "US", "FR", "GB", "JP")),
                        "line1": f"{rng.randrange(1, 999)} {rng.choice(WORDS).title()} Street",
                        "postal_code": f"{rng.randrange(10000, 99999)}",
                    },
                    "tax_exempt": "none",
                },
                "lines": {"object": "list", "data": [], "has_more": False},
                "status": "paid",
                "metadata": {"order_id": str(rng.randrange(10**9)), "note": ""},
            },
            "previous_attributes": {"status": "open"},
        },
    }
    obj = event["data"]["object"]
    body = orjson.dumps(event)
    while len(body) + 460 < target:
        obj["lines"]["data"].append(_line_item(rng, currency))
        body = orjson.dumps(event)
    if len(body) < target:
        obj["metadata"]["note"] = "".join(rng.choices(ALNUM, k=target - len(body)))
        body = orjson.dumps(event)
    return body


def small_body(rng: random.Random, event_id: str) -> bytes:
    """A small (about 250 bytes) Stripe-like event, for pre-loading the store."""
    return orjson.dumps(
        {
            "id": event_id,
            "object": "event",
            "type": rng.choice(EVENT_TYPES),
            "created": 1_700_000_000 + rng.randrange(10**7),
            "data": {"object": {"id": stripe_id(rng, "in_"), "amount_paid": rng.randrange(100, 10**6)}},
        }
    )


@dataclass
class Stream:
    """Unique events and the order they are sent in (duplicates re-send an earlier event)."""

    keys: list[bytes]
    bodies: list[bytes]
    order: list[int]

    @property
    def unique(self) -> int:
        return len(self.keys)

    @property
    def duplicates(self) -> int:
        return len(self.order) - len(self.keys)

    def __len__(self) -> int:
        return len(self.order)

    def records(self) -> Iterator[tuple[bytes, bytes]]:
        for index in self.order:
            yield self.keys[index], self.bodies[index]

    def body_bytes(self) -> int:
        return sum(len(self.bodies[i]) for i in self.order)


def make_stream(rng: random.Random, total: int, dup_ratio: float, *, min_size: int, max_size: int) -> Stream:
    """``total`` records: ``total * (1 - dup_ratio)`` unique events and re-sends spread after their original."""
    unique = max(1, round(total * (1 - dup_ratio)))
    keys: list[bytes] = []
    bodies: list[bytes] = []
    seen: set[str] = set()
    while len(keys) < unique:
        event_id = stripe_id(rng, "evt_")
        if event_id in seen:
            continue
        seen.add(event_id)
        keys.append(f"stripe:{event_id}".encode())
        bodies.append(stripe_body(rng, event_id, rng.randrange(min_size, max_size + 1)))
    # A re-send lands an exponentially distributed distance after its original (mean a tenth of the stream).
    placed = [(float(i), i) for i in range(unique)]
    mean_gap = max(1.0, unique / 10)
    for _ in range(total - unique):
        original = rng.randrange(unique)
        placed.append((original + 0.5 + rng.expovariate(1 / mean_gap), original))
    placed.sort()
    return Stream(keys, bodies, [index for _, index in placed])


def preload_records(seed: int, count: int) -> Iterator[tuple[bytes, bytes]]:
    """``count`` unique small events (keys cannot collide with the main stream's: another prefix)."""
    rng = random.Random(seed)
    for n in range(count):
        event_id = f"evt_1P{n:010d}{stripe_id(rng, '')[:12]}"
        yield f"stripe:{event_id}".encode(), small_body(rng, event_id)


def source_headers(now_ms: int) -> list[tuple[str, bytes]]:
    return [("source", b"stripe"), ("received-at", str(now_ms).encode())]

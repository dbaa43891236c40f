"""Effect keys keep the FIRST command to reach the effect stage, not the earliest event or a preferred type."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.integration.harness import Env, read_committed
from tests.integration.test_effects import fulfilment_topology, stripe_event

pytestmark = [pytest.mark.broker, pytest.mark.slow]


async def wait_for(bootstrap: str, topic: str, count: int, timeout: float = 60.0) -> list[Any]:
    """Wait until ``topic`` holds ``count`` committed records; return them."""
    deadline = time.monotonic() + timeout
    records: list[Any] = []
    while time.monotonic() < deadline:
        records = await read_committed(bootstrap, topic, idle=0.5)
        if len(records) >= count:
            return records
    pytest.fail(f"{topic} holds {len(records)} records, expected {count}")


async def test_the_first_event_to_reach_the_effect_stage_wins(
    bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """payment_intent.succeeded first (though Stripe created it later) fulfils; the later checkout event is a duplicate."""
    app = unique("first")
    env = Env(bootstrap, fulfilment_topology(tmp_path / "shop.toml", app), tmp_path, f"{app}-group")
    await env.create_topics()
    order = {"order_id": "order_1"}

    def event(event_id: str, event_type: str, obj: dict[str, Any], created: int) -> tuple[Any, ...]:
        body = orjson.loads(stripe_event(event_id, event_type, obj)) | {"created": created}
        return (f"stripe:{event_id}".encode(), orjson.dumps(body), [("source", b"stripe")], None, None)

    # payment 1: the PaymentIntent event arrives first although checkout's was created earlier
    pi1 = event("evt_pi_1", "payment_intent.succeeded", {"id": "pi_1", "metadata": order}, created=200)
    cs1 = event("evt_cs_1", "checkout.session.completed", {"payment_intent": "pi_1", "metadata": order}, 100)
    # payment 2: the other way round
    cs2 = event("evt_cs_2", "checkout.session.completed", {"payment_intent": "pi_2", "metadata": order}, 100)
    pi2 = event("evt_pi_2", "payment_intent.succeeded", {"id": "pi_2", "metadata": order}, created=200)
    # an invoice voided, then paid: the first final state is the one applied
    void = event("evt_in_void", "invoice.voided", {"id": "in_1"}, created=300)
    paid = event("evt_in_paid", "invoice.paid", {"id": "in_1"}, created=100)

    env.start_worker("w1")
    await env.produce([pi1, cs2, void])
    await wait_for(bootstrap, f"{app}.orders", 2)
    await wait_for(bootstrap, f"{app}.invoices", 1)
    await env.produce([cs1, pi2, paid])
    audit: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len([a for a in audit if a.get("stage") == "effect"]) < 6:
        audit = [
            orjson.loads(r.value) for r in await read_committed(bootstrap, env.topo.topics.audit, idle=0.5)
        ]
    orders = await read_committed(bootstrap, f"{app}.orders")
    invoices = await read_committed(bootstrap, f"{app}.invoices")
    env.stop_all()

    winners = {r.key.decode(): orjson.loads(r.value) for r in orders + invoices}
    assert {k: (v["key"], v["event_type"]) for k, v in winners.items()} == {
        "fulfil-order:pi_1": ("stripe:evt_pi_1", "payment_intent.succeeded"),
        "fulfil-order:pi_2": ("stripe:evt_cs_2", "checkout.session.completed"),
        "close-invoice:in_1": ("stripe:evt_in_void", "invoice.voided"),
    }
    assert len(orders) == 2
    assert len(invoices) == 1
    effect = {a["event_key"]: a["outcome"] for a in audit if a.get("stage") == "effect"}
    assert effect == {
        "stripe:evt_pi_1": "first",
        "stripe:evt_cs_1": "duplicate",
        "stripe:evt_cs_2": "first",
        "stripe:evt_pi_2": "duplicate",
        "stripe:evt_in_void": "first",
        "stripe:evt_in_paid": "duplicate",
    }

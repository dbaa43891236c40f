"""Effect keys: two different Stripe events for one payment produce exactly one fulfil-order command."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.integration.harness import ROOT, Env, read_committed, wait_for_audit

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def fulfilment_topology(path: Path, app: str) -> Path:
    """topologies/stripe-fulfilment.toml with unique topic names and no signature checks."""
    text = (ROOT / "topologies" / "stripe-fulfilment.toml").read_text()
    text = text.replace('name = "shop"', f'name = "{app}"').replace('"shop.', f'"{app}.')
    text = text.replace('ttl = "7d"', 'ttl = "7d"\nverify = "none"').replace(
        "partitions = 6", "partitions = 3"
    )
    path.write_text(text)
    return path


def stripe_event(event_id: str, event_type: str, obj: dict[str, Any]) -> bytes:
    """A Stripe event body."""
    return orjson.dumps(
        {
            "id": event_id,
            "object": "event",
            "type": event_type,
            "pending_webhooks": 1,
            "data": {"object": obj},
        }
    )


def payment_events(index: int) -> list[tuple[str, bytes]]:
    """checkout.session.completed and payment_intent.succeeded for payment ``index``."""
    pi, order = f"pi_{index}", {"order_id": f"order_{index}"}
    session = {"id": f"cs_{index}", "payment_intent": pi, "amount_total": 4200, "metadata": order}
    intent = {"id": pi, "amount": 4200, "metadata": order}
    return [
        (f"evt_cs_{index}", stripe_event(f"evt_cs_{index}", "checkout.session.completed", session)),
        (f"evt_pi_{index}", stripe_event(f"evt_pi_{index}", "payment_intent.succeeded", intent)),
    ]


async def test_both_payment_events_delivered_repeatedly_fulfil_each_order_once(
    bootstrap: str, tmp_path: Path, unique: Callable[[str], str], postgres_db: str
) -> None:
    """Each payment's two events, delivered 2-3 times, a SIGKILL mid-stream: one fulfil-order and one row each."""
    app = unique("shop")
    env = Env(bootstrap, fulfilment_topology(tmp_path / "shop.toml", app), tmp_path, f"{app}-group")
    await env.create_topics()
    rng = random.Random(5)
    payments = 60
    stream: list[tuple[bytes, bytes]] = []
    for index in range(payments):
        for event_id, body in payment_events(index):
            stream += [(f"stripe:{event_id}".encode(), body)] * rng.randint(2, 3)
    stream.append((b"stripe:evt_inv_1", stripe_event("evt_inv_1", "invoice.paid", {"id": "in_1"})))
    stream.append((b"stripe:evt_inv_2", stripe_event("evt_inv_2", "invoice.voided", {"id": "in_1"})))
    stream.append((b"stripe:evt_other", stripe_event("evt_other", "customer.created", {"id": "cus_1"})))
    rng.shuffle(stream)
    half = len(stream) // 2

    def records(
        items: list[tuple[bytes, bytes]],
    ) -> list[tuple[bytes, bytes, list[tuple[str, bytes]], None, None]]:
        return [(key, body, [("source", b"stripe")], None, None) for key, body in items]

    worker = env.start_worker("w1")
    await env.produce(records(stream[:half]))
    await env.wait_assigned("w1", before=0)
    await asyncio.sleep(rng.uniform(0.3, 1.0))
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    env.start_worker("w1")
    await env.produce(records(stream[half:]))

    audit = await wait_for_audit(env, len(stream) + 2 * payments + 2, timeout=120)
    orders = await read_committed(bootstrap, f"{app}.orders")
    invoices = await read_committed(bootstrap, f"{app}.invoices")
    commands = await read_committed(bootstrap, f"{app}.commands")
    env.stop_all()

    fulfilments = Counter(r.key.decode() for r in orders)
    assert fulfilments == Counter({f"fulfil-order:pi_{i}": 1 for i in range(payments)})
    values = [orjson.loads(r.value) for r in orders]
    assert {v["command"] for v in values} == {"fulfil-order"}
    assert len(invoices) == 1  # the first final state of in_1 wins
    assert commands == []  # customer.created is dropped by an explicit route
    stages = Counter(a.get("stage", "event") for a in audit)
    assert stages["event"] == len(stream)
    assert stages["effect"] == 2 * payments + 2

    for run in range(2):  # the second run replays the topic from the start: nothing changes
        applied = subprocess.run(
            [
                sys.executable,
                str(ROOT / "examples" / "postgres_orders.py"),
                "--bootstrap",
                bootstrap,
                "--topic",
                f"{app}.orders",
                "--dsn",
                postgres_db,
                "--group",
                unique(f"orders-{run}"),
                "--max-idle",
                "3",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert applied.returncode == 0, applied.stderr
    with psycopg.connect(postgres_db) as conn:
        rows = conn.execute("SELECT id, status FROM orders ORDER BY id").fetchall()
        claims = conn.execute("SELECT count(*) FROM orders_applied_commands").fetchone()
    assert sorted(rows) == sorted((f"order_{i}", "fulfilled") for i in range(payments))
    assert claims == (payments,)

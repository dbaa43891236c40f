"""End to end: signed webhooks of three providers, with duplicates and SIGKILLs, to exactly one row per effect.

Senders post signed Stripe, GitHub and Standard Webhooks events (each 1-3 times,
retried on any non-2xx or connection error) to a real ``pipeline ingress``; a
real ``pipeline worker`` emits the commands; the downstream consumer of
``tests/integration/e2e.py`` (``CommandStream`` + ``apply_once_async``) applies
them to PostgreSQL. During the run the ingress, the worker and the consumer are
each SIGKILLed and restarted. The database must end with exactly one effect row
per unique effect and one fulfilment per payment.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
import psycopg
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from pipeline import topology
from pipeline.kafka.admin import ensure_topics, topic_specs
from tests.integration.e2e import (
    ROOT,
    SECRETS,
    Processes,
    SendStats,
    command_topics,
    create_tables,
    e2e_topology,
    make_plan,
    send_all,
    wait_log,
    wait_ready,
)
from tests.integration.faults import free_port, records

pytestmark = [pytest.mark.broker, pytest.mark.slow]

SPAN = 24.0  # seconds over which the first deliveries are spread
KILLS = (("ingress", 4.0), ("consumer", 9.0), ("worker", 14.0))  # seconds after sending starts
ASSIGNED = "partitions assigned"


async def _delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(names)
    except KafkaError:  # best effort: the topics are unique to this test
        pass
    finally:
        await admin.close()


async def test_signed_webhooks_through_crashes_apply_each_effect_once(
    bootstrap: str, tmp_path: Path, unique: Callable[[str], str], postgres_db: str
) -> None:
    """SIGKILL of ingress, worker and consumer mid-run: one row per unique effect, one fulfilment per payment."""
    started = time.monotonic()
    app = unique("e2e")
    token = app.rsplit("-", 1)[1]
    path = e2e_topology(tmp_path / f"{app}.toml", app)
    specs = topic_specs(topology.load(path))
    await ensure_topics(bootstrap, specs)
    await asyncio.to_thread(create_tables, postgres_db)

    rng = random.Random(14)
    plan = make_plan(rng, token, payments=30, invoices=5, pushes=20, messages=20)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    group, consumer_group = f"{app}-workers", f"{app}-e2e"
    topics = command_topics(app)
    consumer_args = ["-m", "tests.integration.e2e", "consume", "--bootstrap", bootstrap]
    consumer_args += ["--dsn", postgres_db, *(a for t in topics for a in ("--topic", t))]
    common = ["--bootstrap", bootstrap, "--topology", str(path)]
    worker = ["--state-dir", str(tmp_path / "state"), "--group", group, "--session-timeout-ms", "6000"]
    args = {
        "ingress": ["-m", "pipeline", "ingress", *common, "--port", str(port)],
        "worker": ["-m", "pipeline", "worker", *common, *worker],
        # offsets committed every 5 s: the SIGKILL leaves applied commands to be delivered again
        "consumer": [*consumer_args, "--group", consumer_group, "--commit-interval", "5"],
    }
    procs = Processes(tmp_path / "logs", {**SECRETS, "PIPELINE_LOG_LEVEL": "INFO"})
    stats = SendStats()

    async def chaos(sending_started: float) -> None:
        for name, at in KILLS:
            await asyncio.sleep(max(0.0, sending_started + at - time.monotonic()))
            assignments = procs.log(name).count(ASSIGNED)
            procs.kill(name)
            await asyncio.sleep(1.0)
            procs.start(name, args[name])
            if name == "ingress":
                await wait_ready(url, procs, name)
            elif name == "worker":
                await wait_log(procs, name, ASSIGNED, assignments)

    def db_state() -> tuple[Counter[str], list[tuple[str, str, str]]]:
        with psycopg.connect(postgres_db) as conn:
            effects = Counter(r[0] for r in conn.execute("SELECT effect_key FROM e2e_effects"))
            fulfilments = conn.execute(
                "SELECT order_id, payment_intent, event_type FROM e2e_fulfilments"
            ).fetchall()
        return effects, fulfilments

    expected = plan.effect_keys
    try:
        for name in ("ingress", "worker", "consumer"):
            procs.start(name, args[name])
        await wait_ready(url, procs, "ingress")
        await wait_log(procs, "worker", ASSIGNED, 0)

        sending = time.monotonic()
        await asyncio.wait_for(
            asyncio.gather(
                send_all(url, plan, rng, stats, span=SPAN, copies=(1, 3)),
                chaos(sending),
            ),
            timeout=SPAN + 150,
        )
        sent_in = time.monotonic() - sending

        deadline = time.monotonic() + 120
        while True:
            for name in ("ingress", "worker", "consumer"):
                procs.alive(name)
            effects, _ = await asyncio.to_thread(db_state)
            if set(effects) >= expected or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
        await asyncio.sleep(3.0)  # a late extra would show up now
        procs.stop_all()

        # the worker wrote one command per effect key, and nothing went to the DLQ
        commands: Counter[str] = Counter()
        for topic in topics:
            commands.update(r.key.decode() for r in await records(bootstrap, topic))
        dlq = await records(bootstrap, f"{app}.dlq")
        # a new consumer group replays the command topics (checked below, with the rows after it)
        replay = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, *consumer_args, "--group", f"{consumer_group}-replay", "--idle", "4"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        effects, fulfilments = await asyncio.to_thread(db_state)
    except BaseException:
        print("\n".join(procs.tail(n) for n in ("ingress", "worker", "consumer")), file=sys.stderr)
        raise
    finally:
        procs.stop_all()
        await _delete_topics(bootstrap, [s.name for s in specs])

    winners = Counter(kind for _, _, kind in fulfilments)
    sent_first = {first.effect_key: first.event_type for first, _ in plan.payments}
    won_first = sum(sent_first.get(f"fulfil-order:{pi}") == kind for _, pi, kind in fulfilments)
    print(
        f"\nend-to-end: {len(plan.events)} events, {stats.deliveries} deliveries acknowledged in "
        f"{stats.attempts} attempts (refused: {stats.refused}), sent in {sent_in:.1f}s; "
        f"{len(expected)} effects; consumer repeats across restarts: {procs.log('consumer').count(' repeat ')}; "
        f"fulfilled by {dict(winners)}, {won_first} by the event sent first; "
        f"{time.monotonic() - started:.1f}s in all"
    )
    assert stats.refused, "no sender saw the ingress down"
    assert dlq == []
    missing = expected - set(effects)
    assert not missing, f"{len(missing)} effects missing, e.g. {sorted(missing)[:5]}"
    assert set(effects) == expected, f"unexpected effects: {sorted(set(effects) - expected)[:5]}"
    assert {k: n for k, n in effects.items() if n != 1} == {}, "an effect was applied more than once"
    # one fulfilment per checkout, of the right PaymentIntent
    assert Counter((order, pi) for order, pi, _ in fulfilments) == Counter(dict.fromkeys(plan.fulfilments, 1))
    # either event type may reach the effect stage first, and both did
    assert set(winners) == {"checkout.session.completed", "payment_intent.succeeded"}
    assert commands == Counter(dict.fromkeys(expected, 1))
    # a new consumer group replays every command topic: all repeats, nothing applied again
    assert replay.returncode == 0, replay.stderr[-3000:]
    summary = orjson.loads(replay.stdout.strip().splitlines()[-1])
    assert summary == {"seen": len(expected), "applied": 0, "repeats": len(expected)}

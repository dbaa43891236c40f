"""``pipeline dlq list`` and ``pipeline dlq replay`` against the real broker: redrive after the cause is fixed."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from pipeline.contract import Delivery, command_value
from pipeline.dead_letter import dlq_value
from pipeline.errors import PipelineError
from pipeline.headers import COMMAND_TOPIC_HEADER, EFFECT_TTL_HEADER
from pipeline.kafka.partitioner import owner_partition
from pipeline.ops.dlq import replay
from pipeline.ops.dlq_records import DlqFilter
from pipeline.providers.signing import sign
from tests.chaos.cluster import Broker
from tests.integration.harness import (
    ROOT,
    Env,
    command_counts,
    read_committed,
    set_max_message_bytes,
    wait_for_audit,
    write_topology,
)

pytestmark = pytest.mark.broker

MakeEnv = Callable[..., Any]
OUTAGE_S = 8.0  # how long the broker stays down mid-replay: longer than any idle window a scan might have
SECRET = "gh-dlq-replay-secret"


def _cli(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "dlq",
            *args,
            "--bootstrap",
            env.bootstrap,
            "--topology",
            str(env.topology_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def _github(delivery_id: str, secret: str) -> tuple[bytes, bytes, list[tuple[str, bytes]], None, int]:
    """A GitHub push as the ingress writes it: key, body, contract headers and the signed HTTP headers."""
    body = orjson.dumps({"ref": "refs/heads/main", "after": delivery_id})
    received = int(time.time() * 1000)
    signed = sign("github", body, secret, timestamp=received / 1000, msg_id=delivery_id, event_type="push")
    headers = [("source", b"github"), ("received-at", str(received).encode())]
    headers += [(f"http-{name.lower()}", value.encode()) for name, value in signed.items()]
    headers.append(("http-x-latin1", b"caf\xe9"))  # not UTF-8: must survive the DLQ byte for byte
    return (f"github:{delivery_id}".encode(), body, headers, None, received)


async def _records(env: Env, topic: str) -> list[Any]:
    return await read_committed(env.bootstrap, topic, idle=1.0)


async def _wait_commands(env: Env, expected: int, timeout: float = 60.0) -> Counter[str]:
    """Wait until the command topic holds ``expected`` records (and a little longer, to see extras)."""
    deadline = time.monotonic() + timeout
    counts: Counter[str] = Counter()
    while time.monotonic() < deadline:
        counts = command_counts(await _records(env, env.topo.topics.commands))
        if sum(counts.values()) >= expected:
            break
        await asyncio.sleep(0.5)
    return counts


async def test_replay_after_the_secret_is_fixed_gives_each_event_one_command(pipeline_env: MakeEnv) -> None:
    """Bad signatures are replayed once the right secret is set: one command each, however often replayed."""
    variable = f"DLQ_REPLAY_GH_{os.getpid()}_{time.monotonic_ns()}"
    env: Env = await pipeline_env(secrets={"github": variable}, verify="worker")
    ids = ["d-1", "d-2", "d-3"]
    os.environ[variable] = "a-stale-secret"
    try:
        env.start_worker("stale")
        await env.produce([_github(i, SECRET) for i in [*ids, "d-1"]])
        audit = await wait_for_audit(env, 4)
    finally:
        env.stop_all()
        os.environ[variable] = SECRET
    assert [a.get("reason") for a in audit] == ["bad-signature"] * 4

    listed = _cli(env, "list", "--reason", "bad-signature")
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == 5
    assert listed.stdout.splitlines()[-1] == "4 records: bad-signature 4"
    as_json = _cli(env, "list", "--json", "--key", "github:d-2")
    assert [orjson.loads(line)["key"] for line in as_json.stdout.splitlines()] == ["github:d-2"]

    try:
        env.start_worker("fixed")
        await env.produce([_github("d-3", SECRET)])  # the provider delivered d-3 again meanwhile
        await wait_for_audit(env, 5)

        dry = _cli(env, "replay", "--reason", "bad-signature", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert dry.stdout.count(f"would replay {env.topo.topics.dlq}:") == 4
        assert "would replay 4 records: bad-signature 4" in dry.stdout
        assert len(await _records(env, env.topo.topics.input)) == 5  # the dry run produced nothing

        first = _cli(env, "replay", "--reason", "bad-signature")
        assert first.returncode == 0, first.stderr
        assert "replayed 4 records: bad-signature 4" in first.stdout
        audit = await wait_for_audit(env, 9)
        second = _cli(env, "replay", "--reason", "bad-signature")
        assert second.returncode == 0, second.stderr
        audit = await wait_for_audit(env, 13)
    finally:
        del os.environ[variable]

    assert await _wait_commands(env, 3) == Counter({f"github:{i}": 1 for i in ids})
    dlq = await _records(env, env.topo.topics.dlq)
    assert len(dlq) == 4  # nothing replayed failed again
    replayed = [a for a in audit if "replayed_from" in a]
    assert len(replayed) == 8
    assert Counter(a["outcome"] for a in replayed) == Counter({"first": 2, "duplicate": 6})
    assert {a["replayed_from"] for a in replayed} == {
        f"{env.topo.topics.dlq}:{r.partition}:{r.offset}" for r in dlq
    }
    inputs = await _records(env, env.topo.topics.input)
    replays = [r for r in inputs if "replayed-from" in dict(r.headers)]
    assert len(replays) == 8
    for record in replays:  # the original bytes, on the key's partition
        assert record.partition == owner_partition(record.key, env.topo.topics.partitions)
        assert ("http-x-latin1", b"caf\xe9") in record.headers


async def test_replay_after_the_topology_is_corrected_skips_what_it_cannot_rebuild(
    pipeline_env: MakeEnv,
) -> None:
    """Unknown-source records get their commands once the source exists; a truncated record is skipped and counted."""
    env: Env = await pipeline_env()
    env.start_worker("before")
    shop = [("source", b"shopify")]
    await env.produce(
        [(f"shopify:ev-{i}".encode(), orjson.dumps({"id": i}), shop, None, None) for i in range(3)]
        + [(b"stripe:evt_junk", b"not json", [("source", b"stripe")], None, None)]
    )
    await wait_for_audit(env, 4)
    env.stop_all()
    truncated = {
        "reason": "unknown-source",
        "topic": env.topo.topics.input,
        "truncated": True,
        "key": "x",
        "value_bytes": 2_000_000,
    }
    producer = AIOKafkaProducer(bootstrap_servers=env.bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(env.topo.topics.dlq, orjson.dumps(truncated), key=b"x")
    finally:
        await producer.stop()

    app = env.topo.app
    extra = '[sources.shopify]\nprovider = "shopify"\nverify = "none"\nttl = "7d"\n'
    write_topology(env.topology_path, app, extra=extra)
    env.start_worker("after")
    result = _cli(env, "replay", "--reason", "unknown-source", "--since", "1h")
    assert result.returncode == 1
    assert "replayed 3 records: unknown-source 3" in result.stdout
    assert "truncated" in next(line for line in result.stdout.splitlines() if line.startswith("skip "))
    assert result.stderr.strip().splitlines()[-1].startswith("pipeline: 1 DLQ records cannot be replayed")
    assert await _wait_commands(env, 3) == Counter({f"shopify:ev-{i}": 1 for i in range(3)})
    audit = await wait_for_audit(env, 7)
    assert sum("replayed_from" in a for a in audit) == 3
    assert not any(a.get("key") == "stripe:evt_junk" and "replayed_from" in a for a in audit)


def _dlq_record(input_topic: str, index: int, reason: str) -> tuple[bytes, bytes]:
    """A replayable DLQ record of a 1 KiB input record, keyed like the worker keys it."""
    key = f"shopify:ev-{index}"
    body = orjson.dumps({"id": index, "pad": "x" * 1000})
    value = {
        "error": "no source 'shopify'",
        "reason": reason,
        "topic": input_topic,
        "partition": 0,
        "offset": index,
        "timestamp": int(time.time() * 1000),
        "key": key,
        "headers": {"source": "shopify"},
        "headers_base64": [["source", base64.b64encode(b"shopify").decode()]],
        "value": body.decode(),
        "value_base64": base64.b64encode(body).decode(),
    }
    return key.encode(), orjson.dumps(value)


def _start_after(broker: Broker, seconds: float) -> None:
    time.sleep(seconds)
    broker.start()


@pytest.mark.slow
@pytest.mark.parametrize("chosen", ["every record", "the last 400"])
async def test_a_broker_outage_mid_replay_replays_every_record_exactly_once_or_fails_loudly(
    own_broker: Broker, tmp_path: Path, chosen: str
) -> None:
    """The broker goes down for 8 s after the first DLQ fetch: the replay reads every DLQ partition to the end it read
    first and produces each chosen record once (or fails with the one line), never a short run that exits cleanly.

    With only the last records chosen nothing is being sent during the outage, so nothing but the end offsets
    keeps the read going (before the fix it ended after 5 s of silence and exited 0 having replayed none)."""
    await asyncio.to_thread(own_broker.start)
    app = f"app-{uuid.uuid4().hex[:10]}"
    env = Env(own_broker.bootstrap, write_topology(tmp_path / f"{app}.toml", app), tmp_path, f"{app}-group")
    await env.create_topics()
    topo = env.topo
    total = 4000  # about 2.5 MB per DLQ partition: several fetches each
    tail = total if chosen == "every record" else 400
    producer = AIOKafkaProducer(bootstrap_servers=own_broker.bootstrap, acks="all", linger_ms=20)
    await producer.start()
    try:
        for index in range(total):
            reason = "unknown-source" if index >= total - tail else "bad-body"
            key, value = _dlq_record(topo.topics.input, index, reason)
            await producer.send(topo.topics.dlq, value, key=key, partition=index % topo.topics.partitions)
        await producer.flush()
    finally:
        await producer.stop()

    outage: list[threading.Thread] = []

    def progress(scanned: int, of: int, _: int) -> None:
        if outage or scanned >= of:
            return
        own_broker.stop()  # here, between two fetches: the replay's consumer and producer lose the broker
        back = threading.Thread(target=_start_after, args=(own_broker, OUTAGE_S))
        back.start()
        outage.append(back)

    flt = DlqFilter(reasons=frozenset({"unknown-source"}))
    try:
        report = await replay(
            own_broker.bootstrap, topo, flt, dry_run=False, out=io.StringIO(), progress=progress, timeout=120
        )
        failure = None
    except PipelineError as exc:
        report, failure = None, str(exc)
    finally:
        for thread in outage:  # the broker is back (or failed to start) before anything else
            await asyncio.to_thread(thread.join)
    assert outage, "the broker was never stopped: the DLQ was read in one fetch"

    inputs = await read_committed(own_broker.bootstrap, topo.topics.input, idle=1.0, timeout=120)
    sources = Counter(dict(r.headers)["replayed-from"].decode() for r in inputs)
    assert all(n == 1 for n in sources.values()), "a DLQ record was replayed twice"
    if failure is None:
        assert report is not None
        assert report.count == tail
        assert len(sources) == tail  # exit 0 means every chosen DLQ record reached the input topic
        assert {int(r.key.decode().rsplit("-", 1)[1]) for r in inputs} == set(range(total - tail, total))
    else:  # the outage outlasted what the replay waits: one line, saying how far it got
        assert "\n" not in failure
        assert failure.startswith("replay stopped: ")
        assert "records replayed so far (running it again is safe" in failure


def _checkout(
    event_id: str, payment: str, *, pad: int
) -> tuple[bytes, bytes, list[tuple[str, bytes]], None, None]:
    """A Stripe checkout.session.completed for ``payment`` (its effect key), ``pad`` bytes of filler."""
    session = {"id": f"cs_{event_id}", "payment_intent": payment, "pad": "x" * pad}
    body = orjson.dumps(
        {"id": event_id, "object": "event", "type": "checkout.session.completed", "data": {"object": session}}
    )
    return (f"stripe:{event_id}".encode(), body, [("source", b"stripe")], None, None)


def _old_effect_dlq_record(env: Env, orders: str, payment: str) -> tuple[bytes, bytes]:
    """The DLQ record an older worker's effect stage wrote for a command its command topic refused (too-large)."""
    key = f"fulfil-order:{payment}".encode()
    received = int(time.time() * 1000)
    command = command_value(
        command="fulfil-order",
        key=f"stripe:evt_{payment}",
        effect_key=key.decode(),
        source="stripe",
        event_type="checkout.session.completed",
        received_at=received,
        body=orjson.dumps({"id": f"evt_{payment}", "type": "checkout.session.completed"}),
    )
    headers = ((EFFECT_TTL_HEADER, b"604800000"), (COMMAND_TOPIC_HEADER, orders.encode()))
    effects = env.topo.topics.effects
    delivery = Delivery(
        effects, owner_partition(key, env.topo.topics.partitions), 3, received, key, command, headers
    )
    error = f"a command of {len(command)} bytes is larger than {orders} takes"
    return key, dlq_value(delivery, error=error, reason="too-large")


async def test_a_command_too_large_for_its_command_topic_is_replayed_into_one_command_once_the_limit_is_raised(
    pipeline_env: MakeEnv, unique: Callable[[str], str]
) -> None:
    """The route's command topic takes less than the effect's command: the event goes to the DLQ from the event stage,
    its key unclaimed; an effect-stage DLQ record of an older version waits there too. Once the limit is raised,
    `pipeline dlq replay` (twice) gives exactly one command for each, and nothing more."""
    orders = unique("orders")
    route = (
        f'[[routes]]\nsource = "stripe"\nevent = "checkout.session.completed"\ntopic = "{orders}"\n'
        'command = "fulfil-order"\neffect_key = "data.object.payment_intent"\n'
    )
    env: Env = await pipeline_env(extra=route)
    await set_max_message_bytes(env, orders, 3000)
    env.start_worker("w1")
    await env.produce([_checkout("evt_big", "pi_big", pad=4000), _checkout("evt_small", "pi_small", pad=10)])
    audit = await wait_for_audit(env, 3)  # big: invalid; small: first, then first at the effect stage
    old_key, old_value = _old_effect_dlq_record(env, orders, "pi_old")
    producer = AIOKafkaProducer(bootstrap_servers=env.bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(env.topo.topics.dlq, old_value, key=old_key)
    finally:
        await producer.stop()
    env.stop_all()

    assert [(a["key"], a["reason"]) for a in audit if a["outcome"] == "invalid"] == [
        ("stripe:evt_big", "too-large")
    ]
    dead = {r.key: orjson.loads(r.value) for r in await _records(env, env.topo.topics.dlq)}
    assert dead[b"stripe:evt_big"]["topic"] == env.topo.topics.input  # the event stage's: unclaimed
    assert dead[old_key]["topic"] == env.topo.topics.effects
    effects = await _records(env, env.topo.topics.effects)
    assert [r.key for r in effects] == [b"fulfil-order:pi_small"]

    await set_max_message_bytes(env, orders, 4 * 1024 * 1024)
    env.start_worker("w1")  # the limits are read at start
    first = _cli(env, "replay")
    assert first.returncode == 0, first.stderr
    assert "replayed 2 records: too-large 2 to " in first.stdout
    assert f"-> {env.topo.topics.effects}:" in first.stdout
    await wait_for_audit(env, 6)
    second = _cli(env, "replay")
    assert second.returncode == 0, second.stderr
    audit = await wait_for_audit(env, 8)
    await asyncio.sleep(2.0)  # time for a command too many to show
    env.stop_all()

    commands = await read_committed(env.bootstrap, orders, idle=1.0)
    assert Counter(r.key.decode() for r in commands) == Counter(
        {"fulfil-order:pi_small": 1, "fulfil-order:pi_big": 1, "fulfil-order:pi_old": 1}
    )
    assert len(audit) == 8, audit
    replays = Counter((a.get("stage", "event"), a["outcome"]) for a in audit) - Counter(
        {("event", "invalid"): 1, ("event", "first"): 1, ("effect", "first"): 1}  # before the replays
    )
    assert replays == Counter(
        {("event", "first"): 1, ("effect", "first"): 2, ("event", "duplicate"): 1, ("effect", "duplicate"): 1}
    ), audit

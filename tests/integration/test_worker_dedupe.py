"""The worker emits one command per event key: within a batch, across batches, after restarts."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from pipeline.kafka.partitioner import owner_partition
from pipeline.providers.signing import sign
from tests.integration.harness import Env, command_counts, read_committed, wait_for_audit, wrong_partition

pytestmark = pytest.mark.broker

MakeEnv = Callable[..., Any]
DAY_MS = 86_400_000


async def test_copies_in_one_batch_across_batches_and_after_a_restart_make_one_command(
    pipeline_env: MakeEnv,
) -> None:
    """Copies of an event in one batch, in later batches and after a restart produce exactly one command."""
    env: Env = await pipeline_env()
    ids = [f"evt_{i}" for i in range(50)]
    await env.produce_stripe(ids + ids + ids[:10])  # copies inside the first batch
    worker = env.start_worker("w1")
    await wait_for_audit(env, 110)
    await env.produce_stripe(ids[:25])  # copies in later batches
    await wait_for_audit(env, 135)
    env.stop_all()
    assert worker.returncode == 0, env.log_tail("w1")

    env.start_worker("w1")  # same state dir: the store remembers
    await env.produce_stripe([*ids[25:], "evt_new"])
    audit = await wait_for_audit(env, 161)
    commands = await read_committed(env.bootstrap, env.topo.topics.commands)

    assert command_counts(commands) == Counter({f"stripe:{e}": 1 for e in [*ids, "evt_new"]})
    outcomes = Counter(a["outcome"] for a in audit)
    assert outcomes == Counter({"first": 51, "duplicate": 110})


async def test_command_records_follow_the_contract(pipeline_env: MakeEnv) -> None:
    """A command carries the contract's fields with the parsed event, keyed by the effect key."""
    env: Env = await pipeline_env()
    await env.produce_stripe(["evt_contract"])
    env.start_worker("w1")
    await wait_for_audit(env, 1)
    [command] = await read_committed(env.bootstrap, env.topo.topics.commands)
    value = orjson.loads(command.value)
    assert command.key == b"stripe:evt_contract"
    assert value["key"] == value["effect_key"] == "stripe:evt_contract"
    assert value["source"] == "stripe"
    assert value["event_type"] == "invoice.paid"
    assert value["event"]["id"] == "evt_contract"
    assert set(value) == {"command", "key", "effect_key", "source", "event_type", "received_at", "event"}


async def test_ttl_is_measured_on_record_timestamps_and_replays_decide_the_same(
    pipeline_env: MakeEnv,
) -> None:
    """A copy older than the TTL by record time is processed again, one inside it is not; a replay agrees."""
    env: Env = await pipeline_env(ttl="1d")
    # recent timestamps: the broker's time-based retention would delete records from long ago
    t0 = int(time.time() * 1000) - int(1.2 * DAY_MS)
    plan = [
        ("evt_a", t0),
        ("evt_a", t0 + DAY_MS // 2),  # inside the TTL: duplicate
        ("evt_b", t0 + DAY_MS // 2),
        ("evt_a", t0 + DAY_MS + 1),  # past the TTL counted from first sight: processed again
        ("evt_b", t0 + DAY_MS + 2),  # inside b's TTL: duplicate
        ("evt_a", t0 + DAY_MS + 3),  # inside a's new TTL: duplicate
    ]
    for event_id, ts in plan:  # one at a time keeps their order across partitions irrelevant
        await env.produce_stripe([event_id], timestamp_ms=ts)
    env.start_worker("w1")
    audit = await wait_for_audit(env, len(plan))
    decided = sorted((a["offset"], a["key"], a["outcome"]) for a in audit if a["key"] == "stripe:evt_a")
    assert [o for _, _, o in decided] == ["first", "duplicate", "first", "duplicate"]
    decided_b = sorted((a["offset"], a["outcome"]) for a in audit if a["key"] == "stripe:evt_b")
    assert [o for _, o in decided_b] == ["first", "duplicate"]
    commands = await read_committed(env.bootstrap, env.topo.topics.commands)
    assert command_counts(commands) == Counter({"stripe:evt_a": 2, "stripe:evt_b": 1})

    env.stop_all()
    shutil.rmtree(env.state_root / "w1")
    replay = Env(env.bootstrap, env.topology_path, env.state_root, env.group + "-replay")
    replay_topology = env.topology_path.read_text().replace(
        f'changelog = "{env.topo.app}-seen-changelog"', f'changelog = "{env.topo.app}-replay-changelog"'
    )
    replay_topology = replay_topology.replace(
        f'audit = "{env.topo.app}.deliveries"', f'audit = "{env.topo.app}.replay"'
    )
    replay.topology_path = env.topology_path.with_name("replay.toml")
    replay.topology_path.write_text(replay_topology)
    await replay.create_topics()
    replay.start_worker("replay")
    try:
        again = await wait_for_audit(replay, len(plan))
    finally:
        replay.stop_all()
    assert sorted((a["partition"], a["offset"], a["outcome"]) for a in again) == sorted(
        (a["partition"], a["offset"], a["outcome"]) for a in audit
    )


async def test_misplaced_and_keyless_records_are_rerouted_and_bad_ones_go_to_the_dlq(
    pipeline_env: MakeEnv,
) -> None:
    """Wrong-partition and keyless records are deduped on the owning partition; bad records reach the DLQ."""
    env: Env = await pipeline_env()
    parts = env.topo.topics.partitions
    key = b"stripe:evt_routed"
    body = env.stripe_body("evt_routed")
    keyless = env.stripe_body("evt_keyless")
    stripe = [("source", b"stripe")]
    await env.produce(
        [
            (key, body, stripe, owner_partition(key, parts), None),
            (
                key,
                body,
                stripe,
                wrong_partition(key, parts),
                None,
            ),  # misplaced copy: rerouted, then duplicate
            (None, keyless, stripe, 0, None),  # keyless: key from the body's event id
            (None, keyless, stripe, 1, None),
            (b"", b'{"no": "id"}', stripe, 0, None),  # no key anywhere
            (b"stripe:evt_garbage", b"\x00\xffnot json", stripe, 0, None),
            (b"stripe:evt_nosource", body, [], 0, None),
            (b"gitlab:1", body, [("source", b"gitlab")], 0, None),
        ]
    )
    env.start_worker("w1")
    audit = await wait_for_audit(env, 8 + 2)  # + the rerouted copies
    await env.produce_stripe(["evt_after"])  # the partitions keep going
    audit = await wait_for_audit(env, 11)

    commands = command_counts(await read_committed(env.bootstrap, env.topo.topics.commands))
    assert commands == Counter({"stripe:evt_routed": 1, "stripe:evt_keyless": 1, "stripe:evt_after": 1})
    outcomes = Counter(a["outcome"] for a in audit)
    assert outcomes["rerouted"] >= 2
    assert outcomes["invalid"] == 4
    dlq = [orjson.loads(r.value) for r in await read_committed(env.bootstrap, env.topo.topics.dlq)]
    assert sorted(d["reason"] for d in dlq) == ["bad-body", "missing-key", "unknown-source", "unknown-source"]
    assert all(d["error"] for d in dlq)
    garbage = next(d for d in dlq if d["reason"] == "bad-body")
    assert garbage["value_base64"]


async def test_a_restored_store_still_suppresses_duplicates(pipeline_env: MakeEnv) -> None:
    """With its state dir deleted, a restarted worker restores from the changelog and emits nothing new."""
    env: Env = await pipeline_env()
    ids = [f"evt_{i}" for i in range(200)]
    await env.produce_stripe(ids)
    env.start_worker("w1")
    await wait_for_audit(env, 200)
    env.stop_all()
    shutil.rmtree(env.state_root / "w1")

    env.start_worker("w1")
    await env.produce_stripe(ids[::2])
    audit = await wait_for_audit(env, 300)
    await asyncio.sleep(0.5)
    commands = await read_committed(env.bootstrap, env.topo.topics.commands)
    assert command_counts(commands) == Counter({f"stripe:{e}": 1 for e in ids})
    assert Counter(a["outcome"] for a in audit) == Counter({"first": 200, "duplicate": 100})
    assert "restore" in (env.state_root / "w1.log").read_text()


async def test_a_copy_with_a_different_body_is_a_conflict_not_a_second_command(pipeline_env: MakeEnv) -> None:
    """Same key, different body: audited as conflict and not processed; a changed pending_webhooks is no conflict."""
    env: Env = await pipeline_env()
    key = b"stripe:evt_conflict"
    first = orjson.dumps(
        {"id": "evt_conflict", "type": "charge.succeeded", "pending_webhooks": 1, "amount": 100}
    )
    retry = orjson.dumps(
        {"id": "evt_conflict", "type": "charge.succeeded", "pending_webhooks": 2, "amount": 100}
    )
    other = orjson.dumps(
        {"id": "evt_conflict", "type": "charge.succeeded", "pending_webhooks": 1, "amount": 999}
    )
    stripe = [("source", b"stripe")]
    await env.produce([(key, body, stripe, None, None) for body in (first, retry, other)])
    env.start_worker("w1")
    audit = await wait_for_audit(env, 3)
    assert sorted((a["offset"], a["outcome"]) for a in audit) == [
        (0, "first"),
        (1, "duplicate"),
        (2, "conflict"),
    ]
    commands = await read_committed(env.bootstrap, env.topo.topics.commands)
    assert command_counts(commands) == Counter({"stripe:evt_conflict": 1})


async def test_worker_side_verification_never_remembers_a_forgery(pipeline_env: MakeEnv) -> None:
    """With verify = "worker", a forged copy goes to the DLQ first and the genuine event still gets its command."""
    env: Env = await pipeline_env(secrets={"github": "WORKER_GH_SECRET"}, verify="worker")
    secret = "gh-worker-secret"
    body = orjson.dumps({"ref": "refs/heads/main", "after": "abc"})
    received = int(time.time() * 1000)

    def record(signing_secret: str) -> tuple[bytes, bytes, list[tuple[str, bytes]], None, int]:
        signed = sign(
            "github", body, signing_secret, timestamp=received / 1000, msg_id="delivery-1", event_type="push"
        )
        headers = [("source", b"github"), ("received-at", str(received).encode())]
        headers += [(f"http-{name.lower()}", value.encode()) for name, value in signed.items()]
        return (b"github:delivery-1", body, headers, None, received)

    await env.produce([record("forged-secret"), record(secret), record(secret)])
    os.environ["WORKER_GH_SECRET"] = secret
    try:
        env.start_worker("w1")
        audit = await wait_for_audit(env, 3)
    finally:
        del os.environ["WORKER_GH_SECRET"]
    assert sorted((a["offset"], a["outcome"]) for a in audit) == [
        (0, "invalid"),
        (1, "first"),
        (2, "duplicate"),
    ]
    dlq = [orjson.loads(r.value) for r in await read_committed(env.bootstrap, env.topo.topics.dlq)]
    assert [d["reason"] for d in dlq] == ["bad-signature"]
    commands = await read_committed(env.bootstrap, env.topo.topics.commands)
    assert command_counts(commands) == Counter({"github:delivery-1": 1})


async def test_bodies_near_the_ingress_limit_are_processed_or_dead_lettered(pipeline_env: MakeEnv) -> None:
    """A 900 KB event gets its command, and a 900 KB unreadable body its DLQ record (body twice in it)."""
    env: Env = await pipeline_env()
    big = env.stripe_body("evt_big", size=900_000)
    garbage = b"\xff" * 900_000
    stripe = [("source", b"stripe")]
    await env.produce(
        [(b"stripe:evt_big", big, stripe, None, None), (b"stripe:evt_junk", garbage, stripe, None, None)]
    )
    env.start_worker("w1")
    audit = await wait_for_audit(env, 2)
    assert sorted(a["outcome"] for a in audit) == ["first", "invalid"]
    commands = await read_committed(env.bootstrap, env.topo.topics.commands)
    assert command_counts(commands) == Counter({"stripe:evt_big": 1})
    [dlq] = [orjson.loads(r.value) for r in await read_committed(env.bootstrap, env.topo.topics.dlq)]
    assert dlq["reason"] == "bad-body"

"""Real-broker reproductions of failure paths (issue 11): each test states the intended behaviour.

Each failed on the worker before the partition lifecycle of issue 11 (silent
loss, livelock, unowned partitions, someone else's store, effect-stage input).
Every wait is bounded and every worker subprocess is stopped at the end.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.errors import KafkaError

from pipeline.kafka.settings import MAX_MESSAGE_BYTES
from tests.integration.faults import (
    OPEN_TIMEOUT,
    Record,
    Workers,
    committed,
    free_port,
    fulfilment_topology,
    http_status,
    keys,
    open_timeout_args,
    produce,
    records,
    stripe_body,
    stripe_record,
    values,
    wait_until,
)
from tests.integration.harness import ROOT, Env

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]
MIB = 1024 * 1024


def start(workers: Workers, env: Env, name: str, *extra: str, state_dir: Path | None = None) -> Any:
    """A worker for ``env`` with state dir ``<tmp>/<name>`` unless given."""
    return workers.start(
        name,
        topology=env.topology_path,
        group=env.group,
        state_dir=state_dir or env.state_root / name,
        extra=extra,
    )


async def command_keys(env: Env) -> Counter[str]:
    return Counter(await keys(env.bootstrap, env.topo.topics.commands))


# -- item 1: a bad received-at header ----------------------------------------------------------------


@pytest.mark.parametrize(
    "bad_values",
    [
        pytest.param([b"100000000000000000000", b"9" * 5000], id="both-in-one-batch"),
        pytest.param([b"100000000000000000000"], id="int64-overflow-only"),
    ],
)
async def test_a_bad_received_at_header_goes_to_the_dlq_and_claims_nothing(
    pipeline_env: MakeEnv, workers: Workers, bad_values: list[bytes]
) -> None:
    """Copies of B with an absurd received-at go to the DLQ (bad-header) unclaimed; A and C, later records and a good B are handled."""
    env: Env = await pipeline_env(partitions=1)
    topics = env.topo.topics
    batch = [stripe_record("evt_a")]
    batch += [stripe_record("evt_b", received_at=value) for value in bad_values]
    batch.append(stripe_record("evt_c"))
    await produce(env.bootstrap, topics.input, batch)
    worker = start(workers, env, "w1")

    async def audited(count: int) -> list[dict[str, Any]] | None:
        audit = await values(env.bootstrap, topics.audit)
        return audit if len(audit) >= count else None

    audit = await wait_until(
        lambda: audited(len(batch)), "audit records", alive=worker, log=lambda: workers.tail("w1")
    )
    assert await command_keys(env) == Counter({"stripe:evt_a": 1, "stripe:evt_c": 1})
    b_outcomes = [(a["outcome"], a.get("reason")) for a in audit if a["key"] == "stripe:evt_b"]
    assert b_outcomes == [("invalid", "bad-header")] * len(bad_values)
    dlq = await values(env.bootstrap, topics.dlq)
    assert [(d["key"], d["reason"]) for d in dlq] == [("stripe:evt_b", "bad-header")] * len(bad_values)
    claimed = set(await keys(env.bootstrap, topics.changelog))
    assert claimed <= set(await command_keys(env)), f"claimed without a command: {claimed}"

    await produce(env.bootstrap, topics.input, [stripe_record("evt_after")])  # the partition moves
    await wait_until(
        lambda: audited(len(batch) + 1),
        "the later record's audit",
        alive=worker,
        log=lambda: workers.tail("w1"),
    )
    await produce(env.bootstrap, topics.input, [stripe_record("evt_b")])  # B was never claimed
    await wait_until(
        lambda: audited(len(batch) + 2), "good B's audit", alive=worker, log=lambda: workers.tail("w1")
    )
    assert await command_keys(env) == Counter(
        {"stripe:evt_a": 1, "stripe:evt_c": 1, "stripe:evt_after": 1, "stripe:evt_b": 1}
    )


# -- item 2: records too large for their output topic ------------------------------------------------


async def test_a_3_mib_unreadable_body_is_dead_lettered_truncated_and_the_partition_moves(
    pipeline_env: MakeEnv, workers: Workers
) -> None:
    """A 3 MiB non-JSON body gets a truncated DLQ record (sha256, truncated) and the next record its command."""
    env: Env = await pipeline_env(partitions=1)
    topics = env.topo.topics
    junk = b"this is not json " * (3 * MIB // 17)
    await produce(
        env.bootstrap,
        topics.input,
        [stripe_record("evt_junk", body=junk), stripe_record("evt_small")],
    )
    worker = start(workers, env, "w1")

    async def small_command() -> bool:
        return "stripe:evt_small" in await command_keys(env)

    await wait_until(
        small_command, "the small record's command", timeout=30, alive=worker, log=lambda: workers.tail("w1")
    )
    [dlq] = await values(env.bootstrap, topics.dlq)
    assert dlq["key"] == "stripe:evt_junk"
    assert dlq["reason"] == "bad-body"
    assert dlq["truncated"] is True
    assert dlq["value_sha256"] == hashlib.sha256(junk).hexdigest()

    async def moved() -> bool:
        return (await committed(env.bootstrap, env.group)).get((topics.input, 0), 0) >= 2

    await wait_until(
        moved, "a committed offset past both records", alive=worker, log=lambda: workers.tail("w1")
    )
    assert await command_keys(env) == Counter({"stripe:evt_small": 1})


async def _produce_largest(env: Env, event_id: str) -> bytes:
    """A valid JSON body just under the input topic's limit (the broker decides what fits); returns it."""
    for slack in range(64, 400, 16):
        body = stripe_body(event_id, pad=MAX_MESSAGE_BYTES - slack - len(stripe_body(event_id)))
        try:
            await produce(env.bootstrap, env.topo.topics.input, [stripe_record(event_id, body=body)])
        except KafkaError:
            continue
        return body
    raise AssertionError("no body near the limit fit the input topic")


async def test_a_command_too_large_for_its_topic_is_dead_lettered_and_its_key_stays_unclaimed(
    pipeline_env: MakeEnv, workers: Workers
) -> None:
    """A body that fits the input but whose command does not: DLQ too-large, key unclaimed, a smaller copy gets the command."""
    env: Env = await pipeline_env(partitions=1)
    topics = env.topo.topics
    body = await _produce_largest(env, "evt_huge")
    await produce(env.bootstrap, topics.input, [stripe_record("evt_small")])
    # the command wraps the body in an envelope longer than the slack left under the limit
    assert len(body) + 150 > MAX_MESSAGE_BYTES
    worker = start(workers, env, "w1")

    async def command_for(key: str) -> bool:
        return key in await command_keys(env)

    await wait_until(
        lambda: command_for("stripe:evt_small"),
        "the small record's command",
        timeout=30,
        alive=worker,
        log=lambda: workers.tail("w1"),
    )
    [dlq] = await values(env.bootstrap, topics.dlq)
    assert (dlq["key"], dlq["reason"]) == ("stripe:evt_huge", "too-large")
    audit = {a["key"]: a for a in await values(env.bootstrap, topics.audit)}
    assert audit["stripe:evt_huge"]["outcome"] == "invalid"
    assert "stripe:evt_huge" not in await keys(env.bootstrap, topics.changelog)

    await produce(env.bootstrap, topics.input, [stripe_record("evt_huge")])  # same key, small body
    await wait_until(
        lambda: command_for("stripe:evt_huge"),
        "the smaller copy's command",
        alive=worker,
        log=lambda: workers.tail("w1"),
    )
    assert await command_keys(env) == Counter({"stripe:evt_small": 1, "stripe:evt_huge": 1})


# -- items 3 and 7: an unusable state dir ----------------------------------------------------------


def topics_create(env: Env) -> None:
    """``pipeline topics create`` for the test's topology, as an operator runs it."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "topics",
            "create",
            "--bootstrap",
            env.bootstrap,
            "--topology",
            str(env.topology_path),
        ],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        check=True,
    )


def unusable_state_dir(root: Path, where: str) -> tuple[Path, Path]:
    """A regular file, and the state dir that cannot be used because of it."""
    blocker = root / "not-a-directory"
    blocker.write_text("a regular file\n")
    return blocker, blocker if where == "file" else blocker / "state"


@pytest.mark.parametrize("where", ["file", "under-a-file"])
async def test_an_unusable_state_dir_ends_the_worker_with_one_readable_line(
    pipeline_env: MakeEnv, workers: Workers, tmp_path: Path, where: str
) -> None:
    """--state-dir at a regular file (or under one): the worker exits non-zero, its last line names the problem, no traceback."""
    env: Env = await pipeline_env(partitions=1)
    topics_create(env)
    blocker, state_dir = unusable_state_dir(tmp_path, where)
    await produce(env.bootstrap, env.topo.topics.input, [stripe_record("evt_1")])
    worker = workers.start(
        "w1",
        topology=env.topology_path,
        group=env.group,
        state_dir=state_dir,
        extra=open_timeout_args(),
        environ={"PIPELINE_OPEN_TIMEOUT": OPEN_TIMEOUT},
    )

    async def exited() -> bool:
        assert "Traceback" not in workers.log("w1"), workers.tail("w1")
        return worker.poll() is not None

    await wait_until(exited, "exit", log=lambda: workers.tail("w1"))
    stderr = workers.log("w1")
    assert worker.returncode != 0
    assert "Traceback" not in stderr
    last = [line for line in stderr.splitlines() if line.strip()][-1]
    assert str(blocker) in last, last
    assert "state" in last.lower(), last


async def test_readyz_is_not_ok_while_an_assigned_partition_is_not_served(
    pipeline_env: MakeEnv, workers: Workers, tmp_path: Path
) -> None:
    """With a state dir that is a file, /readyz never answers 200 once partitions are assigned and unserved."""
    env: Env = await pipeline_env(partitions=1)
    _, state_dir = unusable_state_dir(tmp_path, "file")
    await produce(env.bootstrap, env.topo.topics.input, [stripe_record("evt_1")])
    port = free_port()
    worker = workers.start(
        "w1",
        topology=env.topology_path,
        group=env.group,
        state_dir=state_dir,
        extra=["--metrics-port", str(port), *open_timeout_args("30")],
        environ={"PIPELINE_OPEN_TIMEOUT": "30"},
    )

    async def assigned_or_gone() -> bool:
        return "partitions assigned" in workers.log("w1") or worker.poll() is not None

    await wait_until(assigned_or_gone, "an assignment", log=lambda: workers.tail("w1"))
    answers: list[int] = []
    deadline = time.monotonic() + 10
    while worker.poll() is None and time.monotonic() < deadline:
        status = await http_status(f"http://127.0.0.1:{port}/readyz")
        if status is not None:
            answers.append(status)
            assert status != 200, f"/readyz said 200 with its partition unserved\n{workers.tail('w1')}"
    assert answers or worker.poll() is not None, "/readyz never answered while the worker ran"


async def test_healthz_and_readyz_are_ok_when_every_assigned_partition_is_served(
    pipeline_env: MakeEnv, workers: Workers
) -> None:
    """A normal worker that handled a record on each partition answers /healthz and /readyz with 200."""
    env: Env = await pipeline_env(partitions=2)
    await env.produce_stripe([f"evt_{i}" for i in range(8)])
    port = free_port()
    worker = start(workers, env, "w1", "--metrics-port", str(port))

    async def all_handled() -> bool:
        return len(await command_keys(env)) == 8

    await wait_until(all_handled, "eight commands", alive=worker, log=lambda: workers.tail("w1"))
    assert await http_status(f"http://127.0.0.1:{port}/healthz") == 200
    assert await http_status(f"http://127.0.0.1:{port}/readyz") == 200


# -- items 4 and 5: a store that cannot be trusted -------------------------------------------------


def rocksdb_dirs(state_dir: Path) -> list[Path]:
    """Every RocksDB directory under ``state_dir`` (the ones with a CURRENT file)."""
    return sorted(current.parent for current in state_dir.rglob("CURRENT"))


def corrupt(db: Path, how: str) -> list[str]:
    """Overwrite (or truncate) a RocksDB directory's CURRENT, MANIFEST-*, *.sst and *.log files (or only the tables)."""
    hit = []
    for path in sorted(db.iterdir()):
        metadata = path.name == "CURRENT" or path.name.startswith("MANIFEST-") or path.suffix == ".log"
        if path.is_file() and (path.suffix == ".sst" or (metadata and how != "sst-only")):
            size = path.stat().st_size
            path.write_bytes(b"" if how == "truncate" else b"\xde\xad garbage \xbe\xef" * max(size // 16, 4))
            hit.append(path.name)
    return hit


@pytest.mark.parametrize("how", ["garbage", "truncate", "sst-only"])
async def test_a_corrupt_store_is_wiped_and_restored_from_the_changelog(
    pipeline_env: MakeEnv, workers: Workers, how: str
) -> None:
    """Store files overwritten between two runs: the store is rebuilt, earlier keys stay duplicates, new keys get one command."""
    env: Env = await pipeline_env(partitions=2)
    topics = env.topo.topics
    earlier = [f"evt_{i}" for i in range(20)]
    await env.produce_stripe(earlier)
    worker = start(workers, env, "w1")

    async def audited(count: int) -> bool:
        return len(await records(env.bootstrap, topics.audit)) >= count

    await wait_until(lambda: audited(20), "20 audit records", alive=worker, log=lambda: workers.tail("w1"))
    assert workers.stop("w1") == 0, workers.tail("w1")
    dbs = rocksdb_dirs(env.state_root / "w1")
    assert dbs, "the worker left no RocksDB store"
    for db in dbs:
        assert corrupt(db, how)

    worker = start(workers, env, "w1")
    newer = [f"evt_new_{i}" for i in range(10)]
    await env.produce_stripe(earlier + newer)
    await wait_until(lambda: audited(50), "50 audit records", alive=worker, log=lambda: workers.tail("w1"))
    assert await command_keys(env) == Counter({f"stripe:{e}": 1 for e in earlier + newer})
    outcomes = Counter(a["outcome"] for a in await values(env.bootstrap, topics.audit))
    assert outcomes == Counter({"first": 30, "duplicate": 20})
    log = workers.log("w1").lower()
    assert "wip" in log, workers.tail("w1")
    assert "restore" in log, workers.tail("w1")


def second_pipeline(env: Env, app: str) -> Env:
    """Another pipeline (its own app name, group and output topics) reading ``env``'s input topic."""
    text = env.topology_path.read_text().replace(f'name = "{env.topo.app}"', f'name = "{app}"')
    own = text.replace(f'input = "{env.topo.app}.raw"', "INPUT").replace(env.topo.app, app)
    path = env.topology_path.with_name(f"{app}.toml")
    path.write_text(own.replace("INPUT", f'input = "{env.topo.topics.input}"'))
    return Env(env.bootstrap, path, env.state_root, f"{app}-group")


async def test_a_store_of_another_pipeline_in_the_same_state_dir_is_not_reused(
    pipeline_env: MakeEnv, workers: Workers, unique: Callable[[str], str], tmp_path: Path
) -> None:
    """Two pipelines on one input topic, run one after the other on one state dir: each emits every command."""
    first: Env = await pipeline_env(partitions=2)
    second = second_pipeline(first, unique("other"))
    assert second.topo.topics.input == first.topo.topics.input
    assert second.topo.topics.commands != first.topo.topics.commands
    await second.create_topics()
    ids = [f"evt_{i}" for i in range(20)]
    await first.produce_stripe(ids)
    shared = tmp_path / "shared-state"

    worker = start(workers, first, "p1", state_dir=shared)

    async def commands_of(env: Env) -> bool:
        return len(await command_keys(env)) >= len(ids)

    await wait_until(
        lambda: commands_of(first), "pipeline 1's commands", alive=worker, log=lambda: workers.tail("p1")
    )
    assert workers.stop("p1") == 0, workers.tail("p1")

    worker = start(workers, second, "p2", state_dir=shared)

    async def audited() -> bool:
        return len(await records(second.bootstrap, second.topo.topics.audit)) >= len(ids)

    await wait_until(audited, "pipeline 2's audit records", alive=worker, log=lambda: workers.tail("p2"))
    assert await command_keys(second) == Counter({f"stripe:{e}": 1 for e in ids})
    assert await command_keys(first) == Counter({f"stripe:{e}": 1 for e in ids})


# -- item 6: the effect stage's input ----------------------------------------------------------------


async def effect_env(bootstrap: str, tmp_path: Path, app: str) -> Env:
    """The fulfilment topology (effect keys) on one partition, its topics created."""
    env = Env(bootstrap, fulfilment_topology(tmp_path / f"{app}.toml", app), tmp_path, f"{app}-group")
    await env.create_topics()
    return env


def effect_record(env: Env, payment: str, *, command_topic: str | None = None) -> Record:
    """An effects-topic record as the first stage writes it: a fulfil-order command for ``payment``."""
    value = orjson.dumps(
        {
            "command": "fulfil-order",
            "key": f"stripe:evt_{payment}",
            "effect_key": f"fulfil-order:{payment}",
            "source": "stripe",
            "event_type": "payment_intent.succeeded",
            "received_at": 1_700_000_000_000,
            "event": {"id": f"evt_{payment}", "data": {"object": {"id": payment}}},
        }
    )
    topic = command_topic or f"{env.topo.app}.orders"
    headers = [("effect-ttl-ms", b"86400000"), ("command-topic", topic.encode())]
    return (f"fulfil-order:{payment}".encode(), value, headers)


@pytest.mark.parametrize("target", ["missing-topic", "the-input-topic"])
async def test_an_effect_record_naming_a_foreign_command_topic_goes_to_the_dlq(
    bootstrap: str, tmp_path: Path, unique: Callable[[str], str], workers: Workers, target: str
) -> None:
    """An effect record whose command-topic is not a command topic of the topology: DLQ, and the stage moves on."""
    env = await effect_env(bootstrap, tmp_path, unique("shop"))
    effects = env.topo.topics.effects
    foreign = unique("no-such-topic") if target == "missing-topic" else env.topo.topics.input
    await produce(bootstrap, effects, [effect_record(env, "pi_bad", command_topic=foreign)])
    worker = start(workers, env, "w1")

    async def dead_lettered() -> list[dict[str, Any]]:
        return await values(bootstrap, env.topo.topics.dlq)

    [dlq] = await wait_until(dead_lettered, "a DLQ record", alive=worker, log=lambda: workers.tail("w1"))
    assert dlq["key"] == "fulfil-order:pi_bad"
    assert dlq["reason"]
    assert await records(bootstrap, env.topo.topics.input) == []
    assert "fulfil-order:pi_bad" not in await keys(bootstrap, env.topo.topics.effects_changelog)

    await produce(bootstrap, effects, [effect_record(env, "pi_ok")])  # the partition moves on

    async def fulfilled() -> list[str]:
        return await keys(bootstrap, f"{env.topo.app}.orders")

    assert await wait_until(fulfilled, "the later command", alive=worker, log=lambda: workers.tail("w1")) == [
        "fulfil-order:pi_ok"
    ]


@pytest.mark.parametrize("defect", ["no-key", "not-json"])
async def test_an_invalid_effect_record_gets_a_dlq_record_and_an_audit_record(
    bootstrap: str, tmp_path: Path, unique: Callable[[str], str], workers: Workers, defect: str
) -> None:
    """An effect record without key or with a non-JSON value: one DLQ record and one audit record (outcome invalid)."""
    env = await effect_env(bootstrap, tmp_path, unique("shop"))
    key, value, headers = effect_record(env, "pi_bad")
    bad = (None, value, headers) if defect == "no-key" else (key, b"\x00 not json", headers)
    await produce(bootstrap, env.topo.topics.effects, [bad, effect_record(env, "pi_ok")])
    worker = start(workers, env, "w1")

    async def fulfilled() -> list[str]:
        return await keys(bootstrap, f"{env.topo.app}.orders")

    await wait_until(fulfilled, "the valid record's command", alive=worker, log=lambda: workers.tail("w1"))
    dlq = await values(bootstrap, env.topo.topics.dlq)
    assert len(dlq) == 1
    assert dlq[0]["reason"]
    audit = await values(bootstrap, env.topo.topics.audit)
    assert sorted((a["offset"], a["outcome"]) for a in audit) == [(0, "invalid"), (1, "first")]
    assert all(a.get("stage") == "effect" for a in audit)

"""``pipeline produce FILE`` keys and partitions like the ingress; ``pipeline tail`` prints committed records."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from pipeline.kafka.partitioner import owner_partition
from tests.integration.harness import ROOT, Env, read_committed

pytestmark = pytest.mark.broker

MakeEnv = Callable[..., Any]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


async def test_produce_keys_and_partitions_each_webhook_and_reports_bad_lines(
    pipeline_env: MakeEnv, tmp_path: Path
) -> None:
    """Each line lands on its key's partition with the contract's headers; bad lines are named, not dropped silently."""
    env: Env = await pipeline_env()
    lines = [
        {
            "source": "stripe",
            "headers": {"Stripe-Signature": "t=1,v1=x"},
            "body": {"id": "evt_1", "type": "a"},
        },
        {"source": "github", "headers": {"X-GitHub-Delivery": "d-9", "X-GitHub-Event": "push"}, "body": "{}"},
        {"source": "gitlab", "headers": {}, "body": {}},
        {"source": "stripe", "headers": {}, "body": {"no": "id"}},
    ]
    file = tmp_path / "webhooks.jsonl"
    file.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")

    result = _cli("produce", str(file), "--bootstrap", env.bootstrap, "--topology", str(env.topology_path))
    assert result.returncode == 1
    assert "produced 2 webhooks" in result.stdout
    assert f"{file}:3: unknown source 'gitlab'" in result.stderr
    assert f"{file}:4:" in result.stderr

    records = await read_committed(env.bootstrap, env.topo.topics.input)
    by_key = {r.key: r for r in records}
    assert set(by_key) == {b"stripe:evt_1", b"github:d-9"}
    for key, record in by_key.items():
        assert record.partition == owner_partition(key, env.topo.topics.partitions)
    headers = dict(by_key[b"github:d-9"].headers)
    assert headers["source"] == b"github"
    assert headers["http-x-github-event"] == b"push"
    assert by_key[b"github:d-9"].value == b"{}"


async def test_tail_prints_committed_records_as_json_lines(pipeline_env: MakeEnv) -> None:
    """tail prints one JSON object per committed record, with the value parsed."""
    env: Env = await pipeline_env()
    await env.produce_stripe(["evt_tail_1", "evt_tail_2"])
    result = _cli("tail", env.topo.topics.input, "--bootstrap", env.bootstrap)
    assert result.returncode == 0, result.stderr
    printed = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert sorted(p["key"] for p in printed) == ["stripe:evt_tail_1", "stripe:evt_tail_2"]
    assert all(p["value"]["object"] == "event" for p in printed)


def test_tail_of_a_missing_topic_is_one_error_line(bootstrap: str) -> None:
    """A topic that does not exist gives exit 1 and a single readable line."""
    result = _cli("tail", "no-such-topic-anywhere", "--bootstrap", bootstrap)
    assert result.returncode == 1
    assert "pipeline: error: topic no-such-topic-anywhere does not exist" in result.stderr


async def test_tail_prints_a_null_header_value_as_null(
    make_topic: Callable[..., Any], bootstrap: str
) -> None:
    """A record whose header value is null is printed with null for that header, not a crash."""
    topic = await make_topic("tail-null")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"{}", key=b"k", headers=[("empty", None), ("set", b"v")])
    finally:
        await producer.stop()
    result = _cli("tail", topic, "--bootstrap", bootstrap)
    assert result.returncode == 0, result.stderr
    (printed,) = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert printed["headers"] == {"empty": None, "set": "v"}

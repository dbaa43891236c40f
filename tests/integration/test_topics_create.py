"""``pipeline topics create`` makes every topic with the asked-for configs, idempotently."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from pipeline import topology
from pipeline.kafka.admin import (
    TopicSpec,
    admin_client,
    describe_topic_configs,
    ensure_topics,
    partition_count,
    topic_specs,
)
from pipeline.kafka.settings import MAX_MESSAGE_BYTES
from tests.integration.harness import write_topology

pytestmark = pytest.mark.broker


def _write_topology(tmp_path: Path, unique: Callable[[str], str], ttl: str = "3d") -> Path:
    return write_topology(tmp_path / "topology.toml", unique("app"), partitions=2, ttl=ttl)


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, timeout=60, check=False
    )


async def test_topics_create_twice_leaves_the_same_topics_and_configs(
    bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """Running topics create twice creates all five kinds of topic once, with the changelog's configs."""
    path = _write_topology(tmp_path, unique)
    topo = topology.load(path)
    first = _run_cli(
        "topics", "create", "--bootstrap", bootstrap, "--topology", str(path), "--partitions", "3"
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("created") == 6  # and the console's redrive history
    second = _run_cli(
        "topics", "create", "--bootstrap", bootstrap, "--topology", str(path), "--partitions", "3"
    )
    assert second.returncode == 0, second.stderr
    assert "created" not in second.stdout

    names = [s.name for s in topic_specs(topo)]
    async with admin_client(bootstrap) as admin:
        described = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(names)}
    assert described == dict.fromkeys(names, 3)
    configs = await describe_topic_configs(bootstrap, [topo.topics.changelog])
    changelog = configs[topo.topics.changelog]
    assert changelog["cleanup.policy"] == "compact,delete"
    assert int(changelog["retention.ms"]) == (3 + 1) * 86_400_000


def test_topics_create_with_no_broker_fails_with_one_line(
    tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """An unreachable broker gives exit 1 and a single readable error line, no traceback."""
    path = _write_topology(tmp_path, unique)
    result = _run_cli(
        "topics", "create", "--bootstrap", "127.0.0.1:1", "--topology", str(path), "--timeout", "2"
    )
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("pipeline:")]
    assert lines == [lines[0]]
    assert "cannot reach Kafka at 127.0.0.1:1" in lines[0]
    assert "Traceback" not in result.stderr


def _create(bootstrap: str, path: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return _run_cli("topics", "create", "--bootstrap", bootstrap, "--topology", str(path), *more)


async def _configs_when(
    bootstrap: str, names: list[str], shown: Callable[[dict[str, dict[str, str]]], bool]
) -> dict[str, dict[str, str]]:
    """The topics' configs once ``shown`` holds (at most 10 s): a broker applies a change a moment after it answers."""
    deadline = time.monotonic() + 10
    while True:
        configs = await describe_topic_configs(bootstrap, names)
        if shown(configs) or time.monotonic() > deadline:
            return configs
        await asyncio.sleep(0.1)


async def test_a_rerun_keeps_hand_set_configs_and_restores_the_owned_ones(
    bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """An operator's retention.ms on the input survives a rerun; max.message.bytes and the changelog's configs are restored."""
    path = _write_topology(tmp_path, unique)
    topo = topology.load(path)
    assert _create(bootstrap, path).returncode == 0
    input_topic, changelog = topo.topics.input, topo.topics.changelog
    async with admin_client(bootstrap) as admin:
        # by hand, with the legacy call (which also drops every key it does not name)
        await admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    input_topic,
                    configs={"retention.ms": "123456789", "max.message.bytes": "2000"},
                ),
                ConfigResource(ConfigResourceType.TOPIC, changelog, configs={"cleanup.policy": "delete"}),
            ]
        )
    before = await _configs_when(
        bootstrap,
        [input_topic, changelog],
        lambda c: (
            c[changelog]["cleanup.policy"] == "delete" and c[input_topic]["max.message.bytes"] == "2000"
        ),
    )
    assert before[changelog]["cleanup.policy"] == "delete"

    rerun = _create(bootstrap, path)
    assert rerun.returncode == 0, rerun.stderr
    assert "restored max.message.bytes=" in rerun.stdout
    configs = await _configs_when(
        bootstrap, [input_topic, changelog], lambda c: c[changelog]["cleanup.policy"] == "compact,delete"
    )
    assert configs[input_topic]["retention.ms"] == "123456789"
    assert configs[input_topic]["max.message.bytes"] == str(MAX_MESSAGE_BYTES)
    assert configs[changelog]["cleanup.policy"] == "compact,delete"
    assert int(configs[changelog]["retention.ms"]) == (3 + 1) * 86_400_000

    third = _create(bootstrap, path)
    assert third.returncode == 0, third.stderr
    assert "updated" not in third.stdout
    assert (await describe_topic_configs(bootstrap, [input_topic]))[input_topic][
        "retention.ms"
    ] == "123456789"


async def test_a_partition_count_mismatch_exits_non_zero_pointing_to_rescale(
    bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """Topics with fewer partitions than asked: exit 1, one line naming them and 'pipeline rescale', nothing changed."""
    path = _write_topology(tmp_path, unique)
    topo = topology.load(path)
    assert _create(bootstrap, path).returncode == 0
    result = _create(bootstrap, path, "--partitions", "3")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"{topo.topics.input} has 2" in result.stderr
    assert "pipeline rescale --partitions 3" in result.stderr
    async with admin_client(bootstrap) as admin:
        described = {
            t["topic"]: len(t["partitions"]) for t in await admin.describe_topics([topo.topics.input])
        }
    assert described[topo.topics.input] == 2

    fewer = _create(bootstrap, path, "--partitions", "1")
    assert fewer.returncode == 1
    assert "set topics.partitions = 2" in fewer.stderr


async def test_a_changelog_unlike_its_input_fails_at_topics_create(
    bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """A changelog already there with another partition count is an error before the input is created."""
    path = _write_topology(tmp_path, unique)
    topo = topology.load(path)
    await ensure_topics(bootstrap, [TopicSpec(topo.topics.changelog, 1)])
    result = _create(bootstrap, path)
    assert result.returncode == 1
    assert f"{topo.topics.changelog} has 1" in result.stderr
    assert "nothing was changed" in result.stderr
    assert await partition_count(bootstrap, topo.topics.input) is None

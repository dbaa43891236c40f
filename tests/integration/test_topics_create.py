"""``pipeline topics create`` makes every topic with the asked-for configs, idempotently."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline import kafka, topology
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
    assert first.stdout.count("created") == 5
    second = _run_cli(
        "topics", "create", "--bootstrap", bootstrap, "--topology", str(path), "--partitions", "3"
    )
    assert second.returncode == 0, second.stderr
    assert "created" not in second.stdout

    names = [s.name for s in kafka.topic_specs(topo)]
    async with kafka.admin_client(bootstrap) as admin:
        described = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(names)}
    assert described == dict.fromkeys(names, 3)
    configs = await kafka.describe_topic_configs(bootstrap, [topo.topics.changelog])
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

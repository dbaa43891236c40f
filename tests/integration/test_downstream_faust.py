"""The faust example (pipeline.downstream.faust_agent) against the real broker and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pipeline.downstream import Command
from tests.conftest import TopicFactory
from tests.integration.test_downstream import EXAMPLES, produce, run_example

pytestmark = pytest.mark.broker


def github_command(command: str, delivery: str, event_type: str, event: dict[str, Any]) -> Command:
    """A command as github.toml emits it: no effect_key route, so the effect key is the event key."""
    key = f"github:{delivery}"
    return Command(command, key, key, "github", event_type, 1_700_000_000_000, event)


def push(delivery: str, head: str) -> Command:
    """A `build` command of a GitHub push."""
    event = {"ref": "refs/heads/main", "after": head, "repository": {"full_name": "acme/shop"}}
    return github_command("build", delivery, "push", event)


def pull_request(delivery: str, action: str, state: str, updated_at: str) -> Command:
    """A `review` command of a GitHub pull_request event."""
    pr = {"number": 7, "state": state, "updated_at": updated_at, "head": {"sha": f"sha-{action}"}}
    event = {"action": action, "pull_request": pr, "repository": {"full_name": "acme/shop"}}
    return github_command("review", delivery, f"pull_request.{action}", event)


async def test_faust_example_applies_builds_and_reviews_once_per_service(
    bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str], postgres_db: str, tmp_path: Path
) -> None:
    """Duplicates and an aborted push apply nothing; a replay is all repeats; another service applies afresh."""
    pushes, prs = await make_topic("pushes", partitions=2), await make_topic("prs", partitions=1)
    token = unique("d").rsplit("-", 1)[1]
    p1, p2, px = push(f"{token}-1", "aaa"), push(f"{token}-2", "bbb"), push(f"{token}-x", "xxx")
    opened = pull_request(f"{token}-3", "opened", "open", "2024-01-01T00:00:00Z")
    closed = pull_request(f"{token}-4", "closed", "closed", "2024-01-02T00:00:00Z")
    for topic, batches in (
        (pushes, [[p1, p1], [px], [p2]]),
        (prs, [[opened], [], [closed, opened]]),
    ):
        await produce(bootstrap, topic, unique(f"txn-{topic}"), batches)

    def run(service: str, group: str) -> dict[str, int]:
        return run_example(
            str(EXAMPLES / "faust_consumer.py"),
            *("--broker", bootstrap, "--topic", pushes, "--topic", prs, "--dsn", postgres_db),
            *("--service", service, "--group", group, "--expect", "6", "--max-idle", "6"),
            *("--data-dir", str(tmp_path / group)),
            timeout=120,
        )

    first = await asyncio.to_thread(run, "ci", unique("ci-a"))
    assert first == {"seen": 6, "applied": 4, "repeats": 2, "skipped": 0, "invalid": 0}
    replay = await asyncio.to_thread(run, "ci", unique("ci-b"))
    assert replay == {"seen": 6, "applied": 0, "repeats": 6, "skipped": 0, "invalid": 0}
    with psycopg.connect(postgres_db) as conn:
        builds = conn.execute("SELECT head FROM builds ORDER BY head").fetchall()
        prs_rows = conn.execute("SELECT number, state, head, events FROM pull_requests").fetchall()
    assert builds == [("aaa",), ("bbb",)]  # the aborted push never builds
    assert prs_rows == [(7, "closed", "sha-closed", 2)]  # the redelivered 'opened' neither counts nor reopens

    # a second service on the same database has its own claims (the shared-table bug)
    other = await asyncio.to_thread(run, "ci_shadow", unique("shadow"))
    assert other == {"seen": 6, "applied": 4, "repeats": 2, "skipped": 0, "invalid": 0}
    with psycopg.connect(postgres_db) as conn:
        claims = {
            service: conn.execute(f"SELECT count(*) FROM {service}_applied_commands").fetchone()
            for service in ("ci", "ci_shadow")
        }
    assert claims == {"ci": (4,), "ci_shadow": (4,)}

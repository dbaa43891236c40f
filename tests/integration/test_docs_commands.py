"""The operator commands of docs/quickstart.md and docs/operations.md run as written against a real broker."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest

from tests.integration.harness import ROOT

pytestmark = pytest.mark.broker


def _pipeline(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=bootstrap)
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        env=env,
        cwd=ROOT,
    )


def test_quickstart_commands_run_as_documented(bootstrap: str, tmp_path: Path) -> None:
    """topics create, produce, tail and inspect work with the default topology and KAFKA_BOOTSTRAP_SERVERS."""
    created = _pipeline(
        bootstrap, "topics", "create", "--topology", "topologies/default.toml", "--partitions", "12"
    )
    assert created.returncode == 0, created.stderr

    event_id = f"evt_docs_{uuid.uuid4().hex[:8]}"
    line = {
        "source": "stripe",
        "headers": {},
        "body": {"id": event_id, "object": "event", "type": "invoice.paid"},
    }
    (tmp_path / "webhooks.jsonl").write_bytes(orjson.dumps(line) + b"\n")
    produced = _pipeline(bootstrap, "produce", str(tmp_path / "webhooks.jsonl"))
    assert produced.returncode == 0, produced.stderr
    assert "produced 1 webhooks" in produced.stdout

    tailed = _pipeline(bootstrap, "tail", "webhooks.raw")
    assert tailed.returncode == 0, tailed.stderr
    assert any(orjson.loads(r)["key"] == f"stripe:{event_id}" for r in tailed.stdout.splitlines())

    inspected = _pipeline(bootstrap, "inspect", f"stripe:{event_id}", "--workers", "")
    assert inspected.returncode == 3  # produced but no worker ran: not known yet, and said so
    assert "known         no" in inspected.stdout

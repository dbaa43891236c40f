"""The deployment files stay valid and agree with the code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_docker_compose_file_is_valid() -> None:
    """docker-compose validates the compose file (no engine needed)."""
    if shutil.which("docker-compose") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("docker-compose is missing: scripts/bootstrap installs it")
        pytest.skip("docker-compose is not installed")
    result = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_compose_runs_the_kafka_version_the_broker_script_pins() -> None:
    """The compose file's apache/kafka image tag is the version deploy/kafka/pom.xml fetches."""
    pom = (ROOT / "deploy" / "kafka" / "pom.xml").read_text()
    pinned = re.search(r"<kafka.version>(.+?)</kafka.version>", pom)
    assert pinned is not None
    compose = (ROOT / "docker-compose.yml").read_text()
    assert f"image: apache/kafka:{pinned.group(1)}" in compose

"""``pipeline up`` (the README's start command) runs everything and stops cleanly on Ctrl-C."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.harness import ROOT, Env, read_committed, write_topology

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(process: subprocess.Popen[str], text: str, timeout: float = 90) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"'{text}' not printed; output so far:\n{seen}")


async def test_up_starts_its_own_broker_runs_the_pipeline_and_stops_on_ctrl_c(
    tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """With no --bootstrap, up starts a local broker, creates topics, dedupes, and Ctrl-C stops it all."""
    app = unique("up")
    path = write_topology(
        tmp_path / "up.toml", app, partitions=2, secrets={"stripe": "UP_TEST_STRIPE_SECRET"}
    )
    kafka_port = _free_port()
    env = dict(
        os.environ,
        KAFKA_RUN_DIR=str(tmp_path / "kafka"),
        KAFKA_CONTROLLER_PORT=str(_free_port()),
        PIPELINE_LOG_LEVEL="WARNING",
    )
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "up",
            "--topology",
            str(path),
            "--state-dir",
            str(tmp_path / "state"),
            "--kafka-port",
            str(kafka_port),
            "--metrics-port",
            str(_free_port()),
            "--ingress-port",
            str(_free_port()),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        banner = _wait_for(process, "Stop with Ctrl-C.")
        assert f"Kafka         127.0.0.1:{kafka_port}" in banner
        assert f"created  {app}.raw" in banner

        curl = next(line.strip() for line in banner.splitlines() if line.strip().startswith("curl "))
        for _ in range(2):  # the same signed event twice: one command
            posted = subprocess.run(
                [*shlex.split(curl), "-w", "%{http_code}"], capture_output=True, text=True, check=False
            )
            assert posted.stdout.endswith("202"), posted.stdout + posted.stderr
        pipeline = Env(f"127.0.0.1:{kafka_port}", path, tmp_path, "unused")
        deadline = time.monotonic() + 30
        commands: list[object] = []
        while time.monotonic() < deadline and not commands:
            commands = await read_committed(pipeline.bootstrap, f"{app}.events", idle=1.0)
        assert len(commands) == 1

        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        rest = process.stdout.read() if process.stdout else ""
        assert "Stopping the local Kafka broker" in rest
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        subprocess.run(
            [str(ROOT / "deploy" / "kafka" / "kafka.sh"), "stop", str(kafka_port)], env=env, check=False
        )


def test_up_demo_sends_signed_webhooks_and_every_duplicate_is_suppressed(
    bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """up --demo streams retries, a redelivery and forgeries, and its summary checks out."""
    app = unique("demo")
    path = write_topology(
        tmp_path / "demo.toml",
        app,
        partitions=2,
        secrets={"stripe": "DEMO_STRIPE_SECRET", "github": "DEMO_GITHUB_SECRET"},
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "up",
            "--demo",
            "--demo-events",
            "30",
            "--bootstrap",
            bootstrap,
            "--topology",
            str(path),
            "--state-dir",
            str(tmp_path / "state"),
            "--metrics-port",
            str(_free_port()),
            "--ingress-port",
            str(_free_port()),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PIPELINE_LOG_LEVEL="WARNING"),
    )
    try:
        output = _wait_for(process, "Demo done", timeout=120)
        assert "Every duplicate was suppressed." in output, output
        assert "MISMATCH" not in output
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

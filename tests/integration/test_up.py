"""``pipeline up`` (the README's start command) runs everything and stops cleanly on Ctrl-C."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
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
    kafka_port, console_port = _free_port(), _free_port()
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
            "--console-port",
            str(console_port),
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
        console = f"http://127.0.0.1:{console_port}/"
        assert f"Console       {console}" in banner
        event_id = re.search(r'"id": "(evt_demo_[0-9a-f]+)"', curl)
        assert event_id is not None
        with urllib.request.urlopen(f"{console}find?q={event_id[1]}", timeout=30) as page:  # a person asks
            html = page.read().decode()
        assert page.url.endswith(f"/keys/stripe%3A{event_id[1]}") or page.url.endswith(
            f"/keys/stripe:{event_id[1]}"
        )
        assert "Processed: first seen" in html
        assert "duplicate" in html

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
    """up --demo streams retries, a redelivery and forgeries, and its summary checks out, on a rerun too."""
    app = unique("demo")
    path = write_topology(
        tmp_path / "demo.toml",
        app,
        partitions=2,
        secrets={"stripe": "DEMO_STRIPE_SECRET", "github": "DEMO_GITHUB_SECRET"},
    )
    for _run in range(2):  # a rerun on the same broker, topics and state counts only its own events
        _run_demo(bootstrap, path, tmp_path)


def _run_demo(bootstrap: str, path: Path, tmp_path: Path) -> None:
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
            "--console-port",
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


def _up(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "up",
            "--state-dir",
            str(tmp_path / "state"),
            "--metrics-port",
            str(_free_port()),
            "--ingress-port",
            str(_free_port()),
            "--console-port",
            str(_free_port()),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )


def _local_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, KAFKA_RUN_DIR=str(tmp_path / "kafka"), PIPELINE_LOG_LEVEL="WARNING")
    env["KAFKA_CONTROLLER_PORT"] = str(_free_port())
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    return env


def test_up_refuses_a_kafka_port_already_in_use(tmp_path: Path) -> None:
    """With something listening on --kafka-port, up exits 1 at once with one line and starts no broker."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = _up(tmp_path, "--kafka-port", str(port), env=_local_env(tmp_path))
        out, err = process.communicate(timeout=30)
    assert process.returncode == 1, out + err
    expected = (
        f"pipeline: error: Kafka port {port} on 127.0.0.1 is already in use by another process; pipeline up"
        f" never uses a broker it did not start: stop that process, choose another --kafka-port, or use it"
        f" with --bootstrap 127.0.0.1:{port}"
    )
    assert err.strip().splitlines() == [expected]
    assert "ready" not in out
    assert not (tmp_path / "kafka").exists()


def test_kafka_sh_refuses_a_port_in_use_and_probe_checks_the_cluster_id(
    bootstrap: str, tmp_path: Path
) -> None:
    """kafka.sh start never adopts a broker on its port; the probe rejects a broker of another cluster."""
    port = int(bootstrap.rpartition(":")[2])
    started = subprocess.run(
        [str(ROOT / "deploy" / "kafka" / "kafka.sh"), "start", str(port)],
        capture_output=True,
        text=True,
        env=_local_env(tmp_path),
        timeout=60,
        check=False,
    )
    assert started.returncode == 1
    assert f"kafka.sh: port {port} on 127.0.0.1 is in use by another process" in started.stderr
    probe = str(ROOT / "deploy" / "kafka" / "probe.py")
    other = subprocess.run(
        [sys.executable, probe, bootstrap, "10", "--cluster-id", "not-this-cluster"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert other.returncode == 2, other.stderr


def test_sigterm_while_the_broker_starts_stops_it_and_exits(tmp_path: Path) -> None:
    """SIGTERM during start is not ignored: up abandons the start, stops the broker it launched and exits non-zero."""
    port = _free_port()
    env = _local_env(tmp_path)
    process = _up(tmp_path, "--kafka-port", str(port), env=env)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "Starting the local Kafka broker" in line, line
        time.sleep(3)  # kafka.sh is formatting or waiting for the JVM
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 130
        status = subprocess.run(
            [str(ROOT / "deploy" / "kafka" / "kafka.sh"), "status", str(port)], env=env, check=False
        )
        assert status.returncode == 1  # not running: stopped, not leaked
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        subprocess.run([str(ROOT / "deploy" / "kafka" / "kafka.sh"), "stop", str(port)], env=env, check=False)


def test_a_second_ctrl_c_exits_at_once(bootstrap: str, tmp_path: Path, unique: Callable[[str], str]) -> None:
    """The first Ctrl-C starts a clean stop; a second signal during it exits immediately with 130."""
    path = write_topology(tmp_path / "force.toml", unique("force"), partitions=2)
    env = dict(os.environ, PIPELINE_LOG_LEVEL="WARNING")
    process = _up(tmp_path, "--bootstrap", bootstrap, "--topology", str(path), env=env)
    try:
        _wait_for(process, "Stop with Ctrl-C.")
        # a clean stop can take only milliseconds: deliver both signals at once, so the second
        # surely arrives during the stop (two SIGINTs would merge into one while pending)
        process.send_signal(signal.SIGSTOP)
        process.send_signal(signal.SIGINT)
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGCONT)
        assert process.wait(timeout=30) == 130
        err = process.stderr.read() if process.stderr else ""
        assert ": stopping (press Ctrl-C again to exit at once)" in err  # the first, in either order
        assert " again: exiting now" in err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

"""A newcomer's mistakes on the installed wheel, from an empty directory: each ends in one line, quickly.

The install is ``tests/integration/wheel.py``'s (a fresh virtualenv, no extras);
the happy path is ``tests/integration/test_wheel.py``.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.wheel import ROOT, Venv, environment, free_port, run, running, stop, wait_for_match

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _attempt(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 60
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run a command expected to fail; return it and how long it took."""
    started = time.monotonic()
    result = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=timeout
    )
    return result, time.monotonic() - started


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single line a failed command ended with (asserted), after its own warnings if any.

    The ingress warns about each source whose secret is unset before it connects; those lines are
    the pipeline's, at WARNING. Nothing else may come before the error: no library line, no traceback.
    """
    assert result.returncode != 0, result.stdout
    lines = [line for line in result.stderr.splitlines() if " WARNING pipeline." not in line]
    assert len(lines) == 1, result.stderr
    assert result.stderr.endswith(lines[0] + "\n")
    return lines[0]


@pytest.fixture
def here(venv: Venv, tmp_path: Path, unique: Callable[[str], str]) -> Path:
    """An empty directory with ``pipeline init``'s files for a unique app, one partition."""
    directory = tmp_path / "empty"
    directory.mkdir()
    run(
        [str(venv.bin / "pipeline"), "init", ".", "--app", unique("newcomer")],
        cwd=directory,
        env=environment(venv),
    )
    topology = directory / "topologies" / "default.toml"
    topology.write_text(topology.read_text(encoding="utf-8").replace("partitions = 6", "partitions = 1"))
    return directory


def test_produce_and_ingress_before_the_topics_exist_say_so_at_once(
    venv: Venv, here: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    """``produce`` and ``ingress`` before ``topics create`` end in one line naming the command, within seconds."""
    env = environment(venv)
    pipeline = str(venv.bin / "pipeline")
    webhooks = here / "webhooks.jsonl"
    webhooks.write_text('{"source": "stripe", "headers": {}, "body": {"id": "evt_1", "object": "event"}}\n')
    expected = f"topic {unique('newcomer')}.raw does not exist: run 'pipeline topics create' first"
    produced, took = _attempt([pipeline, "produce", str(webhooks), "--bootstrap", bootstrap], here, env)
    assert _one_line(produced) == f"pipeline: error: {expected}"
    assert took < 5, f"produce took {took:.1f}s"  # it took 40 s, printing 400 aiokafka lines
    ingress, took = _attempt([pipeline, "ingress", "--bootstrap", bootstrap, "--port", "0"], here, env)
    assert _one_line(ingress) == f"pipeline: error: {expected}"
    assert took < 5, f"ingress took {took:.1f}s"  # it took 11 s


@pytest.mark.parametrize("command", [["topics", "create"], ["worker"], ["ingress"], ["tail", "x"], ["up"]])
def test_a_bootstrap_without_a_port_is_refused(venv: Venv, here: Path, command: list[str]) -> None:
    """``--bootstrap 127.0.0.1`` (no port) is one line asking for host:port, never a silent 9092."""
    env = environment(venv)
    result, _ = _attempt([str(venv.bin / "pipeline"), *command, "--bootstrap", "127.0.0.1"], here, env)
    assert _one_line(result) == (
        "pipeline: error: bootstrap servers '127.0.0.1': '127.0.0.1' has no port; give host:port"
        " (e.g. 127.0.0.1:9092)"
    )
    from_env, _ = _attempt(
        [str(venv.bin / "pipeline"), *command], here, {**env, "KAFKA_BOOTSTRAP_SERVERS": "localhost"}
    )
    assert "'localhost' has no port" in _one_line(from_env)


def test_a_broker_that_cannot_be_reached_is_our_line_alone(venv: Venv, here: Path) -> None:
    """At the default log level the Kafka client's own ERROR lines stay out of a failed command's stderr."""
    closed = free_port()
    env = {**environment(venv), "PIPELINE_LOG_LEVEL": "INFO"}
    result, _ = _attempt(
        [str(venv.bin / "pipeline"), "dlq", "list", "--bootstrap", f"127.0.0.1:{closed}"], here, env
    )
    assert _one_line(result).startswith(f"pipeline: error: cannot reach Kafka at 127.0.0.1:{closed}")


def test_up_checks_every_port_before_it_starts_the_broker(venv: Venv, here: Path, tmp_path: Path) -> None:
    """A taken --metrics-port stops ``up`` in one line at once, before the local broker starts."""
    env = {
        **environment(venv),
        "KAFKA_RUN_DIR": str(tmp_path / "kafka"),
        "KAFKA_CONTROLLER_PORT": str(free_port()),
    }
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = int(taken.getsockname()[1])
        argv = [str(venv.bin / "pipeline"), "up", "--kafka-port", str(free_port())]
        argv += ["--ingress-port", "0", "--metrics-port", str(busy)]
        result, took = _attempt(argv, here, env)
    line = _one_line(result)
    if "Java 17+" in line or "Maven" in line:
        pytest.skip(f"this machine cannot start a local broker: {line}")
    assert line.startswith(f"pipeline: error: metrics port {busy} on 127.0.0.1 is already in use")
    assert took < 5, f"up took {took:.1f}s"
    assert "Starting the local Kafka broker" not in result.stdout
    assert not (tmp_path / "kafka").exists()


def test_port_zero_logs_the_port_it_got(
    venv: Venv, here: Path, bootstrap: str, unique: Callable[[str], str]
) -> None:
    """``worker --metrics-port 0`` and ``ingress --port 0`` log the port they got, and ``up`` prints it; each answers."""
    pipeline = str(venv.bin / "pipeline")
    env = {**environment(venv), "PIPELINE_LOG_LEVEL": "INFO"}
    run([pipeline, "topics", "create", "--bootstrap", bootstrap], cwd=here, env=env)
    worker = [
        pipeline,
        "worker",
        "--bootstrap",
        bootstrap,
        "--group",
        unique("group"),
        "--state-dir",
        "state",
    ]
    ingress = [pipeline, "ingress", "--bootstrap", bootstrap, "--port", "0"]
    for argv, said in (
        ([*worker, "--metrics-port", "0"], r"metrics and inspect endpoint on port (\d+)"),
        (ingress, r"ingress listening on http://127\.0\.0\.1:(\d+)"),
    ):
        with running(argv, here, env) as process:
            assert process.stderr is not None
            port = int(wait_for_match(process, process.stderr, said)[1])
            assert port != 0
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                assert response.status == 200
    up = [pipeline, "up", "--bootstrap", bootstrap, "--state-dir", "up-state"]
    with running([*up, "--ingress-port", "0", "--metrics-port", "0"], here, env) as process:
        assert process.stdout is not None
        port = int(wait_for_match(process, process.stdout, r"metrics\s+http://127\.0\.0\.1:(\d+)/metrics")[1])
        assert port != 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            assert response.status == 200
        code, err = stop(process)
        assert code == 0, err


def test_dlq_list_refuses_an_unknown_reason(venv: Venv, here: Path) -> None:
    """``dlq list --reason bogus`` names the known reasons in one line and exits non-zero, before connecting."""
    env = environment(venv)
    result, _ = _attempt(
        [str(venv.bin / "pipeline"), "dlq", "list", "--reason", "bogus", "--bootstrap", "127.0.0.1:1"],
        here,
        env,
    )
    line = _one_line(result)
    assert "no DLQ record has reason 'bogus'" in line
    assert "bad-signature" in line


def test_init_cites_a_reference_the_install_carries(venv: Venv, here: Path) -> None:
    """The topology ``init`` wrote points at a topology reference that exists in the installed package."""
    header = (here / "topologies" / "default.toml").read_text(encoding="utf-8")[:400]
    cited = re.search(r"^#\s+(/\S*README\.md)$", header, re.MULTILINE)
    assert cited is not None, header
    reference = Path(cited[1])
    assert reference.is_relative_to(venv.root)
    assert "## " in reference.read_text(encoding="utf-8")


def test_an_example_without_its_extra_names_the_extra(venv: Venv, here: Path) -> None:
    """Without the postgres extra (the wheel alone), the PostgreSQL example says what to install, in one line."""
    argv = [str(venv.bin / "python"), str(ROOT / "examples" / "postgres_orders.py"), "--help"]
    result, _ = _attempt(argv, here, environment(venv))
    assert _one_line(result) == (
        "examples/postgres_orders.py needs psycopg: pip install 'webhook-pipeline[postgres]'"
    )

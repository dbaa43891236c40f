"""Shared fixtures: the real Kafka broker, unique names, and a topic factory.

The broker is the one given by ``KAFKA_BOOTSTRAP_SERVERS`` (scripts/test
starts one), or one this session starts with ``deploy/kafka/kafka.sh`` on a
free port. Under ``CI=true`` a missing broker fails the run; elsewhere the
tests that need it are skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from pipeline.kafka.admin import TopicSpec, ensure_topics
from tests.simulation import background

ROOT = Path(__file__).resolve().parent.parent
KAFKA_SH = ROOT / "deploy" / "kafka" / "kafka.sh"


@dataclass(frozen=True)
class Broker:
    """A running broker: where to reach it and where it logs."""

    bootstrap: str
    log_file: Path | None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_private_broker() -> tuple[Broker, Callable[[], None]]:
    run_dir = Path(tempfile.mkdtemp(prefix="pipeline-pytest-kafka."))
    port = _free_port()
    env = dict(os.environ, KAFKA_RUN_DIR=str(run_dir), KAFKA_CONTROLLER_PORT=str(_free_port()))
    subprocess.run([str(KAFKA_SH), "start", str(port)], check=True, env=env)

    def stop() -> None:
        subprocess.run([str(KAFKA_SH), "stop", str(port)], check=False, env=env)
        shutil.rmtree(run_dir, ignore_errors=True)

    return Broker(f"127.0.0.1:{port}", run_dir / str(port) / "kafka.log"), stop


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    """The real Kafka broker for this test session."""
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if given:
        log = os.environ.get("PIPELINE_TEST_BROKER_LOG")
        yield Broker(given, Path(log) if log else None)
        return
    if shutil.which("java") is None or shutil.which("mvn") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no Kafka broker: set KAFKA_BOOTSTRAP_SERVERS or install Java 17 and Maven")
        pytest.skip("no Kafka broker (set KAFKA_BOOTSTRAP_SERVERS or install Java and Maven)")
    try:
        started, stop = _start_private_broker()
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"could not start the Kafka broker: {exc}")
    os.environ["PIPELINE_TEST_BROKER_LOG"] = str(started.log_file)
    try:
        yield started
    finally:
        stop()


@pytest.fixture
def bootstrap(broker: Broker) -> str:
    """The broker's bootstrap address."""
    return broker.bootstrap


@dataclass(frozen=True)
class Unique:
    """Names unique to one test: ``prefix-<token>``; the token also finds them again for cleanup."""

    token: str

    def __call__(self, prefix: str) -> str:
        return f"{prefix}-{self.token}"

    def made(self, name: str) -> bool:
        """Whether ``name`` is one of this test's (``<prefix>-<token>``, maybe with a suffix)."""
        head, sep, tail = name.partition(f"-{self.token}")
        return bool(sep) and bool(head) and (not tail or tail[0] in ".-_")


@pytest.fixture
def unique() -> Unique:
    """Make names unique to this test (topics, groups, transactional ids)."""
    return Unique(uuid.uuid4().hex[:10])


TopicFactory = Callable[..., Awaitable[str]]


@pytest.fixture
async def make_topic(bootstrap: str, unique: Callable[[str], str]) -> AsyncIterator[TopicFactory]:
    """Create a topic with a unique name, given partitions and configs; delete it afterwards."""
    created: list[str] = []

    async def make(prefix: str = "t", partitions: int = 1, configs: dict[str, str] | None = None) -> str:
        name = unique(prefix)
        await ensure_topics(bootstrap, [TopicSpec(name, partitions, 1, configs or {})])
        created.append(name)
        return name

    yield make
    if created:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.delete_topics(created)
        finally:
            await admin.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int) -> None:
    """On failure, print the tail of the broker log so broker-side causes are visible."""
    log = os.environ.get("PIPELINE_TEST_BROKER_LOG")
    if exitstatus == 0 or not log or not Path(log).exists():
        return
    lines = Path(log).read_text(errors="replace").splitlines()[-40:]
    terminalreporter.section("last lines of the broker log")
    for line in lines:
        terminalreporter.write_line(line)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what they deselect
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The many-seed simulation test goes last, its run started now beside the other tests."""
    background.schedule(config, items)


def pytest_unconfigure(config: pytest.Config) -> None:
    """A session that ends early kills the simulation run it started."""
    background.stop(config)


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--seed N`` replays one simulation seed with its trace (``--mix NAME``: of that mix); ``--seeds N``
    runs that many, each mix its share."""
    group = parser.getgroup("simulation", "the deterministic simulation (tests/simulation)")
    group.addoption("--seed", type=int, default=None, help="replay this simulation seed, with its trace")
    group.addoption("--mix", default="default", help="the fault mix of --seed (tests/simulation/mixes.py)")
    group.addoption("--seeds", type=int, default=None, help="how many simulation seeds to run (default 500)")

"""Fixtures for tests that run the worker against the real broker."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from tests.chaos.cluster import Broker
from tests.conftest import Unique
from tests.integration.browser import browser  # noqa: F401  (the console tests' headless Chromium)
from tests.integration.faults import Workers
from tests.integration.harness import Env, write_topology
from tests.integration.postgres import postgres_db, postgres_dsn  # noqa: F401  (fixtures for this directory)
from tests.integration.wheel import Venv, installed_wheel


@pytest.fixture(autouse=True)
async def _delete_this_tests_topics(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """After a test that named things with ``unique``, delete the topics it (or a CLI it ran) made.

    Without this a suite run leaves thousands of partitions on the broker, and a broker carrying
    them starts slowly, spends its heap on them and collects garbage every half second.
    """
    if "unique" not in request.fixturenames or "bootstrap" not in request.fixturenames:
        yield
        return
    # Asked for here, before the test, so that both outlive this fixture's teardown.
    unique: Unique = request.getfixturevalue("unique")
    bootstrap: str = request.getfixturevalue("bootstrap")
    yield
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        mine = [name for name in await admin.list_topics() if unique.made(name)]
        if mine:
            await admin.delete_topics(mine)
    except KafkaError as exc:  # a test that stopped the broker on purpose; nothing to assert here
        warnings.warn(f"could not delete this test's topics: {exc!r}", stacklevel=1)
    finally:
        await admin.close()


@pytest.fixture
async def pipeline_env(
    bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> AsyncIterator[Callable[..., object]]:
    """Make a pipeline with unique topics and group; stops its workers afterwards."""
    envs: list[Env] = []

    async def make(**options: object) -> Env:
        app = unique("app")
        path = write_topology(tmp_path / f"{app}.toml", app, **options)  # type: ignore[arg-type]
        env = Env(bootstrap, path, tmp_path, f"{app}-group")
        await env.create_topics()
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.stop_all()


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The wheel built from these sources, installed in a fresh virtualenv (once per session)."""
    return installed_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Broker]:
    """A broker of this test alone (stopping the shared one would disturb the others); removed afterwards."""
    if shutil.which("java") is None:
        pytest.skip("a private broker needs Java")
    broker = Broker(tmp_path / "broker")
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
async def workers(bootstrap: str, tmp_path: Path) -> AsyncIterator[Workers]:
    """Worker subprocesses of this test; every one is stopped (SIGTERM, then SIGKILL) afterwards."""
    started = Workers(bootstrap, tmp_path / "logs")
    yield started
    started.stop_all()

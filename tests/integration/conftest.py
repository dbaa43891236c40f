"""Fixtures for tests that run the worker against the real broker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.integration.harness import Env, write_topology
from tests.integration.postgres import postgres_db, postgres_dsn  # noqa: F401  (fixtures for this directory)


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

"""A supervised worker process stops once its supervisor is gone (``pipeline.worker.parent_watch``)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pipeline.errors import ConfigError
from pipeline.worker.parent_watch import SUPERVISOR_PID_ENV, supervisor_pid, watch_parent


def test_no_supervisor_pid_means_no_supervisor() -> None:
    """A worker started by hand (the variable unset or empty) watches nothing."""
    assert supervisor_pid({}) is None
    assert supervisor_pid({SUPERVISOR_PID_ENV: " "}) is None


def test_the_supervisor_pid_is_read_from_the_environment() -> None:
    """The supervisor's pid, as it set it."""
    assert supervisor_pid({SUPERVISOR_PID_ENV: "4242"}) == 4242


@pytest.mark.parametrize("text", ["abc", "-5", "1", "0", "12.5"])
def test_a_supervisor_pid_that_is_no_process_id_fails_at_start(text: str) -> None:
    """A value that cannot name a supervisor (init included) is a configuration error, named."""
    with pytest.raises(ConfigError, match=SUPERVISOR_PID_ENV):
        supervisor_pid({SUPERVISOR_PID_ENV: text})


async def test_the_watch_stops_the_worker_once_the_parent_changes(caplog: pytest.LogCaptureFixture) -> None:
    """While the parent is the supervisor nothing happens; once it is not, ``on_gone`` runs once and the watch ends."""
    parents = iter([100, 100, 100, 1])
    stops: list[str] = []
    with caplog.at_level(logging.WARNING, logger="pipeline.worker.parent_watch"):
        await asyncio.wait_for(
            watch_parent(100, lambda: stops.append("stop"), every=0.001, parent=lambda: next(parents)),
            timeout=5,
        )
    assert stops == ["stop"]
    assert "supervisor (pid 100) is gone; stopping this worker process" in caplog.text


async def test_the_watch_does_nothing_while_the_supervisor_lives() -> None:
    """With the parent unchanged the watch keeps waiting and never stops the worker."""
    stops: list[str] = []
    watch = asyncio.create_task(
        watch_parent(100, lambda: stops.append("stop"), every=0.001, parent=lambda: 100)
    )
    await asyncio.sleep(0.05)
    assert not watch.done()
    watch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watch
    assert stops == []


@pytest.mark.parametrize("pid", [2, 3])
def test_any_process_id_above_init_names_a_supervisor(pid: int) -> None:
    """Only 0 and 1 (init) are refused: pid 2 and up are processes a supervisor can be."""
    assert supervisor_pid({SUPERVISOR_PID_ENV: str(pid)}) == pid

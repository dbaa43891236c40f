"""The ingress's event loop choice: uvloop when installed, asyncio's on request, a clear error otherwise."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import uvloop

from pipeline.errors import ConfigError
from pipeline.ingress.event_loop import loop_factory, running_loop_name
from pipeline.ingress.server import IngressSettings


def _name_under(choice: str) -> str:
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(_running_name())


async def _running_name() -> str:
    return running_loop_name()


def test_auto_runs_on_uvloop_when_it_is_installed() -> None:
    """The default gives uvloop's loop (a dependency of the package on Linux and macOS)."""
    assert loop_factory("auto") is uvloop.new_event_loop
    assert _name_under("auto") == "uvloop"


def test_asyncio_runs_on_the_standard_loop() -> None:
    """``asyncio`` leaves the loop to asyncio, which is what the start line then names."""
    assert loop_factory("asyncio") is None
    assert _name_under("asyncio") == "asyncio"


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where uvloop cannot be imported (Windows), ``auto`` still starts, on asyncio's loop."""
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert loop_factory("auto") is None


def test_uvloop_asked_for_but_missing_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asking for uvloop where it is missing fails at start, naming the way out."""
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(ConfigError, match=r"'uvloop' is not installed.*--event-loop asyncio"):
        loop_factory("uvloop")


def test_an_unknown_loop_is_refused() -> None:
    """A name that is not a choice is refused, by the factory and by the settings."""
    with pytest.raises(ConfigError, match="event loop must be one of auto, uvloop, asyncio, got 'tokio'"):
        loop_factory("tokio")
    with pytest.raises(ConfigError, match="event loop must be one of"):
        IngressSettings(bootstrap="127.0.0.1:9092", topology=Path("t.toml"), event_loop="tokio")

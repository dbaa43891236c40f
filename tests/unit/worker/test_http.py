"""The worker's metrics and inspect endpoint: where it listens."""

from __future__ import annotations

import socket

import pytest
from aiohttp import web

from pipeline.errors import ConfigError
from pipeline.worker import http as worker_http
from pipeline.worker.health import partition_health


async def test_a_metrics_port_already_taken_is_a_config_error_in_one_line() -> None:
    """serve() on a busy port raises ConfigError naming the port, and leaves nothing listening."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot serve metrics on port {port}"):
            await worker_http.serve(web.Application(), "127.0.0.1", port)


async def test_a_free_port_serves() -> None:
    """serve() on a free port returns the runner, which has one site until cleaned up."""
    runner = await worker_http.serve(web.Application(), "127.0.0.1", 0)
    try:
        assert len(runner.sites) == 1
    finally:
        await runner.cleanup()


def test_a_standby_behind_is_reported_and_never_makes_the_worker_unhealthy() -> None:
    """/healthz lists each standby with its lag; a copy thousands of records behind is slower failover, not unhealth."""
    standbys = {
        "raw-1": {
            "state": "following",
            "replaying": True,
            "position": 9,
            "lag_records": 5000,
            "lag_seconds": 42.0,
        }
    }
    healthy, detail = partition_health([], {}, failed=False, standbys=standbys)
    assert healthy
    assert detail["standby"] == standbys
    assert partition_health([], {}, failed=False)[1].get("standby") is None

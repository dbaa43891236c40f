"""The worker's HTTP endpoint: where it listens, and what /healthz and /readyz answer."""

from __future__ import annotations

import socket

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from pipeline.errors import ConfigError
from pipeline.worker import http as worker_http
from pipeline.worker.health import Health, partition_health


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
    health = partition_health([], {}, failed=False, standbys=standbys)
    assert health.ready
    assert health.live
    assert health.detail["standby"] == standbys
    assert partition_health([], {}, failed=False)[1].get("standby") is None


def test_a_failed_worker_is_neither_alive_nor_ready() -> None:
    """A worker whose loop failed is stopping to exit: /healthz and /readyz both say so, and why."""
    health = partition_health([], {}, failed=True)
    assert (health.ready, health.live) == (False, False)
    assert health.detail["status"] == "unhealthy"
    assert health.detail["problems"] == ["the worker failed and is stopping"]


@pytest.mark.parametrize(
    ("health", "healthz", "readyz"),
    [
        (Health(True, {"status": "ok"}, True), 200, 200),
        (Health(False, {"status": "not ready"}, True), 200, 503),
        (Health(False, {"status": "unhealthy"}, False), 503, 503),
    ],
    ids=["serving", "restoring", "stuck"],
)
async def test_healthz_answers_liveness_and_readyz_readiness(
    health: Health, healthz: int, readyz: int
) -> None:
    """/healthz answers from ``live`` and /readyz from ``ready``, both with the same body."""
    app = worker_http.build_app(dict, lambda _t, _k: 0, [], CollectorRegistry(), lambda: health)
    async with TestClient(TestServer(app)) as client:
        for path, status in (("/healthz", healthz), ("/readyz", readyz)):
            response = await client.get(path)
            assert response.status == status, path
            assert await response.json() == health.detail

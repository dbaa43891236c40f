"""The worker's HTTP endpoint: where it listens, and what /healthz and /readyz answer."""

from __future__ import annotations

import logging
import socket
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from yarl import URL

from pipeline.errors import ConfigError, PipelineError
from pipeline.state.decision import Entry
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


ENTRY = Entry(first_seen=1_000, expires_at=2_000, partition=5, offset=42, duplicates=2, topic="commands")


class FakeStore:
    """A seen-set that answers ``get_many`` from a dict."""

    def __init__(self, entries: dict[bytes, Entry]) -> None:
        self.entries = entries

    def get_many(self, keys: list[bytes]) -> dict[bytes, Entry]:
        """The entries of ``keys`` that exist."""
        return {key: self.entries[key] for key in keys if key in self.entries}


def _owner(partitions: dict[tuple[str, bytes], int]) -> worker_http.Owner:
    """An owner function answering only the (topic, key) pairs it is given."""
    return lambda topic, key: partitions[(topic, key)]


def _app(
    stores: dict[tuple[str, int], Any] | None = None,
    *,
    owner: worker_http.Owner = lambda _t, _k: 0,
    topics: list[str] | None = None,
    registry: CollectorRegistry | None = None,
    standbys: dict[str, Any] | None = None,
) -> web.Application:
    """A worker's app over the given stores, owner, topics, registry and standbys (healthy)."""
    return worker_http.build_app(
        lambda: stores or {},
        owner,
        topics or [],
        registry or CollectorRegistry(),
        lambda: Health(True, {"status": "ok"}, True),
        lambda: standbys or {},
    )


async def test_metrics_are_the_registry_in_prometheus_text_format() -> None:
    """/metrics answers 200 with the registry's exposition, typed as Prometheus' latest text format."""
    registry = CollectorRegistry()
    Counter("pipeline_test_events", "Events", ["source"], registry=registry).labels("stripe").inc(3)
    async with TestClient(TestServer(_app(registry=registry))) as client:
        response = await client.get("/metrics")
        assert response.status == 200
        assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
        body = await response.read()
    assert body == generate_latest(registry)
    assert b'pipeline_test_events_total{source="stripe"} 3.0' in body


async def test_partitions_lists_served_and_standby_partitions_by_topic() -> None:
    """/partitions: served partitions by topic in order, standby partitions by topic, and each standby's detail."""
    stores: dict[tuple[str, int], Any] = {("raw", 4): None, ("effects", 1): None, ("raw", 0): None}
    standbys = {
        "webhooks.raw-v2-3": {"state": "following", "position": 9, "lag_records": 1, "lag_seconds": 0.5},
        "webhooks.raw-v2-11": {"state": "opening", "position": -1, "lag_records": None, "lag_seconds": None},
    }
    async with TestClient(TestServer(_app(stores, standbys=standbys))) as client:
        response = await client.get("/partitions")
        assert response.status == 200
        assert response.content_type == "application/json"
        assert await response.json() == {
            "partitions": {"effects": [1], "raw": [0, 4]},
            "standby": {"webhooks.raw-v2": [3, 11]},
            "standbys": standbys,
        }


async def test_partitions_of_a_worker_serving_nothing_are_empty() -> None:
    """/partitions of a worker with no partition and no standby lists nothing."""
    async with TestClient(TestServer(_app())) as client:
        response = await client.get("/partitions")
        assert response.status == 200
        assert await response.json() == {"partitions": {}, "standby": {}, "standbys": {}}


async def test_a_known_key_is_answered_by_the_partition_that_owns_it() -> None:
    """/keys/{key} skips a topic whose owning partition is elsewhere and answers from the one held here."""
    stores: dict[tuple[str, int], Any] = {
        ("raw", 2): FakeStore({b"other:1": ENTRY}),
        ("effects", 5): FakeStore({b"stripe:evt_1": ENTRY}),
    }
    owner = _owner({("raw", b"stripe:evt_1"): 3, ("effects", b"stripe:evt_1"): 5})
    app = _app(stores, owner=owner, topics=["raw", "effects"])
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/keys/stripe:evt_1")
        assert response.status == 200
        assert await response.json() == {
            "key": "stripe:evt_1",
            "owned": True,
            "topic": "effects",
            "partition": 5,
            "known": True,
            "entry": {
                "first_seen": 1_000,
                "expires_at": 2_000,
                "partition": 5,
                "offset": 42,
                "duplicates": 2,
                "last_seen": 0,
                "command": None,
                "topic": "commands",
                "body_hash": None,
                "conflicts": 0,
            },
        }


async def test_an_owned_key_never_seen_is_unknown() -> None:
    """A key whose partition is held here but absent from its seen-set: owned, not known, no entry."""
    stores: dict[tuple[str, int], Any] = {("raw", 1): FakeStore({b"stripe:evt_2": ENTRY})}
    app = _app(stores, owner=_owner({("raw", b"stripe:evt_1"): 1}), topics=["raw"])
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/keys/stripe:evt_1")
        assert response.status == 200
        assert await response.json() == {
            "key": "stripe:evt_1",
            "owned": True,
            "topic": "raw",
            "partition": 1,
            "known": False,
        }


async def test_a_key_owned_elsewhere_is_404_not_owned() -> None:
    """When no topic's owning partition is held here, /keys/{key} answers 404 {"key", "owned": false}."""
    stores: dict[tuple[str, int], Any] = {("raw", 0): FakeStore({b"stripe:evt_1": ENTRY})}
    owner = _owner({("raw", b"stripe:evt_1"): 1, ("effects", b"stripe:evt_1"): 2})
    app = _app(stores, owner=owner, topics=["raw", "effects"])
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/keys/stripe:evt_1")
        assert response.status == 404
        assert response.content_type == "application/json"
        assert await response.json() == {"key": "stripe:evt_1", "owned": False}


async def test_a_key_quoted_whole_is_looked_up_as_it_was() -> None:
    """A key with "/", "?", "#", "%" and spaces, quoted whole as ``pipeline inspect`` does, reaches its seen-set."""
    name = "src:a/b?c#d%e f"
    stores: dict[tuple[str, int], Any] = {("raw", 0): FakeStore({name.encode(): ENTRY})}
    app = _app(stores, owner=_owner({("raw", name.encode()): 0}), topics=["raw"])
    async with TestClient(TestServer(app)) as client:
        response = await client.get(URL("/keys/" + quote(name, safe=""), encoded=True))
        assert response.status == 200
        answer = await response.json()
    assert (answer["key"], answer["known"]) == (name, True)


async def test_serve_listens_only_on_the_host_asked_without_an_access_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """serve() binds the one host given (not every interface), bound_port() names the port, and requests are not logged."""
    app = _app()
    with caplog.at_level(logging.DEBUG):
        runner = await worker_http.serve(app, "127.0.0.1", 0)
        try:
            port = worker_http.bound_port(runner)
            assert runner.addresses == [("127.0.0.1", port)]
            async with (
                ClientSession() as session,
                session.get(f"http://127.0.0.1:{port}/healthz") as response,
            ):
                assert response.status == 200
        finally:
            await runner.cleanup()
    assert [record for record in caplog.records if record.name == "aiohttp.access"] == []


async def test_bound_port_of_a_runner_not_listening_is_an_error() -> None:
    """bound_port() on a runner with no site raises PipelineError saying the endpoint is not listening."""
    runner = web.AppRunner(web.Application())
    await runner.setup()
    try:
        with pytest.raises(PipelineError, match=r"^the worker's HTTP endpoint is not listening$"):
            worker_http.bound_port(runner)
    finally:
        await runner.cleanup()

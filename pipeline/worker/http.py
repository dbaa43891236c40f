"""The worker's small HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``, ``/partitions`` and ``/keys/{key}``.

``/readyz`` answers 503 while an assigned partition is not served (opening,
restoring, broken, fenced) or is stuck (work waiting and no commit for
``stuck_after``), or while the worker stops. ``/healthz`` (liveness) answers 503
only when a partition is stuck or the worker failed: opening and restoring are
alive. Both bodies give each partition's state, the problems, and the standby
replicas this worker keeps (``standby``: state, position, lag in records and
seconds), which never make it unready. ``/partitions`` lists the partitions
served here and those kept as standby.

``/keys/{key}`` answers from the seen-set of the partition that owns the key,
when this worker owns it (for an event key, the input partition; for an
effect key, the effects partition): that is what ``pipeline inspect`` asks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from pipeline.errors import ConfigError, PipelineError
from pipeline.state.decision import Entry
from pipeline.state.store import PartitionStore
from pipeline.worker.health import Health

# (topic, partition) -> store, for the partitions this worker owns now
Stores = Callable[[], Mapping[tuple[str, int], PartitionStore]]
Owner = Callable[[str, bytes], int]  # (topic, key) -> partition
HealthCheck = Callable[[], Health]
Standbys = Callable[[], Mapping[str, Mapping[str, Any]]]  # "<topic>-<partition>" -> state, position, lag


def build_app(
    stores: Stores,
    owner: Owner,
    topics: list[str],
    registry: CollectorRegistry,
    health: HealthCheck,
    standbys: Standbys = dict,
) -> web.Application:
    """The aiohttp application of a worker."""

    async def metrics(_request: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_request: web.Request) -> web.Response:
        """200 while no partition is stuck and the worker has not failed (opening and restoring are alive)."""
        answer = health()
        return web.json_response(answer.detail, status=200 if answer.live else 503)

    async def readyz(_request: web.Request) -> web.Response:
        """200 when every assigned partition is served and none is stuck; 503 with the reasons otherwise."""
        answer = health()
        return web.json_response(answer.detail, status=200 if answer.ready else 503)

    async def partitions(_request: web.Request) -> web.Response:
        owned: dict[str, list[int]] = {}
        for topic, partition in sorted(stores()):
            owned.setdefault(topic, []).append(partition)
        copies = standbys()
        held: dict[str, list[int]] = {}
        for name in copies:
            topic, _, number = name.rpartition("-")
            held.setdefault(topic, []).append(int(number))
        return web.json_response({"partitions": owned, "standby": held, "standbys": dict(copies)})

    async def key(request: web.Request) -> web.Response:
        name = request.match_info["key"]
        raw = name.encode()
        current = stores()
        for topic in topics:
            partition = owner(topic, raw)
            store = current.get((topic, partition))
            if store is None:
                continue
            found = store.get_many([raw]).get(raw)
            return web.json_response(describe(name, topic, partition, found))
        return web.json_response({"key": name, "owned": False}, status=404)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/partitions", partitions)
    app.router.add_get("/keys/{key}", key)
    return app


def describe(key: str, topic: str, partition: int, entry: Entry | None) -> dict[str, Any]:
    """What a worker says about a key it owns."""
    answer: dict[str, Any] = {
        "key": key,
        "owned": True,
        "topic": topic,
        "partition": partition,
        "known": entry is not None,
    }
    if entry is not None:
        answer["entry"] = entry._asdict()
    return answer


async def serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Listen on ``host:port``; a port that cannot be had is a ConfigError (nothing is left running)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"cannot serve metrics on port {port}: {exc}") from None
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port ``runner`` listens on: the one asked for, or the one the system chose for port 0."""
    if not runner.addresses:
        raise PipelineError("the worker's HTTP endpoint is not listening")
    return int(runner.addresses[0][1])

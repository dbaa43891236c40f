"""The HTTP ingress against a real broker: contract records, refusals, and a broker outage."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from pipeline import topology
from pipeline.ingress.server import Ingress, IngressSettings
from pipeline.ingress.sink import KafkaSink, OutgoingRecord, Produced
from pipeline.kafka.admin import ensure_topics, topic_specs
from pipeline.kafka.partitioner import owner_partition
from pipeline.providers.signing import sign
from tests.conftest import KAFKA_SH
from tests.integration.harness import read_committed, write_topology

pytestmark = pytest.mark.broker

SECRET = "whsec_integration_secret_42"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stripe_body(event_id: str) -> bytes:
    # Deliberately unusual spacing and unicode: the record must keep the body byte for byte.
    head = '{"id": "' + event_id + '",  "object":"event", "type": "invoice.paid",\n'
    return (head + ' "data": {"note": "caf\u00e9 \u2713"}}').encode()


async def _create_topics(bootstrap: str, path: Path) -> list[str]:
    specs = topic_specs(topology.load(path))
    await ensure_topics(bootstrap, specs)
    return [s.name for s in specs]


async def _delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(names)
    finally:
        await admin.close()


@asynccontextmanager
async def _serving(bootstrap: str, path: Path, **options: object) -> AsyncIterator[tuple[Ingress, str]]:
    """A real ingress listening on a free port; stopped (drained) afterwards."""
    settings = IngressSettings(bootstrap=bootstrap, topology=path, port=0, **options)  # type: ignore[arg-type]
    ingress = Ingress(settings)
    await ingress.start()
    runner = asyncio.create_task(ingress.run())
    try:
        yield ingress, f"http://127.0.0.1:{ingress.port}"
    finally:
        ingress.stop()
        await asyncio.wait_for(runner, 30)


@pytest.fixture
def signed_app(
    tmp_path: Path, unique: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, str]:
    """A topology file with a verified stripe source whose secret is set in the environment."""
    app = unique("app")
    secret_env = f"STRIPE_SECRET_{app.replace('-', '_').upper()}"
    monkeypatch.setenv(secret_env, SECRET)
    return write_topology(tmp_path / f"{app}.toml", app, secrets={"stripe": secret_env}), app


async def test_a_signed_webhook_lands_on_its_key_partition_byte_for_byte(
    bootstrap: str, signed_app: tuple[Path, str]
) -> None:
    """A signed Stripe webhook is acked 202 and stored on murmur2(key)'s partition with the contract's headers."""
    path, app = signed_app
    topics = await _create_topics(bootstrap, path)
    try:
        body = _stripe_body("evt_integration_1")
        headers = sign("stripe", body, SECRET, timestamp=time.time()) | {"X-Request-Id": "req-1"}
        before = int(time.time() * 1000)
        async with _serving(bootstrap, path) as (_, url), aiohttp.ClientSession() as session:
            response = await session.post(f"{url}/webhooks/stripe", data=body, headers=headers)
            assert response.status == 202, await response.text()
            answer = await response.json()
        after = int(time.time() * 1000)
        key = b"stripe:evt_integration_1"
        assert answer["key"] == key.decode()
        assert answer["partition"] == owner_partition(key, 4)
        records = await read_committed(bootstrap, f"{app}.raw")
        assert len(records) == 1
        (record,) = records
        assert record.key == key
        assert record.value == body
        assert record.partition == answer["partition"]
        assert record.offset == answer["offset"]
        produced = dict(record.headers)
        assert produced["source"] == b"stripe"
        received_at = int(produced["received-at"])
        assert before <= received_at <= after
        assert record.timestamp == received_at
        assert produced["http-stripe-signature"] == headers["Stripe-Signature"].encode()
        assert produced["http-x-request-id"] == b"req-1"
        assert "http-content-length" not in produced
    finally:
        await _delete_topics(bootstrap, topics)


async def test_a_forged_webhook_is_refused_and_produces_nothing(
    bootstrap: str, signed_app: tuple[Path, str]
) -> None:
    """A webhook signed with the wrong secret answers 401 and the input topic stays empty."""
    path, app = signed_app
    topics = await _create_topics(bootstrap, path)
    try:
        body = _stripe_body("evt_forged")
        headers = sign("stripe", body, "whsec_attacker", timestamp=time.time())
        async with _serving(bootstrap, path) as (_, url), aiohttp.ClientSession() as session:
            response = await session.post(f"{url}/webhooks/stripe", data=body, headers=headers)
            assert response.status == 401
            assert (await response.json())["reason"] == "bad-signature"
            assert (await session.get(f"{url}/readyz")).status == 200
        assert await read_committed(bootstrap, f"{app}.raw", idle=1.0) == []
    finally:
        await _delete_topics(bootstrap, topics)


class _PrivateBroker:
    """A broker of this test alone (never the shared one), stoppable and restartable with its data."""

    def __init__(self) -> None:
        self.run_dir = Path(tempfile.mkdtemp(prefix="pipeline-ingress-kafka."))
        self.port = _free_port()
        self.env = dict(os.environ, KAFKA_RUN_DIR=str(self.run_dir), KAFKA_CONTROLLER_PORT=str(_free_port()))

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _kafka_sh(self, action: str) -> None:
        subprocess.run([str(KAFKA_SH), action, str(self.port)], check=True, env=self.env)

    async def start(self) -> None:
        await asyncio.to_thread(self._kafka_sh, "start")

    async def stop(self) -> None:
        await asyncio.to_thread(self._kafka_sh, "stop")

    def wipe(self) -> None:
        subprocess.run([str(KAFKA_SH), "stop", str(self.port)], check=False, env=self.env)
        shutil.rmtree(self.run_dir, ignore_errors=True)


@pytest.fixture
def private_broker() -> Iterator[_PrivateBroker]:
    """A private broker (needs Java and Maven); removed with its data afterwards."""
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("a private broker needs Java and Maven")
    broker = _PrivateBroker()
    try:
        yield broker
    finally:
        broker.wipe()


@pytest.mark.slow
async def test_a_request_that_stops_waiting_leaves_its_batch_neighbours_acked(
    bootstrap: str, signed_app: tuple[Path, str]
) -> None:
    """Cancelling one send's wait (its request timed out) neither fails nor loses the others in its batch."""
    path, app = signed_app
    topics = await _create_topics(bootstrap, path)
    sink = KafkaSink(bootstrap, f"{app}.raw")
    await sink.start()
    try:
        now = int(time.time() * 1000)
        records = [
            OutgoingRecord(key=f"k{i}".encode(), value=b"{}", headers=(), partition=0, timestamp_ms=now)
            for i in range(3)
        ]
        sends = [asyncio.create_task(sink.send(record)) for record in records]
        await asyncio.sleep(0)  # each record is appended to partition 0's open batch, none sent yet
        sends[1].cancel()
        first, cancelled, last = await asyncio.gather(*sends, return_exceptions=True)
        assert isinstance(cancelled, asyncio.CancelledError)
        assert isinstance(first, Produced)
        assert isinstance(last, Produced)
        assert last.offset == first.offset + 2  # consecutive: the cancelled wait did not unsend its record
        assert await sink.ready()
        keys = [r.key for r in await read_committed(bootstrap, f"{app}.raw")]
        assert keys == [b"k0", b"k1", b"k2"]
    finally:
        await sink.stop()
        await _delete_topics(bootstrap, topics)


async def test_broker_outage_answers_503_quickly_then_recovers(
    private_broker: _PrivateBroker, signed_app: tuple[Path, str]
) -> None:
    """With the broker stopped the ingress answers 503 fast and is not ready; once it is back, 202 again."""
    path, app = signed_app
    await private_broker.start()
    await _create_topics(private_broker.bootstrap, path)

    async def post(session: aiohttp.ClientSession, url: str, event_id: str) -> aiohttp.ClientResponse:
        body = _stripe_body(event_id)
        headers = sign("stripe", body, SECRET, timestamp=time.time())
        return await session.post(f"{url}/webhooks/stripe", data=body, headers=headers)

    async with (
        _serving(private_broker.bootstrap, path, produce_timeout=1.0) as (_, url),
        aiohttp.ClientSession() as session,
    ):
        assert (await post(session, url, "evt_before")).status == 202
        await private_broker.stop()

        started = time.monotonic()
        response = await post(session, url, "evt_during")
        assert response.status == 503
        assert response.headers["Retry-After"]
        assert (await response.json())["reason"] == "broker-unavailable"
        assert time.monotonic() - started < 3.0
        # Later requests are not stuck behind the first one: each answers within the timeout too.
        started = time.monotonic()
        statuses = [
            r.status for r in await asyncio.gather(*(post(session, url, f"evt_d{i}") for i in range(5)))
        ]
        assert statuses == [503] * 5
        assert time.monotonic() - started < 3.0
        await asyncio.sleep(2.5)  # let the cached readiness expire
        assert (await session.get(f"{url}/readyz")).status == 503
        assert (await session.get(f"{url}/healthz")).status == 200

        await private_broker.start()
        deadline = time.monotonic() + 20
        status = 0
        while time.monotonic() < deadline:
            status = (await post(session, url, "evt_after")).status
            if status == 202:
                break
            await asyncio.sleep(0.5)
        assert status == 202
        assert (await session.get(f"{url}/readyz")).status == 200

    keys = {r.key for r in await read_committed(private_broker.bootstrap, f"{app}.raw", idle=1.0)}
    assert {b"stripe:evt_before", b"stripe:evt_after"} <= keys

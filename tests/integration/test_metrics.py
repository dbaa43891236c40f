"""The worker's and the ingress's /metrics parse with prometheus-client and count what happened."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.providers.signing import sign
from tests.integration.harness import ROOT, Env, wait_for_audit

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]
SECRET = "whsec_metrics_test_secret"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        text = await response.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


async def _wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(f"{url} never answered 200")


async def test_worker_and_ingress_metrics_count_deliveries(pipeline_env: MakeEnv) -> None:
    """Two copies through the ingress and one bad record: both /metrics endpoints parse and agree."""
    env: Env = await pipeline_env(secrets={"stripe": "METRICS_STRIPE_SECRET"})
    worker_port, ingress_port = _free_port(), _free_port()
    env.start_worker("w1", "--metrics-port", str(worker_port))
    ingress = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "ingress",
            "--bootstrap",
            env.bootstrap,
            "--topology",
            str(env.topology_path),
            "--port",
            str(ingress_port),
        ],
        cwd=ROOT,
        env=dict(os.environ, METRICS_STRIPE_SECRET=SECRET),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env.processes.append(ingress)
    base = f"http://127.0.0.1:{ingress_port}"
    await _wait_http(f"{base}/readyz")
    body = orjson.dumps(
        {"id": "evt_metrics", "object": "event", "type": "invoice.paid", "data": {"object": {}}}
    )
    headers = sign("stripe", body, SECRET, timestamp=time.time())
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            async with session.post(f"{base}/webhooks/stripe", data=body, headers=headers) as response:
                assert response.status == 202
        async with session.post(
            f"{base}/webhooks/stripe", data=body, headers={**headers, "Stripe-Signature": "t=1,v1=00"}
        ) as response:
            assert response.status == 401
    await env.produce([(b"stripe:evt_bad", b"not json", [("source", b"stripe")], None, None)])
    await wait_for_audit(env, 3)

    worker = await _scrape(f"http://127.0.0.1:{worker_port}/metrics")
    assert worker[("pipeline_events_total", (("outcome", "first"), ("source", "stripe")))] == 1
    assert worker[("pipeline_events_total", (("outcome", "duplicate"), ("source", "stripe")))] == 1
    assert worker[("pipeline_events_total", (("outcome", "invalid"), ("source", "stripe")))] == 1
    assert worker[("pipeline_commands_total", (("topic", env.topo.topics.commands),))] == 1
    assert worker[("pipeline_dlq_records_total", (("reason", "bad-body"),))] == 1
    assert worker[("pipeline_transaction_commit_seconds_count", ())] >= 1
    assert any(name == "pipeline_store_keys" for name, _ in worker)
    assert any(name == "pipeline_consumer_lag" for name, _ in worker)

    ingress_samples = await _scrape(f"{base}/metrics")
    statuses = {
        dict(labels).get("status"): value
        for (name, labels), value in ingress_samples.items()
        if name == "pipeline_ingress_requests_total"
    }
    assert statuses.get("202") == 2
    assert statuses.get("401") == 1
    assert any(name == "pipeline_ingress_request_seconds_bucket" for name, _ in ingress_samples)

"""Redrive from the console in a real browser, against the real broker and real workers: exactly what the
page counted, after a confirmation, recorded in Kafka, and still there after the console restarts."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from pipeline.headers import REPLAYED_FROM_HEADER
from pipeline.providers.signing import sign
from tests.integration.browser import screenshot, start_console, stop, wait_until
from tests.integration.harness import Env, command_counts, read_committed, wait_for_audit

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]
SECRET = "gh-redrive-secret-0123456789"
FORGED = "d-9\nINFO pipeline.console.redrive redrive 99 by mallory"


def _github(delivery_id: str, secret: str) -> Any:
    """A GitHub push as the ingress writes it, signed with ``secret``."""
    body = orjson.dumps({"ref": "refs/heads/main", "after": delivery_id})
    received = int(time.time() * 1000)
    signed = sign("github", body, secret, timestamp=received / 1000, msg_id=delivery_id, event_type="push")
    headers = [("source", b"github"), ("received-at", str(received).encode())]
    headers += [(f"http-{name.lower()}", value.encode()) for name, value in signed.items()]
    return (f"github:{delivery_id}".encode(), body, headers, None, received)


def _wait(driver: WebDriver, check: Callable[[WebDriver], Any], timeout: float = 60.0) -> Any:
    return wait_until(driver, check, timeout)


def _text(driver: WebDriver, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def _marks(driver: WebDriver) -> Counter[str]:
    return Counter(
        str(r.get_attribute("data-mark")) for r in driver.find_elements(By.CSS_SELECTOR, "#records tbody tr")
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)


async def _replayed(env: Env) -> Counter[str]:
    """How many records of the input topic each DLQ record was replayed into."""
    records = await read_committed(env.bootstrap, env.topo.topics.input, idle=1.0)
    return Counter(
        value.decode() for r in records for name, value in r.headers if name == REPLAYED_FROM_HEADER
    )


async def test_redrive_all_sends_exactly_the_page_and_its_history_survives_a_restart(
    pipeline_env: MakeEnv, browser: WebDriver, tmp_path: Any
) -> None:
    """ "Redrive all 10" redrives the 10 the page counted though 4 more arrived before the click, after a
    confirmation; the run and each record's mark (failed again, with its new DLQ record) are read back
    from Kafka by a restarted console; once the cause is fixed, redriving the open ones resolves all
    and the counts say so; no log line is forged by a key holding a newline."""
    variable = f"CONSOLE_REDRIVE_{os.getpid()}_{time.monotonic_ns()}"
    env: Env = await pipeline_env(secrets={"github": variable}, verify="worker", partitions=2)
    os.environ[variable] = "a-stale-secret-0000"
    stale = env.start_worker("stale")
    first = [_github(f"d-{i}", SECRET) for i in range(9)] + [_github(FORGED, SECRET)]
    await env.produce(first)
    await wait_for_audit(env, 10)
    log = tmp_path / "console.log"
    console, base = start_console(env.bootstrap, env.topology_path, log, "--workers", "")
    try:
        browser.get(f"{base}/dlq?reason=bad-signature")
        assert _text(browser, "counted") == "10"
        assert _text(browser, "redrive-all") == "Redrive all 10 matching…"
        await env.produce([_github(f"late-{i}", SECRET) for i in range(4)])  # after the page was drawn
        await wait_for_audit(env, 14)
        browser.find_element(By.ID, "redrive-all").click()
        _wait(browser, lambda d: d.find_elements(By.ID, "confirm"))
        assert _text(browser, "confirm") == "Redrive these 10"
        assert "bad-signature 10" in _text(browser, "confirm-reasons")
        screenshot(browser, "redrive-confirm")
        browser.find_element(By.ID, "confirm").click()
        _wait(browser, lambda d: "/redrives/" in d.current_url)
        run_id = browser.current_url.rsplit("/", 1)[1]
        _wait(browser, lambda d: d.find_element(By.ID, "run-state").get_attribute("data-state") == "done", 90)
        rows = browser.find_elements(By.CSS_SELECTOR, "#redriven tbody tr")
        assert len(rows) == 10
        assert {r.get_attribute("data-outcome") for r in rows} == {"invalid"}  # the secret is still stale
        assert len(browser.find_elements(By.CSS_SELECTOR, "#redriven a.new-record")) == 10
        replayed = await _replayed(env)
        assert sum(replayed.values()) == 10
        assert set(replayed.values()) == {1}
    finally:
        assert stop(console) == 0

    console, base = start_console(env.bootstrap, env.topology_path, log, "--workers", "")  # a new console
    try:
        browser.get(f"{base}/redrives")
        _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f'#runs tr[data-run="{run_id}"]'))
        assert (
            "10 failed again" in browser.find_element(By.CSS_SELECTOR, f'#runs tr[data-run="{run_id}"]').text
        )
        screenshot(browser, "redrive-history")
        browser.get(f"{base}/redrives/{run_id}")
        outcomes = [
            r.get_attribute("data-outcome")
            for r in browser.find_elements(By.CSS_SELECTOR, "#redriven tbody tr")
        ]
        assert outcomes == ["invalid"] * 10
        browser.get(f"{base}/dlq?reason=bad-signature")
        assert _text(browser, "counted") == "24"  # 10 redriven, 4 late, and the 10 that came back
        assert dict(_marks(browser)) == {"failed again": 10, "open": 14}
        screenshot(browser, "dlq-marks")
        browser.find_element(By.ID, "f-open").click()
        browser.find_element(By.ID, "apply").click()
        _wait(browser, lambda d: "open=1" in d.current_url)
        assert _text(browser, "counted") == "14"

        _stop(stale)  # the cause fixed: a worker with the right secret
        os.environ[variable] = SECRET
        env.start_worker("fixed")
        browser.find_element(By.ID, "redrive-all").click()
        _wait(browser, lambda d: d.find_elements(By.ID, "confirm"))
        assert _text(browser, "confirm") == "Redrive these 14"
        browser.find_element(By.ID, "confirm").click()
        _wait(browser, lambda d: "/redrives/" in d.current_url and d.current_url.rsplit("/", 1)[1] != run_id)
        _wait(
            browser, lambda d: d.find_element(By.ID, "run-state").get_attribute("data-state") == "done", 120
        )
        outcomes = [
            r.get_attribute("data-outcome")
            for r in browser.find_elements(By.CSS_SELECTOR, "#redriven tbody tr")
        ]
        assert outcomes == ["first"] * 14
        browser.get(f"{base}/dlq?reason=bad-signature&open=1")
        assert _text(browser, "counted") == "0"
        browser.get(f"{base}/dlq?reason=bad-signature")
        assert dict(Counter(_marks(browser))) == {"failed again": 10, "resolved": 14}
        await asyncio.sleep(1.0)  # a second command, if any, would be committed by now
        commands = command_counts(await read_committed(env.bootstrap, env.topo.topics.commands, idle=1.0))
        assert len(commands) == 14
        assert set(commands.values()) == {1}
    finally:
        assert stop(console) == 0
        del os.environ[variable]
    text = log.read_text()
    assert re.search(rf"redrive {run_id} by local \(redrive\) from 127\.0\.0\.1: replayed 10 ", text), text
    lines = text.splitlines() + (env.state_root / "stale.log").read_text().splitlines()
    assert not [line for line in lines if line.startswith("INFO pipeline.console.redrive redrive 99")]
    assert "github:d-9\\nINFO pipeline.console.redrive" in text

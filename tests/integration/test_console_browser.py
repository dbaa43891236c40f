"""The operator console in a real browser (headless Chromium), against the real broker and real workers.

Each test runs ``pipeline worker`` and ``pipeline console`` as processes and
looks only through the browser, then checks what it saw against Kafka.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import aiohttp
import orjson
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from pipeline.providers.signing import sign
from tests.integration.browser import ROOT, free_port, screenshot, start_console, stop, wait_until
from tests.integration.harness import Env, command_counts, read_committed, wait_for_audit

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]
SECRET = "gh-console-secret-0123456789"


def _github(delivery_id: str, secret: str, *, extra: list[tuple[str, bytes]] | None = None) -> Any:
    """A GitHub push as the ingress writes it, signed with ``secret``."""
    body = orjson.dumps({"ref": "refs/heads/main", "after": delivery_id})
    received = int(time.time() * 1000)
    signed = sign("github", body, secret, timestamp=received / 1000, msg_id=delivery_id, event_type="push")
    headers = [("source", b"github"), ("received-at", str(received).encode())]
    headers += [(f"http-{name.lower()}", value.encode()) for name, value in signed.items()]
    return (f"github:{delivery_id}".encode(), body, headers + (extra or []), None, received)


def _wait(driver: WebDriver, check: Callable[[WebDriver], Any], timeout: float = 30.0) -> Any:
    return wait_until(driver, check, timeout)


def _text(driver: WebDriver, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


async def _audit_of(env: Env, key: str) -> list[Any]:
    records = await read_committed(env.bootstrap, env.topo.topics.audit, idle=1.0)
    return [r for r in records if r.key == key.encode()]


async def test_the_browser_finds_a_key_and_its_deliveries_match_the_audit(
    pipeline_env: MakeEnv, browser: WebDriver, tmp_path: Any
) -> None:
    """A bare event id typed into the page finds its key; the delivery list is the audit topic's, and the command's offset is real."""
    env: Env = await pipeline_env(partitions=2)
    metrics = free_port()
    env.start_worker("w", "--metrics-port", str(metrics))
    now = int(time.time() * 1000)
    await env.produce_stripe(["evt_console_1", "evt_console_2"], timestamp_ms=now)
    await env.produce_stripe(["evt_console_1"], timestamp_ms=now + 1000)
    await env.produce_stripe(["evt_console_1"], timestamp_ms=now + 2000)
    await wait_for_audit(env, 4)
    workers = ["--workers", f"127.0.0.1:{metrics}", "--group", env.group]
    console, base = start_console(env.bootstrap, env.topology_path, tmp_path / "console.log", *workers)
    try:
        browser.get(f"{base}/")
        screenshot(browser, "home")
        browser.find_element(By.ID, "q").send_keys("evt_console_1")
        browser.find_element(By.ID, "find").click()
        _wait(browser, lambda d: d.find_elements(By.ID, "deliveries"))
        assert unquote(browser.current_url) == f"{base}/keys/stripe:evt_console_1"
        screenshot(browser, "key")
        assert _text(browser, "status").startswith("Processed")
        assert _text(browser, "duplicates").startswith("2")
        rows = browser.find_elements(By.CSS_SELECTOR, "#deliveries tbody tr")
        shown = [(r.get_attribute("data-audit"), r.get_attribute("data-outcome")) for r in rows]
        audit = await _audit_of(env, "stripe:evt_console_1")
        assert shown == [(f"{a.partition}:{a.offset}", orjson.loads(a.value)["outcome"]) for a in audit]
        assert [o for _, o in shown] == ["first", "duplicate", "duplicate"]

        command = _text(browser, "command")  # "handle on <topic> partition P offset O"
        words = command.split()
        topic, partition, offset = words[2], int(words[4]), int(words[6])
        assert topic == env.topo.topics.commands
        commands = await read_committed(env.bootstrap, topic, idle=1.0)
        (mine,) = [c for c in commands if c.key == b"stripe:evt_console_1"]
        assert (mine.partition, mine.offset) == (partition, offset)

        browser.get(f"{base}/keys/stripe%3Aevt_never")  # a key's own URL, shared
        assert _text(browser, "status").startswith("Never seen")
        browser.get(f"{base}/partitions")
        _wait(browser, lambda d: "healthy" in d.find_element(By.ID, "workers").text)
        states = {
            r.get_attribute("data-partition"): r.get_attribute("data-state")
            for r in browser.find_elements(By.CSS_SELECTOR, "#partitions tbody tr")
        }
        assert states == {f"{env.topo.topics.input}-{p}": "ready" for p in range(2)}
        lags = [
            r.get_attribute("data-lag")
            for r in browser.find_elements(By.CSS_SELECTOR, "#partitions tbody tr")
        ]
        assert lags == ["0", "0"]  # every record handled and committed, read from the group's offsets
        before = browser.find_element(By.CSS_SELECTOR, "#rate-accepted polyline").get_attribute("points")
        for second in range(4):  # a few seconds of traffic: the page's charts refresh by themselves
            await env.produce_stripe([f"evt_live_{second}_{i}" for i in range(25)])
            await asyncio.sleep(1.0)
        _wait(
            browser,
            lambda d: (
                not d.find_element(By.ID, "rate-accepted").text.startswith("accepted: 0.0/s (peak 0.0/s)")
            ),
        )
        assert (
            browser.find_element(By.CSS_SELECTOR, "#rate-accepted polyline").get_attribute("points") != before
        )
        screenshot(browser, "partitions")
    finally:
        assert stop(console) == 0


async def test_a_dlq_record_redriven_from_the_page_after_the_fix_gives_exactly_one_command(
    pipeline_env: MakeEnv, browser: WebDriver, tmp_path: Any
) -> None:
    """A bad signature lands in the DLQ; once the secret is fixed, a redrive from the page makes one command, shown as 'first'."""
    variable = f"CONSOLE_GH_{os.getpid()}_{time.monotonic_ns()}"
    env: Env = await pipeline_env(secrets={"github": variable}, verify="worker")
    os.environ[variable] = "a-stale-secret-0000"
    try:
        env.start_worker("stale")
        await env.produce([_github("d-1", SECRET)])
        await wait_for_audit(env, 1)
    finally:
        env.stop_all()
        os.environ[variable] = SECRET
    metrics = free_port()
    try:
        env.start_worker("fixed", "--metrics-port", str(metrics))
        console, base = start_console(
            env.bootstrap, env.topology_path, tmp_path / "console.log", "--workers", f"127.0.0.1:{metrics}"
        )
    finally:
        del os.environ[variable]
    try:
        browser.get(f"{base}/keys/github%3Ad-1")
        assert _text(browser, "status").startswith(
            "Not processed: 1 deliveries, none accepted (1 invalid: bad-signature)"
        )
        browser.get(f"{base}/dlq?reason=bad-signature")
        assert _text(browser, "total").startswith("1 record")
        assert "bad-signature" in _text(browser, "by-reason")
        assert "github" in _text(browser, "by-source")
        screenshot(browser, "dlq")
        browser.find_element(By.CSS_SELECTOR, "#records input.pick").click()
        browser.find_element(By.ID, "redrive-selected").click()
        _wait(browser, lambda d: d.find_elements(By.ID, "confirm"))
        assert "bad-signature" in _text(browser, "confirm-reasons")
        browser.find_element(By.ID, "confirm").click()
        _wait(browser, lambda d: "/redrives/" in d.current_url)
        row = "#redriven tbody tr"
        _wait(
            browser,
            lambda d: d.find_element(By.CSS_SELECTOR, row).get_attribute("data-outcome") != "waiting",
            60,
        )
        assert browser.find_element(By.CSS_SELECTOR, row).get_attribute("data-outcome") == "first"
        screenshot(browser, "redrive")
        await asyncio.sleep(1.0)  # a second command, if any, would be committed by now
        commands = command_counts(await read_committed(env.bootstrap, env.topo.topics.commands, idle=1.0))
        assert commands == Counter({"github:d-1": 1})

        browser.get(f"{base}/keys/github%3Ad-1")
        assert _text(browser, "status").startswith("Processed")
        labels = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#deliveries tbody tr")]
        assert "invalid (bad-signature)" in labels[0]
        assert "first, replayed from" in labels[1]
    finally:
        assert stop(console) == 0
    log = (tmp_path / "console.log").read_text()
    assert re.search(r"redrive \S+ by local \(redrive\) from 127\.0\.0\.1: replayed 1 ", log), log


async def test_a_body_holding_a_script_renders_as_text_and_never_runs(
    pipeline_env: MakeEnv, browser: WebDriver, tmp_path: Any
) -> None:
    """A DLQ body, key and headers holding markup show as text, no script runs, and secrets show as [redacted]."""
    variable = f"CONSOLE_XSS_{os.getpid()}_{time.monotonic_ns()}"
    env: Env = await pipeline_env(
        secrets={"github": variable}
    )  # verified at the ingress: the worker needs no secret
    evil = "<script>window.pwned=1;document.title='pwned'</script><img src=x onerror=window.pwned=2>"
    body = orjson.dumps({"id": "evt_x", "note": evil})
    headers = [("source", b"nosuch"), ("http-x-note", evil.encode())]
    headers += [("http-authorization", b"Bearer abc"), ("http-x-debug", f"secret={SECRET}".encode())]
    key = f"nosuch:{evil}"
    env.start_worker("w")
    await env.produce([(key.encode(), body, headers, None, None)])
    await wait_for_audit(env, 1)
    console, base = start_console(
        env.bootstrap, env.topology_path, tmp_path / "console.log", "--workers", "", env={variable: SECRET}
    )
    try:
        browser.get(f"{base}/dlq")
        browser.find_element(By.CSS_SELECTOR, "#records tbody tr td:nth-child(2) a").click()
        _wait(browser, lambda d: d.find_elements(By.ID, "body"))
        screenshot(browser, "dlq-record")
        assert evil in _text(browser, "body")
        assert evil in _text(browser, "headers")
        assert browser.execute_script("return window.pwned") is None
        assert "pwned" not in browser.title
        headers_text = _text(browser, "headers")
        assert "http-authorization [redacted]" in headers_text
        assert "secret=[redacted]" in headers_text
        assert SECRET not in browser.page_source
        browser.find_element(By.ID, "as-hex").click()
        assert "3c 73 63 72 69 70 74 3e" in _text(browser, "body-hex")  # "<script>" as bytes
        browser.get(f"{base}/dlq")
        browser.find_element(By.CSS_SELECTOR, "#records tbody tr td:nth-child(7) a").click()
        assert _text(browser, "key") == key
        assert browser.execute_script("return window.pwned") is None
    finally:
        assert stop(console) == 0


async def test_off_loopback_the_console_needs_a_token_and_each_role_gets_only_its_rights(
    pipeline_env: MakeEnv, browser: WebDriver, tmp_path: Any
) -> None:
    """On 0.0.0.0 it refuses to start without tokens; a request without one is 401; read-only cannot redrive; forms need CSRF."""
    env: Env = await pipeline_env()
    argv = [sys.executable, "-m", "pipeline", "console", "--bootstrap", env.bootstrap]
    argv += ["--topology", str(env.topology_path), "--host", "0.0.0.0", "--port", str(free_port())]
    refused = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "PIPELINE_CONSOLE_TOKENS"},
    )
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "PIPELINE_CONSOLE_TOKENS" in refused.stderr

    reader, operator = "reader-token-0123456789", "operator-token-0123456789"
    tokens = f"ann:read:{reader},bob:redrive:{operator}"
    console, base = start_console(
        env.bootstrap,
        env.topology_path,
        tmp_path / "console.log",
        "--workers",
        "",
        host="0.0.0.0",
        env={"PIPELINE_CONSOLE_TOKENS": tokens},
    )
    try:
        with pytest.raises(urllib.error.HTTPError) as refused_page:
            urllib.request.urlopen(f"{base}/dlq", timeout=10)
        assert refused_page.value.code == 401
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:  # an IP host
            async with session.get(f"{base}/dlq", headers={"Authorization": f"Bearer {reader}"}) as answer:
                assert answer.status == 200
            async with session.get(
                f"{base}/dlq", headers={"Authorization": "Bearer wrong-token-0123456789"}
            ) as answer:
                assert answer.status == 401
            form = {"record": "0:0"}
            async with session.post(
                f"{base}/dlq/redrive", data=form, headers={"Authorization": f"Bearer {reader}"}
            ) as answer:
                assert answer.status == 403
            own = {"Origin": base}
            async with session.post(
                f"{base}/login", data={"token": operator}, headers=own, allow_redirects=False
            ) as answer:
                assert answer.status == 303
            async with session.post(
                f"{base}/dlq/redrive", data=form, headers=own
            ) as answer:  # a cookie, but no CSRF token
                assert answer.status == 403
                assert "CSRF" in await answer.text()

        browser.delete_all_cookies()
        browser.get(f"{base}/dlq")
        assert browser.find_elements(By.ID, "token")  # the login form, answered with 401
        screenshot(browser, "login")
        browser.find_element(By.ID, "token").send_keys(reader)
        browser.find_element(By.ID, "login").click()
        _wait(browser, lambda d: d.find_elements(By.ID, "total"))
        assert browser.current_url == f"{base}/dlq"
        assert _text(browser, "user") == "ann (read)"
        assert not browser.find_elements(By.ID, "redrive-all")
    finally:
        browser.delete_all_cookies()
        assert stop(console) == 0


async def test_the_key_page_shows_the_first_body_a_conflicting_one_and_the_command(
    pipeline_env: MakeEnv, browser: WebDriver, tmp_path: Any
) -> None:
    """The first delivery's body, a later copy whose body differs (a conflict) and the command's value
    are on the key page, each from Kafka, escaped and with their secrets redacted."""
    env: Env = await pipeline_env(partitions=2)
    env.start_worker("w")
    shaped = "sk_live_51Hconsoletest0123456789"
    first = orjson.dumps({"id": "evt_b1", "type": "invoice.paid", "api_key": shaped, "note": "<b>first</b>"})
    second = orjson.dumps({"id": "evt_b1", "type": "invoice.paid", "note": "second"})
    now = int(time.time() * 1000)
    await env.produce([(b"stripe:evt_b1", first, [("source", b"stripe")], None, now)])
    await env.produce([(b"stripe:evt_b1", second, [("source", b"stripe")], None, now + 1000)])
    await wait_for_audit(env, 2)
    console, base = start_console(env.bootstrap, env.topology_path, tmp_path / "console.log", "--workers", "")
    try:
        browser.get(f"{base}/keys/stripe%3Aevt_b1")
        _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "section.body"))
        sections = browser.find_elements(By.CSS_SELECTOR, "section.body")
        titles = [s.find_element(By.TAG_NAME, "h3").text.split(" ")[0:2] for s in sections]
        assert titles == [["First", "delivery"], ["Conflicting", "delivery"], ["Command", "(handle)"]]
        first_text, conflict_text, command_text = (
            s.find_element(By.CSS_SELECTOR, "pre").text for s in sections
        )
        assert '"note":"<b>first</b>"' in first_text
        assert '"api_key":"[redacted]"' in first_text
        assert '"note":"second"' in conflict_text
        assert '"key": "stripe:evt_b1"' in command_text
        assert shaped not in browser.page_source
        screenshot(browser, "key-bodies")
    finally:
        assert stop(console) == 0

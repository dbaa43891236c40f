"""The console against what an attacker can do from a browser or a webhook, in Chromium and over HTTP,
with the real broker: a rebound DNS name, a form from another site, a login redirect, secrets in a
body with and without the secret loaded, hidden characters in a key, and URLs that name nothing."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from pipeline.contract import Delivery
from pipeline.dead_letter import dlq_value
from tests.integration.browser import chromium, screenshot, start_console, stop, wait_until
from tests.integration.harness import Env

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]
READER, OPERATOR = "reader-token-0123456789", "operator-token-0123456789"
TOKENS = f"ann:read:{READER},bob:redrive:{OPERATOR}"
REBOUND = "rebind.attacker.example"


def _wait(driver: WebDriver, check: Callable[[WebDriver], Any], timeout: float = 30.0) -> Any:
    return wait_until(driver, check, timeout)


def _status(url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture(scope="module")
def rebinding_browser() -> Iterator[object]:
    """Chromium on a machine where the attacker's name resolves to 127.0.0.1 (a DNS rebinding)."""
    yield from chromium(resolve={REBOUND: "127.0.0.1"})


@pytest.fixture
def attacker(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """Another site (``http://localhost:PORT``, served from this test): ``attacker(html)`` gives the URL of a page."""
    root = tmp_path / "attacker"
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    pages = iter(range(1000))

    def page(html: str) -> str:
        name = f"p{next(pages)}.html"
        (root / name).write_text(html, encoding="utf-8")
        return f"http://localhost:{server.server_address[1]}/{name}"

    try:
        yield page
    finally:
        server.shutdown()
        server.server_close()


def _with_tokens(env: Env, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A console on every address, with a read and a redrive token."""
    return start_console(
        env.bootstrap,
        env.topology_path,
        log,
        "--workers",
        "",
        host="0.0.0.0",
        env={"PIPELINE_CONSOLE_TOKENS": TOKENS},
    )


async def _to_dlq(env: Env, records: list[tuple[bytes, bytes, list[tuple[str, bytes]], int]]) -> None:
    """DLQ records as the worker writes them (reason unknown-source), produced straight to the DLQ."""
    topics = env.topo.topics
    producer = AIOKafkaProducer(bootstrap_servers=env.bootstrap, linger_ms=20, acks="all")
    await producer.start()
    try:
        futures = []
        for offset, (key, body, headers, timestamp) in enumerate(records):
            delivery = Delivery(topics.input, offset % 4, offset, timestamp, key, body, tuple(headers))
            value = dlq_value(
                delivery, error="source 'nosuch' is not in the topology", reason="unknown-source"
            )
            futures.append(
                await producer.send(topics.dlq, value, key=key, partition=offset % 4, timestamp_ms=timestamp)
            )
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def test_a_page_on_a_rebound_dns_name_reaches_nothing(
    pipeline_env: MakeEnv, rebinding_browser: WebDriver, tmp_path: Any
) -> None:
    """A browser that resolves the attacker's name to 127.0.0.1 gets 421 from the console (no page, no
    cookie, no redrive); by its own names (127.0.0.1, localhost) the console answers; /healthz answers any name."""
    env: Env = await pipeline_env()
    console, base = start_console(env.bootstrap, env.topology_path, tmp_path / "console.log", "--workers", "")
    port = base.rsplit(":", 1)[1]
    try:
        rebinding_browser.get(f"http://{REBOUND}:{port}/dlq")
        body = rebinding_browser.find_element(By.TAG_NAME, "body").text
        assert body.startswith("421: this console answers only to")
        assert not rebinding_browser.get_cookies()
        screenshot(rebinding_browser, "rebinding")
        rebinding_browser.get(f"http://localhost:{port}/dlq")
        _wait(rebinding_browser, lambda d: d.find_elements(By.ID, "filter"))
        forged = {"Host": f"{REBOUND}:{port}", "Origin": f"http://{REBOUND}:{port}"}
        assert _status(f"{base}/dlq/redrive/confirm", data=b"all=1", headers=forged)[0] == 421
        assert _status(f"{base}/dlq", headers={"Host": REBOUND})[0] == 421
        assert _status(f"{base}/healthz", headers={"Host": REBOUND}) == (200, "ok")
    finally:
        assert stop(console) == 0
    public = start_console(
        env.bootstrap,
        env.topology_path,
        tmp_path / "public.log",
        "--workers",
        "",
        "--public-url",
        f"http://{REBOUND}:{port}",
    )
    try:  # named by --public-url, the name is the console's own
        assert _status(f"{public[1]}/dlq", headers={"Host": REBOUND})[0] == 200
    finally:
        assert stop(public[0]) == 0


async def test_a_form_another_site_posts_is_refused(
    pipeline_env: MakeEnv, browser: WebDriver, tmp_path: Any, attacker: Callable[[str], str]
) -> None:
    """A page of another site that posts the console's login (to log the victim in as the attacker) or
    a redrive gets 403 by its ``Origin``, though the console is on the same machine."""
    env: Env = await pipeline_env()
    console, base = _with_tokens(env, tmp_path / "console.log")
    local, local_base = start_console(
        env.bootstrap, env.topology_path, tmp_path / "local.log", "--workers", ""
    )
    try:
        browser.delete_all_cookies()

        def posted(action: str, fields: dict[str, str]) -> str:
            """What the browser shows after the attacker's page posted ``fields`` to ``action``."""
            inputs = "".join(f'<input name="{k}" value="{v}">' for k, v in fields.items())
            form = f'<form method="post" action="{action}">{inputs}</form>'
            browser.get(attacker(form + "<script>document.forms[0].submit()</script>"))
            _wait(browser, lambda d: d.current_url.startswith(action.split("/", 3)[2].join(("http://", ""))))
            return str(browser.find_element(By.TAG_NAME, "body").text)

        assert posted(f"{base}/login", {"token": READER, "next": "/dlq"}) == "403: a form from another site"
        browser.get(f"{base}/dlq")
        assert browser.find_elements(By.ID, "token")  # not logged in
        browser.get(f"{local_base}/dlq")  # the victim has the loopback console open: a session cookie
        _wait(browser, lambda d: d.find_elements(By.ID, "filter"))
        fields = {"all": "1", "csrf": "guessed"}
        assert posted(f"{local_base}/dlq/redrive", fields) == "403: a form from another site"
    finally:
        browser.delete_all_cookies()
        assert stop(console) == 0
        assert stop(local) == 0


async def test_login_goes_only_to_a_page_of_the_console_and_wrong_tokens_are_limited(
    pipeline_env: MakeEnv, browser: WebDriver, tmp_path: Any
) -> None:
    """``next=/%09/evil.example`` (which a browser reads as //evil.example) lands on the console's start page;
    the eleventh wrong token from one address in five minutes is a 429, even with a right token."""
    env: Env = await pipeline_env()
    console, base = _with_tokens(env, tmp_path / "console.log")
    try:
        browser.delete_all_cookies()
        browser.get(f"{base}/login?next=%2F%09%2Fevil.example%2Fx")
        browser.find_element(By.ID, "token").send_keys(READER)
        browser.find_element(By.ID, "login").click()
        # the login page's own address names evil.example (in ``next``): wait until the browser has left it
        _wait(browser, lambda d: not d.current_url.startswith(f"{base}/login"))
        assert browser.current_url == f"{base}/"
        origin = {"Origin": base, "Content-Type": "application/x-www-form-urlencoded"}
        for _ in range(10):
            assert _status(f"{base}/login", data=b"token=wrong-token-0123456789", headers=origin)[0] == 401
        status, text = _status(f"{base}/login", data=f"token={READER}".encode(), headers=origin)
        assert status == 429
        assert "too many wrong tokens" in text
        assert _status(f"{base}/dlq", headers={"Authorization": f"Bearer {OPERATOR}"})[0] == 429
    finally:
        browser.delete_all_cookies()
        assert stop(console) == 0


NEW_SECRET = "gh-rotated-secret-0123456789"
SHAPED = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.mark.parametrize("loaded", ["no secret", "last month's secret"])
async def test_a_secret_in_a_body_stays_hidden_with_or_without_the_secret_loaded(
    pipeline_env: MakeEnv, browser: WebDriver, tmp_path: Any, loaded: str
) -> None:
    """A DLQ body and headers holding a signing secret (by field name, in a name=value pair, by its shape,
    in a signature header) show ``[redacted]`` on every page and view, and a search for it finds nothing,
    whether the console has no secret or only the one before a rotation."""
    variable = f"CONSOLE_ROTATED_{time.monotonic_ns()}"
    env: Env = await pipeline_env(secrets={"github": variable})
    body = orjson.dumps({"id": "evt_s", "config": {"webhook_secret": NEW_SECRET}, "note": f"key={SHAPED}"})
    headers = [("source", b"nosuch"), ("http-x-hub-signature-256", b"sha256=" + b"ab" * 32)]
    headers.append(("http-x-debug", f"secret={NEW_SECRET}".encode()))
    await _to_dlq(env, [(b"nosuch:evt_s", body, headers, int(time.time() * 1000))])
    environ = {variable: "gh-old-secret-0123456789"} if loaded != "no secret" else {}
    console, base = start_console(
        env.bootstrap, env.topology_path, tmp_path / "console.log", "--workers", "", env=environ
    )
    try:
        pages = [
            f"{base}/dlq",
            f"{base}/dlq/0/0",
            f"{base}/dlq/0/0?view=hex",
            f"{base}/keys/nosuch%3Aevt_s",
        ]
        for url in pages:
            browser.get(url)
            source = browser.page_source
            for secret in (NEW_SECRET, SHAPED, "ab" * 32):
                assert secret not in source, (url, secret)
        browser.get(f"{base}/dlq/0/0")
        assert "[redacted]" in browser.find_element(By.ID, "body").text
        assert "http-x-hub-signature-256 [redacted]" in browser.find_element(By.ID, "headers").text
        for guess in (NEW_SECRET, NEW_SECRET[:12], SHAPED):  # the search box is no oracle for a secret
            browser.get(f"{base}/dlq?text={guess}")
            assert browser.find_element(By.ID, "counted").text == "0"
        browser.get(f"{base}/dlq?text=evt_s")
        assert browser.find_element(By.ID, "counted").text == "1"
    finally:
        assert stop(console) == 0


async def test_hidden_characters_in_a_key_and_a_body_are_shown_escaped(
    pipeline_env: MakeEnv, browser: WebDriver, tmp_path: Any
) -> None:
    """A key holding a right-to-left override and a zero-width space reads as written, with the characters
    as escapes, in the list, on its record page and on its key page; the body's too."""
    env: Env = await pipeline_env()
    key = "nosuch:invoice\u202egnp.exe\u200b"
    body = orjson.dumps({"id": "x", "file": "report\u202efdp.exe"})
    await _to_dlq(env, [(key.encode(), body, [("source", b"nosuch")], int(time.time() * 1000))])
    console, base = start_console(env.bootstrap, env.topology_path, tmp_path / "console.log", "--workers", "")
    try:
        browser.get(f"{base}/dlq")
        cell = browser.find_element(By.CSS_SELECTOR, "#records tbody tr td:nth-child(7)").text
        assert cell == "nosuch:invoice\\u202egnp.exe\\u200b"
        screenshot(browser, "bidi")
        browser.get(f"{base}/dlq/0/0")
        assert "report\\u202efdp.exe" in browser.find_element(By.ID, "body").text
        browser.find_element(By.CSS_SELECTOR, "p a[href^='/keys/']").click()
        _wait(browser, lambda d: d.find_elements(By.ID, "key"))
        assert browser.find_element(By.ID, "key").text == "nosuch:invoice\\u202egnp.exe\\u200b"
        assert "\u202e" not in browser.page_source
        assert "\u200b" not in browser.page_source
    finally:
        assert stop(console) == 0


async def test_a_record_that_is_not_there_is_a_fast_404(pipeline_env: MakeEnv, tmp_path: Any) -> None:
    """A partition the DLQ does not have, an offset past its end or below zero: 404 within a second."""
    env: Env = await pipeline_env(partitions=4)
    console, base = start_console(env.bootstrap, env.topology_path, tmp_path / "console.log", "--workers", "")
    try:
        for path in ["/dlq/6/0", "/dlq/0/999999", "/dlq/0/-5", "/dlq/99999999999/1"]:
            started = time.monotonic()
            status, text = _status(f"{base}{path}")
            assert (status, "no record at" in text) == (404, True), (path, text)
            assert time.monotonic() - started < 2.0, path
    finally:
        assert stop(console) == 0


async def test_paging_reaches_the_oldest_of_ten_thousand_records(
    pipeline_env: MakeEnv, browser: WebDriver, tmp_path: Any
) -> None:
    """10,000 DLQ records: every one is counted, and "oldest" shows the last page, ending at the oldest."""
    env: Env = await pipeline_env(partitions=4)
    start = int(time.time() * 1000) - 10_000_000
    records = [
        (
            f"nosuch:evt_{i}".encode(),
            orjson.dumps({"id": f"evt_{i}"}),
            [("source", b"nosuch")],
            start + i * 1000,
        )
        for i in range(10_000)
    ]
    await _to_dlq(env, records)
    console, base = start_console(env.bootstrap, env.topology_path, tmp_path / "console.log", "--workers", "")
    try:
        began = time.monotonic()
        browser.get(f"{base}/dlq")
        first_load = time.monotonic() - began
        assert browser.find_element(By.ID, "counted").text == "10000"
        assert browser.find_element(By.ID, "page-count").text == "100"
        browser.find_element(By.ID, "oldest").click()
        _wait(browser, lambda d: d.find_element(By.ID, "page").text == "100")
        keys = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#records tbody tr td:nth-child(7) a")]
        assert keys[-1] == "nosuch:evt_0"
        assert keys == [f"nosuch:evt_{i}" for i in range(99, -1, -1)]
        browser.find_element(By.ID, "prev").click()
        _wait(browser, lambda d: d.find_element(By.ID, "page").text == "99")
        print(f"DLQ page of 10,000 records drawn in {first_load:.2f} s")
    finally:
        assert stop(console) == 0

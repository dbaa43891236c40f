"""Who gets in: tokens, sessions, roles and CSRF, on a small app behind the console's own middleware."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from pipeline.console.auth import CSP, Sessions, build_middleware, require_redrive, safe_next
from pipeline.console.settings import ConsoleSettings, parse_tokens
from pipeline.console.throttle import Throttle

READER, OPERATOR = "reader-token-0123456789", "operator-token-0123456789"


def _app(settings: ConsoleSettings, throttle: Throttle | None = None) -> web.Application:
    sessions = Sessions(settings, throttle)

    async def page(request: web.Request) -> web.Response:
        session = sessions.required(request)
        return web.Response(text=f"user={session.user.name} csrf={session.csrf}")

    async def redrive(request: web.Request) -> web.Response:
        return web.Response(text=f"redriven by {require_redrive(sessions.required(request)).name}")

    async def login(request: web.Request) -> web.Response:
        form = await request.post()
        user = sessions.authenticate(str(form.get("token", "")))
        if user is None:
            return web.Response(status=401)
        sid, _ = sessions.open(user)
        response = web.Response(status=303, headers={"Location": "/"})
        response.set_cookie("pipeline_console", sid, httponly=True, samesite="Strict")
        return response

    def unauthorised(_request: web.Request) -> web.Response:
        return web.Response(status=401, text="log in")

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(middlewares=[build_middleware(sessions, unauthorised)])
    app.router.add_get("/", page)
    app.router.add_get("/healthz", healthz)
    app.router.add_post("/redrive", redrive)
    app.router.add_post("/login", login)
    return app


Client = TestClient[web.Request, web.Application]
USERS = parse_tokens(f"ann:read:{READER},bob:redrive:{OPERATOR}")


@pytest.fixture
async def guarded() -> AsyncIterator[Client]:
    """The app with two users (off loopback, so tokens are required)."""
    settings = ConsoleSettings(bootstrap="b:1", topology=Path("t.toml"), host="0.0.0.0", users=USERS)
    async with TestClient(TestServer(_app(settings)), cookie_jar=aiohttp.CookieJar(unsafe=True)) as client:
        yield client


def _own(client: Client) -> dict[str, str]:
    """The ``Origin`` a browser sends with a form of the console's own pages."""
    return {"Origin": str(client.make_url("")).rstrip("/")}


async def test_without_a_token_every_page_is_401_and_every_answer_carries_the_security_headers(
    guarded: Client,
) -> None:
    """No cookie and no bearer: 401; a wrong bearer: 401; the answers forbid framing and inline scripts."""
    answer = await guarded.get("/")
    assert answer.status == 401
    assert answer.headers["Content-Security-Policy"] == CSP
    assert "script-src 'self'" in CSP
    assert answer.headers["X-Frame-Options"] == "DENY"
    assert (await guarded.get("/", headers={"Authorization": "Bearer nope-nope-nope-nope"})).status == 401
    assert (await guarded.get("/", headers={"Authorization": f"Bearer {READER}"})).status == 200


async def test_a_read_only_user_cannot_redrive_and_a_redrive_user_can(guarded: Client) -> None:
    """The role decides: 403 for read, 200 for redrive (bearer requests need no CSRF token)."""
    assert (await guarded.post("/redrive", headers={"Authorization": f"Bearer {READER}"})).status == 403
    answer = await guarded.post("/redrive", headers={"Authorization": f"Bearer {OPERATOR}"})
    assert answer.status == 200
    assert await answer.text() == "redriven by bob"


async def test_a_cookie_session_posts_only_with_its_csrf_token_from_its_own_origin(guarded: Client) -> None:
    """A login from another site is 403; after login, a POST without the CSRF token, with another's, or from another site is 403; with it, 200."""
    own = _own(guarded)
    foreign = {"Origin": "http://evil.example"}
    assert (await guarded.post("/login", data={"token": OPERATOR}, headers=foreign)).status == 403
    login = await guarded.post("/login", data={"token": OPERATOR}, headers=own, allow_redirects=False)
    assert login.status == 303
    text = await (await guarded.get("/")).text()
    found = re.search(r"csrf=(\S+)", text)
    assert found is not None
    csrf = found[1]
    assert (await guarded.post("/redrive", data={}, headers=own)).status == 403
    assert (await guarded.post("/redrive", data={"csrf": csrf + "x"}, headers=own)).status == 403
    assert (await guarded.post("/redrive", data={"csrf": csrf}, headers=foreign)).status == 403
    assert (await guarded.post("/redrive", data={"csrf": csrf}, headers={"Origin": "null"})).status == 403
    assert (await guarded.post("/redrive", data={"csrf": csrf}, headers=own)).status == 200


async def test_every_state_changing_request_is_checked_for_its_origin(guarded: Client) -> None:
    """A cookie session's POST with neither ``Origin`` nor ``Referer`` is 403 (a browser always sends one);
    a bearer POST from another site's page is 403; a same-origin ``Referer`` stands in for ``Origin``."""
    own = _own(guarded)
    assert (await guarded.post("/login", data={"token": OPERATOR}, allow_redirects=False)).status == 403
    await guarded.post("/login", data={"token": OPERATOR}, headers=own, allow_redirects=False)
    found = re.search(r"csrf=(\S+)", await (await guarded.get("/")).text())
    assert found is not None
    assert (await guarded.post("/redrive", data={"csrf": found[1]})).status == 403
    referer = {"Referer": own["Origin"] + "/dlq?reason=x"}
    assert (await guarded.post("/redrive", data={"csrf": found[1]}, headers=referer)).status == 200
    bearer = {"Authorization": f"Bearer {OPERATOR}"}
    guarded.session.cookie_jar.clear()
    assert (await guarded.post("/redrive", headers={**bearer, "Origin": "http://evil.example"})).status == 403
    assert (await guarded.post("/redrive", headers=bearer)).status == 200  # a script sends no Origin


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("rebind.attacker.example", 421),
        ("rebind.attacker.example:8090", 421),
        ("localhost.attacker.example", 421),
        ("127.0.0.1.nip.io", 421),
        ("", 421),
        ("localhost:8090", 200),
        ("LOCALHOST.", 200),
        ("127.0.0.1:8090", 200),
        ("127.0.0.2", 200),
        ("[::1]:8090", 200),
        ("console.example.com", 200),
    ],
)
async def test_only_the_consoles_own_host_names_are_served(host: str, status: int) -> None:
    """A request naming another host (a DNS name rebound to 127.0.0.1) is 421 on every path but the health
    check, before any session is made: loopback names and the public URL's host are served."""
    settings = ConsoleSettings(
        bootstrap="b:1", topology=Path("t.toml"), public_url="https://console.example.com"
    )
    async with TestClient(TestServer(_app(settings))) as client:
        answer = await client.get("/", headers={"Host": host})
        assert answer.status == status
        if status == 421:
            assert "Set-Cookie" not in answer.headers
            assert (await client.post("/login", data={"token": "x"}, headers={"Host": host})).status == 421
        assert (await client.get("/healthz", headers={"Host": host})).status == 200


async def test_wrong_tokens_are_rate_limited_per_client() -> None:
    """After the limit of wrong tokens from one address, even the right token is 429 with Retry-After,
    until the window has passed; a right token before the limit starts the count again."""
    now = [1000.0]
    throttle = Throttle(limit=3, window=60.0, clock=lambda: now[0])
    settings = ConsoleSettings(bootstrap="b:1", topology=Path("t.toml"), host="0.0.0.0", users=USERS)
    async with TestClient(TestServer(_app(settings, throttle))) as client:
        wrong = {"Authorization": "Bearer wrong-token-0123456789"}
        right = {"Authorization": f"Bearer {READER}"}
        for _ in range(3):
            assert (await client.get("/", headers=wrong)).status == 401
        refused = await client.get("/", headers=right)
        assert refused.status == 429
        assert refused.headers["Retry-After"] == "61"
        now[0] += 61
        assert (await client.get("/", headers=right)).status == 200
        for _ in range(2):
            assert (await client.get("/", headers=wrong)).status == 401
        assert (await client.get("/", headers=right)).status == 200
        assert (await client.get("/", headers=wrong)).status == 401  # counted from zero again


def test_the_throttle_forgets_old_failures_and_old_clients() -> None:
    """Failures older than the window do not count; beyond ``max_clients`` the least recent client goes."""
    now = [0.0]
    throttle = Throttle(limit=2, window=10.0, clock=lambda: now[0], max_clients=2)
    throttle.failed("a")
    now[0] = 5.0
    throttle.failed("a")
    assert throttle.wait("a") == 5.0
    now[0] = 10.5
    assert throttle.wait("a") == 0.0
    throttle.failed("b")
    throttle.failed("c")
    throttle.failed("d")
    assert set(throttle._failures) == {"c", "d"}


async def test_on_loopback_without_tokens_each_visitor_is_the_local_user() -> None:
    """No tokens on 127.0.0.1: a session of 'local' (redrive) is made on the first visit and kept by cookie."""
    settings = ConsoleSettings(bootstrap="b:1", topology=Path("t.toml"))
    async with TestClient(TestServer(_app(settings)), cookie_jar=aiohttp.CookieJar(unsafe=True)) as client:
        first = await client.get("/")
        assert first.status == 200
        assert "user=local" in await first.text()
        assert "HttpOnly" in first.headers["Set-Cookie"]
        assert "SameSite=Strict" in first.headers["Set-Cookie"]
        second = await client.get("/")
        assert "Set-Cookie" not in second.headers


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/dlq?reason=x", "/dlq?reason=x"),
        ("//evil.example/", "/"),
        ("https://evil.example", "/"),
        (None, "/"),
        ("/\\evil", "/"),
        ("/\t/evil.example/x", "/"),
        ("/\n/evil.example", "/"),
        ("/dlq\r\nSet-Cookie: x=1", "/"),
        ("/%09/evil.example", "/%09/evil.example"),
        ("/ /evil.example", "/"),
        ("/dlq?key=caf\u00e9", "/"),
        ("http:/evil.example", "/"),
    ],
)
def test_a_login_redirect_stays_inside_the_console(target: str | None, expected: str) -> None:
    """Only a local path is followed after login; anything else goes to the start page."""
    assert safe_next(target) == expected

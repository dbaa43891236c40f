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

READER, OPERATOR = "reader-token-0123456789", "operator-token-0123456789"


def _app(settings: ConsoleSettings) -> web.Application:
    sessions = Sessions(settings)

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

    app = web.Application(middlewares=[build_middleware(sessions, unauthorised)])
    app.router.add_get("/", page)
    app.router.add_post("/redrive", redrive)
    app.router.add_post("/login", login)
    return app


@pytest.fixture
async def guarded() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """The app with two users (off loopback, so tokens are required)."""
    users = parse_tokens(f"ann:read:{READER},bob:redrive:{OPERATOR}")
    settings = ConsoleSettings(bootstrap="b:1", topology=Path("t.toml"), host="0.0.0.0", users=users)
    async with TestClient(TestServer(_app(settings)), cookie_jar=aiohttp.CookieJar(unsafe=True)) as client:
        yield client


async def test_without_a_token_every_page_is_401_and_every_answer_carries_the_security_headers(
    guarded: TestClient[web.Request, web.Application],
) -> None:
    """No cookie and no bearer: 401; a wrong bearer: 401; the answers forbid framing and inline scripts."""
    answer = await guarded.get("/")
    assert answer.status == 401
    assert answer.headers["Content-Security-Policy"] == CSP
    assert "script-src 'self'" in CSP
    assert answer.headers["X-Frame-Options"] == "DENY"
    assert (await guarded.get("/", headers={"Authorization": "Bearer nope-nope-nope-nope"})).status == 401
    assert (await guarded.get("/", headers={"Authorization": f"Bearer {READER}"})).status == 200


async def test_a_read_only_user_cannot_redrive_and_a_redrive_user_can(
    guarded: TestClient[web.Request, web.Application],
) -> None:
    """The role decides: 403 for read, 200 for redrive (bearer requests need no CSRF token)."""
    assert (await guarded.post("/redrive", headers={"Authorization": f"Bearer {READER}"})).status == 403
    answer = await guarded.post("/redrive", headers={"Authorization": f"Bearer {OPERATOR}"})
    assert answer.status == 200
    assert await answer.text() == "redriven by bob"


async def test_a_cookie_session_posts_only_with_its_csrf_token_from_its_own_origin(
    guarded: TestClient[web.Request, web.Application],
) -> None:
    """A login from another site is 403; after login, a POST without the CSRF token, with another's, or from another site is 403; with it, 200."""
    foreign = {"Origin": "http://evil.example"}
    assert (await guarded.post("/login", data={"token": OPERATOR}, headers=foreign)).status == 403
    assert (await guarded.post("/login", data={"token": OPERATOR}, allow_redirects=False)).status == 303
    text = await (await guarded.get("/")).text()
    found = re.search(r"csrf=(\S+)", text)
    assert found is not None
    csrf = found[1]
    assert (await guarded.post("/redrive", data={})).status == 403
    assert (await guarded.post("/redrive", data={"csrf": csrf + "x"})).status == 403
    other = {"Origin": "http://evil.example"}
    assert (await guarded.post("/redrive", data={"csrf": csrf}, headers=other)).status == 403
    assert (await guarded.post("/redrive", data={"csrf": csrf}, headers={"Origin": "null"})).status == 403
    assert (await guarded.post("/redrive", data={"csrf": csrf})).status == 200


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
    ],
)
def test_a_login_redirect_stays_inside_the_console(target: str | None, expected: str) -> None:
    """Only a local path is followed after login; anything else goes to the start page."""
    assert safe_next(target) == expected

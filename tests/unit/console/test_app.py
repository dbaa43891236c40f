"""The console's pages with Kafka out of reach: bad input is a 400 or 404 with a reason, never a 500 or a trace."""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from pipeline import topology
from pipeline.console.app import Pages, build_app
from pipeline.console.redaction import Redactor
from pipeline.console.settings import ConsoleSettings
from pipeline.console.views import make_environment
from pipeline.console.workers import Live, WorkerView

ROOT = Path(__file__).resolve().parents[3]
TOPOLOGY = ROOT / "topologies" / "default.toml"
Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def console() -> AsyncIterator[Client]:
    """The whole console app on loopback without tokens, its Kafka unreachable."""
    settings = ConsoleSettings(bootstrap="127.0.0.1:1", topology=TOPOLOGY)
    pages = Pages(settings, topology.load(TOPOLOGY), Live((), every=1.0), Redactor())
    async with TestClient(TestServer(build_app(pages)), cookie_jar=aiohttp.CookieJar(unsafe=True)) as client:
        yield client


@pytest.mark.parametrize(
    ("query", "problem", "kept"),
    [
        ("reason=unknown&source=stripe", "reason: no DLQ record has reason", 'value="stripe"'),
        ("since=yesterday&key=github:*", "since: expected a duration", 'value="github:*"'),
        ("since=1h&until=2h&type=push", "starts after it ends", 'value="push"'),
        ("page=-1&text=cus_42", "page: expected a number", 'value="cus_42"'),
    ],
)
async def test_a_bad_filter_is_a_400_on_the_page_with_the_form_kept(
    console: Client, query: str, problem: str, kept: str
) -> None:
    """The DLQ page answers a filter it cannot read with 400, the reason above the form, and what was typed."""
    answer = await console.get(f"/dlq?{query}")
    assert answer.status == 400
    html = await answer.text()
    assert problem in html
    assert kept in html
    assert 'id="filter"' in html


@pytest.mark.parametrize(
    "path", ["/dlq/0/-5", "/dlq/x/1", "/dlq/0/1e3", "/dlq/99999999999/0", "/dlq/0/" + "9" * 30]
)
async def test_a_dlq_record_that_cannot_exist_is_a_404_at_once(console: Client, path: str) -> None:
    """A negative, non-numeric or absurd partition or offset is a 404 without asking Kafka."""
    answer = await console.get(path)
    assert answer.status == 404
    assert "no record at" in await answer.text()


HOSTILE = [
    "/keys/%00",
    "/keys/" + "k" * 20_000,
    "/keys/a%0Ab%E2%80%AE",
    "/find?q=%00%0A",
    "/dlq?reason=%00",
    "/dlq?page=99999999999999999999",
    "/dlq?upto=0:99999999999999999999999",
    "/dlq?since=9999-99-99",
    "/dlq?view=%ff",
    "/dlq/0/0?view=%00",
    "/redrives/..%2F..%2Fetc",
    "/redrives/%00",
    "/fragments/redrives/x",
    "/static/..%2Fapp.py",
    "/login?next=%0A",
    "/nope",
]


@pytest.mark.parametrize("path", HOSTILE)
async def test_no_url_a_user_can_type_is_a_500(console: Client, path: str) -> None:
    """Each answer is a 2xx to 4xx with a reason, or a 503 naming Kafka; never a 500 and never a trace."""
    answer = await console.get(path, allow_redirects=False)
    text = await answer.text()
    assert answer.status != 500, text
    assert answer.status < 500 or "Kafka" in text
    assert "Traceback" not in text


async def test_a_failure_the_console_did_not_foresee_is_a_500_page_without_a_trace(
    console: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in a handler answers a one-line page; the log has the trace, its path escaped."""

    async def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr("pipeline.console.app.inspect", broken)
    caplog.set_level(logging.ERROR, logger="pipeline.console")
    answer = await console.get("/keys/stripe:a%0Aforged")
    assert answer.status == 500
    text = await answer.text()
    assert "its log says why" in text
    assert "RuntimeError" not in text
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == "console: GET /keys/stripe:a\\nforged failed"


async def test_a_login_next_with_a_newline_or_a_tab_goes_home(console: Client) -> None:
    """``next`` that a browser would read as another host, or that cannot go into a header, is ``/``."""
    own = {"Origin": str(console.make_url("")).rstrip("/")}
    for target in ["/\t/evil.example/x", "/\n/evil.example", "//evil.example", "/ok?a=1"]:
        answer = await console.post(
            "/login", data={"token": "x", "next": target}, headers=own, allow_redirects=False
        )
        assert answer.status == 401  # no tokens configured: no token is right
        html = await answer.text()
        shown = re.search(r'name="next" value="([^"]*)"', html)
        assert shown is not None
        assert shown[1] == ("/ok?a=1" if target == "/ok?a=1" else "/")


def test_the_console_imports_nothing_of_the_operator_tools() -> None:
    """The console and ``pipeline/ops`` share the read model (``pipeline/records``), never each other."""
    for path in (ROOT / "pipeline" / "console").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("pipeline.ops"), f"{path.name} imports {node.module}"


def test_a_workers_warning_is_shown_escaped_beside_its_problems() -> None:
    """A worker's /readyz warning (a topic config it would refuse to start on) is in the workers table, as text:
    markup in it is escaped, not run."""
    view = WorkerView(
        "w:1", sampled=True, reachable=True, healthy=True, alive=True, warnings=["retention <b>lowered</b>"]
    )
    html = make_environment().get_template("_live.html").render(views=[view], rows=[], rates={}, every=2.0)
    assert "warning: retention &lt;b&gt;lowered&lt;/b&gt;" in html
    assert "<b>lowered</b>" not in html

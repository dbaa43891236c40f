"""The console's pages: find a key, partitions and workers, login; the DLQ's are in ``dlq_pages``.

Every handler reads Kafka or the workers when asked (nothing is kept but
sessions, and the redrive history read from its topic); bad input is a 400
page saying why, an unknown record a 404, Kafka out of reach a 503 page in
one line, and anything else a 500 page that shows no trace (the log has it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import jinja2
from aiohttp import web
from aiokafka.errors import KafkaError

from pipeline.console.auth import (
    Sessions,
    build_middleware,
    client_of,
    safe_next,
    set_cookie,
    too_many,
)
from pipeline.console.charts import sparkline
from pipeline.console.dlq_pages import DlqPages
from pipeline.console.history import History
from pipeline.console.key_bodies import bodies
from pipeline.console.partitions import Partitions
from pipeline.console.redaction import Redactor
from pipeline.console.redrive import Redrives
from pipeline.console.settings import ConsoleSettings
from pipeline.console.views import key_path, make_environment, render
from pipeline.console.workers import Live
from pipeline.errors import PipelineError
from pipeline.log_text import escape
from pipeline.records.key_report import Report
from pipeline.records.lookup import inspect
from pipeline.resources import package_dir
from pipeline.topology import Topology

log = logging.getLogger(__name__)
MAX_KEY = 16_384


class Pages:
    """The handlers, with what they share: settings, topology, templates, the sampler, redrives."""

    def __init__(self, settings: ConsoleSettings, topology: Topology, live: Live, redactor: Redactor) -> None:
        self.settings = settings
        self.topology = topology
        self.live = live
        self.redactor = redactor
        self.env: jinja2.Environment = make_environment()
        self.sessions = Sessions(settings)
        self.partitions = Partitions(settings.bootstrap, topology, settings.group)
        self.history = History(settings.bootstrap, topology)
        self.redrives = Redrives(settings.bootstrap, topology, self.history)
        self.dlq = DlqPages(
            settings,
            topology,
            page=self.page,
            sessions=self.sessions,
            redactor=redactor,
            history=self.history,
            redrives=self.redrives,
        )

    def page(self, request: web.Request, name: str, *, status: int = 200, **context: Any) -> web.Response:
        """Render a page with what every page shows (the topology's app and topics)."""
        session = self.sessions.of(request)
        return render(
            self.env, request, name, session=session, status=status, topology=self.topology, **context
        )

    def error(self, request: web.Request, status: int, message: str) -> web.Response:
        """A page that says, in one line, why the request failed."""
        return self.page(request, "error.html", status=status, message=message)

    # -- finding an event ---------------------------------------------------------------------

    async def home(self, request: web.Request) -> web.Response:
        return self.page(
            request, "home.html", sources=sorted(self.topology.sources), live=self.live.summary()
        )

    async def find(self, request: web.Request) -> web.StreamResponse:
        """``/find?q=``: a ``<source>:<id>`` goes to its key page; a bare id is looked up under every source."""
        text = request.query.get("q", "").strip()
        if not text:
            raise web.HTTPSeeOther("/")
        if len(text) > MAX_KEY:
            return self.error(request, 400, f"a key is at most {MAX_KEY} characters")
        source, sep, _ = text.partition(":")
        if sep and source in self.topology.sources:
            raise web.HTTPSeeOther(key_path(text))
        keys = [f"{name}:{text}" for name in sorted(self.topology.sources)]
        reports = await asyncio.gather(*(self._lookup(key) for key in keys))
        seen = [r for r in reports if r.status != "never seen"]
        if len(seen) == 1:
            raise web.HTTPSeeOther(key_path(seen[0].key))
        return self.page(request, "candidates.html", query=text, reports=reports)

    async def key(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        if not key or len(key) > MAX_KEY:
            return self.error(request, 400, f"a key has 1 to {MAX_KEY} characters")
        report = await self._lookup(key)
        shown = await bodies(report, self.topology, self.settings.bootstrap, self.redactor)
        return self.page(request, "key.html", report=report, bodies=shown)

    async def _lookup(self, key: str) -> Report:
        return await inspect(
            key, self.topology, bootstrap=self.settings.bootstrap, workers=self.settings.workers
        )

    # -- partitions and workers ---------------------------------------------------------------

    async def partitions_page(self, request: web.Request) -> web.Response:
        return self.page(request, "partitions.html", **await self._live())

    async def live_fragment(self, request: web.Request) -> web.Response:
        return self.page(request, "_live.html", **await self._live())

    async def _live(self) -> dict[str, Any]:
        views = self.live.views
        rows = await self.partitions.rows(views)
        rates = {name: sparkline(values) for name, values in self.live.rates().items()}
        return {"rows": rows, "views": views, "rates": rates, "every": self.settings.refresh_seconds}

    # -- login --------------------------------------------------------------------------------

    async def login_form(self, request: web.Request) -> web.Response:
        return self.page(
            request, "login.html", status=200, next=safe_next(request.query.get("next")), failed=False
        )

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        token, target = str(form.get("token", "")), safe_next(str(form.get("next", "/")))
        client = client_of(request)
        wait = self.sessions.throttle.wait(client)
        if wait:
            raise too_many(wait)
        user = self.sessions.authenticate(token) if token else None
        if user is None:
            self.sessions.throttle.failed(client)
            log.warning("console: a login from %s with a wrong token", escape(client))
            return self.page(request, "login.html", status=401, next=target, failed=True)
        self.sessions.throttle.succeeded(client)
        sid, _ = self.sessions.open(user)
        log.info("console: %s (%s) logged in from %s", escape(user.name), user.role, escape(client))
        response = see_other(target)
        set_cookie(response, sid)
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        self.sessions.close(request.cookies.get("pipeline_console"))
        response = see_other("/login")
        response.del_cookie("pipeline_console", path="/")
        return response

    def unauthorised(self, request: web.Request) -> web.Response:
        """401: the login form (for a page), or one line (for a script that sent a wrong token)."""
        if "Authorization" in request.headers or not request.headers.get("Accept", "").count("html"):
            return web.Response(
                status=401, text="401: this console needs a token", headers={"WWW-Authenticate": "Bearer"}
            )
        return self.page(request, "login.html", status=401, next=safe_next(request.path_qs), failed=False)

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")


def _failures(pages: Pages) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Kafka out of reach (or refusing) and other pipeline errors as a 503 page in one line; anything
    else (a bug) as a 500 page that shows no trace."""

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except PipelineError as exc:
            log.warning("console: %s %s failed: %s", request.method, escape(request.path), escape(exc, 500))
            return pages.error(request, 503, str(exc))
        except KafkaError as exc:  # one the lookup did not turn into a PipelineError
            log.warning(
                "console: %s %s failed: Kafka: %s", request.method, escape(request.path), escape(repr(exc))
            )
            return pages.error(request, 503, f"Kafka at {pages.settings.bootstrap}: {exc!r}")
        except web.HTTPException:
            raise
        except Exception:  # a bug: logged whole, answered in one line without a trace
            log.exception("console: %s %s failed", request.method, escape(request.path))
            return pages.error(request, 500, "the console failed on this request; its log says why")

    return middleware


def build_app(pages: Pages) -> web.Application:
    """The aiohttp application: security middleware first, then the pages."""
    app = web.Application(
        middlewares=[build_middleware(pages.sessions, pages.unauthorised), _failures(pages)]
    )
    add = app.router.add_get
    add("/", pages.home)
    add("/find", pages.find)
    add("/keys/{key}", pages.key)
    add("/dlq", pages.dlq.dlq)
    add("/dlq/{partition}/{offset}", pages.dlq.dlq_record)
    app.router.add_post("/dlq/redrive/confirm", pages.dlq.confirm)
    app.router.add_post("/dlq/redrive", pages.dlq.redrive)
    add("/redrives", pages.dlq.history_page)
    add("/redrives/{run}", pages.dlq.run_page)
    add("/fragments/redrives/{run}", pages.dlq.run_page)
    add("/partitions", pages.partitions_page)
    add("/fragments/live", pages.live_fragment)
    add("/login", pages.login_form)
    app.router.add_post("/login", pages.login)
    app.router.add_post("/logout", pages.logout)
    add("/healthz", pages.healthz)
    app.router.add_static("/static/", package_dir() / "console" / "static", show_index=False)
    return app


def see_other(location: str) -> web.Response:
    """A 303 to ``location`` that a handler returns (to set cookies on it)."""
    return web.Response(status=303, headers={"Location": location})

"""Who is asking: host names, tokens, sessions, roles, CSRF and the security headers of every answer.

Every request must name one of the console's host names (:mod:`pipeline.console.guard`;
421 otherwise), so a page on a rebound DNS name reaches nothing. A browser
logs in once with its token (``POST /login``) and gets a session cookie
(``HttpOnly``, ``SameSite=Strict``); a script may send ``Authorization:
Bearer <token>`` instead. Wrong tokens are rate-limited per client
(:mod:`pipeline.console.throttle`; 429). Every POST must come from the
console's own origin (``Origin``, else ``Referer``; a bearer request may send
neither), and a form must carry the session's CSRF token (a bearer request
needs none, as no other site can set that header). Without tokens, on
loopback, each visitor gets a session of the local user. Sessions live in
memory: a restarted console asks again.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from pipeline.console.guard import host_allowed, safe_next, same_origin
from pipeline.console.settings import LOCAL_USER, ConsoleSettings, Role, User
from pipeline.console.throttle import Throttle
from pipeline.log_text import escape

log = logging.getLogger(__name__)

COOKIE = "pipeline_console"
MAX_SESSIONS = 10_000
#: Paths open to anyone: the login form, the health check, the style sheet and script.
OPEN_PATHS = ("/login", "/healthz", "/static/")
#: Answered whatever the ``Host``: a probe may name the pod's address; it says only "ok".
ANY_HOST_PATHS = ("/healthz",)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # no-referrer would make a form's Origin "null"
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Session:
    """A logged-in visitor: the user, and the CSRF token its forms carry."""

    user: User
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)
    bearer: bool = False  # came with an Authorization header: no cookie, no CSRF needed


class Sessions:
    """The tokens this console accepts and the sessions it gave out (in memory, oldest dropped first)."""

    def __init__(self, settings: ConsoleSettings, throttle: Throttle | None = None) -> None:
        self.settings = settings
        self.users = settings.users
        self.open_locally = settings.open_locally
        self.allowed_hosts = settings.allowed_hosts
        self.throttle = throttle or Throttle()
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._active: dict[int, Session | None] = {}  # id(request) -> its session, while it is handled

    def of(self, request: web.Request) -> Session | None:
        """The session of a request being handled (None on the open paths without one)."""
        return self._active.get(id(request))

    def handling(self, request: web.Request, session: Session | None) -> None:
        """``request`` is being handled on behalf of ``session``."""
        self._active[id(request)] = session

    def handled(self, request: web.Request) -> None:
        """``request`` is answered: forget its session."""
        self._active.pop(id(request), None)

    def required(self, request: web.Request) -> Session:
        """The session of a request behind the login (401 if there is none)."""
        session = self.of(request)
        if session is None:
            raise web.HTTPUnauthorized(text="this console needs a token")
        return session

    def authenticate(self, token: str) -> User | None:
        """The user whose token this is (compared in constant time against every token)."""
        found = None
        for user in self.users:
            if hmac.compare_digest(user.token.encode(), token.encode()):
                found = user
        return found

    def open(self, user: User) -> tuple[str, Session]:
        """A new session for ``user``: its cookie value and the session."""
        sid = secrets.token_urlsafe(32)
        session = self._sessions[sid] = Session(user)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return sid, session

    def get(self, sid: str | None) -> Session | None:
        """The session of a cookie value, if it is one."""
        return self._sessions.get(sid) if sid else None

    def close(self, sid: str | None) -> None:
        """Forget a session (log out)."""
        if sid:
            self._sessions.pop(sid, None)


def set_cookie(response: web.StreamResponse, sid: str) -> None:
    """The session cookie: not readable by scripts, never sent by other sites."""
    response.set_cookie(COOKIE, sid, httponly=True, samesite="Strict", path="/")


def require_redrive(session: Session) -> User:
    """The session's user, if they may redrive; else 403."""
    user = session.user
    if not user.can_redrive:
        raise web.HTTPForbidden(text="redrive needs a token with the redrive role")
    return user


def client_of(request: web.Request) -> str:
    """The address a request came from, as the rate limit and the logs name it."""
    return request.remote or "unknown"


def too_many(wait: float) -> web.HTTPTooManyRequests:
    """429 for a client that sent too many wrong tokens, saying when to try again."""
    seconds = max(int(wait) + 1, 1)
    return web.HTTPTooManyRequests(
        text=f"429: too many wrong tokens from this address; try again in {seconds} s",
        headers={"Retry-After": str(seconds)},
    )


def from_here(request: web.Request, settings: ConsoleSettings, *, required: bool) -> bool:
    """Whether a POST comes from this console's pages (see :func:`pipeline.console.guard.same_origin`)."""
    origin = request.headers.get("Origin") or request.headers.get("Referer")
    return same_origin(origin, request.host, settings.public_url, required=required)


def build_middleware(
    sessions: Sessions, unauthorised: Callable[[web.Request], web.Response]
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The middleware: find the session, refuse strangers (401), check CSRF on POST (403), add headers."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await _guarded(request, handler)
        except web.HTTPException as exc:
            exc.headers.update(SECURITY_HEADERS)
            raise
        finally:
            sessions.handled(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    async def _guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(ANY_HOST_PATHS) and not host_allowed(
            request.headers.get("Host"), sessions.allowed_hosts
        ):
            names = ", ".join(sorted(sessions.allowed_hosts))
            raise web.HTTPMisdirectedRequest(
                text=f"421: this console answers only to {names} (start it with --public-url to add a name)"
            )
        changes = request.method not in {"GET", "HEAD", "OPTIONS"}
        if request.path.startswith(OPEN_PATHS):
            if changes and not from_here(request, sessions.settings, required=True):
                raise web.HTTPForbidden(text="403: a form from another site")
            sessions.handling(request, sessions.get(request.cookies.get(COOKIE)))
            return await handler(request)
        session, new_sid = _find(request)
        if session is None:
            return unauthorised(request)
        sessions.handling(request, session)
        if changes:
            if not from_here(request, sessions.settings, required=not session.bearer):
                raise web.HTTPForbidden(text="403: a form from another site")
            if not session.bearer:
                form = await request.post()
                given = form.get("csrf")
                if not isinstance(given, str) or not hmac.compare_digest(
                    given.encode(), session.csrf.encode()
                ):
                    raise web.HTTPForbidden(text="the form's CSRF token is missing or stale: reload the page")
        response = await handler(request)
        if new_sid is not None:
            set_cookie(response, new_sid)
        return response

    def _find(request: web.Request) -> tuple[Session | None, str | None]:
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            client = client_of(request)
            wait = sessions.throttle.wait(client)
            if wait:
                raise too_many(wait)
            user = sessions.authenticate(header[len("Bearer ") :].strip())
            if user is None:
                sessions.throttle.failed(client)
                log.warning("console: a request from %s with a wrong token", escape(client))
                return None, None
            sessions.throttle.succeeded(client)
            return Session(user, bearer=True), None
        session = sessions.get(request.cookies.get(COOKIE))
        if session is not None:
            return session, None
        if sessions.open_locally:
            sid, session = sessions.open(LOCAL_USER)
            return session, sid
        return None, None

    return middleware


__all__ = ["Role", "Session", "Sessions", "build_middleware", "require_redrive", "safe_next"]

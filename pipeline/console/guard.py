"""Which requests reach the console at all: its host names, its own origin, and redirects inside it.

A browser on the operator's machine runs other sites' scripts. A page at
``rebind.attacker.example`` whose name the attacker points at 127.0.0.1 is, to
the browser, the same origin as that page: it may read the console's answers.
What gives it away is the ``Host`` header, which names the attacker's domain:
the console answers only to its own names (:func:`allowed_hosts`), everyone
else gets 421. A form another site posts carries that site's ``Origin``
(:func:`same_origin`), and a login's ``next`` is followed only when it is a
path of this console (:func:`safe_next`). Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

#: Names that always mean this machine, and no DNS answer can move.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 (names of the wildcard address, not a bind)
#: A redirect target: a path (and query) of printable ASCII that no browser reads as another host.
_LOCAL_PATH = re.compile(r"/(?![/\\])[!#-\[\]-~]*")


def host_name(header: str) -> str:
    """The host of a ``Host`` header or a URL's netloc, lowercased, without port, brackets or a final dot."""
    text = header.strip().lower()
    if text.startswith("["):
        name = text[1 : text.find("]")] if "]" in text else text[1:]
    else:
        name, colon, port = text.rpartition(":")
        if not colon or not port.isdigit():
            name = text
    return name.rstrip(".")


def allowed_hosts(listen: str, public_url: str) -> frozenset[str]:
    """The host names the console answers to: loopback, the address it listens on when that is
    one address (not every address), and the host of ``public_url``."""
    names = set(LOOPBACK_NAMES)
    listen_name = host_name(listen)
    if listen_name not in _WILDCARDS:
        names.add(listen_name)
    if public_url:
        names.add(host_name(urlsplit(public_url).netloc))
    return frozenset(names)


def host_allowed(header: str | None, allowed: frozenset[str]) -> bool:
    """Whether a request's ``Host`` names this console (any loopback address counts as loopback)."""
    if not header:
        return False
    name = host_name(header)
    if name in allowed:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def same_origin(origin: str | None, host_header: str, public_url: str, *, required: bool) -> bool:
    """Whether a state-changing request comes from this console's own pages: its ``Origin`` (else
    ``Referer``) is this console as the request reached it, or its public URL. Without either header,
    ``required`` decides (a browser always sends ``Origin`` on a POST; a script with a bearer token
    need not)."""
    if not origin:
        return not required
    if origin == "null":  # a sandboxed frame, a file:// page, a redirect across sites
        return False
    parts = urlsplit(origin)
    if parts.scheme not in {"http", "https"}:
        return False
    ours = {host_header.strip().lower()}
    if public_url:
        ours.add(urlsplit(public_url).netloc.lower())
    return parts.netloc.lower() in ours


def safe_next(target: str | None) -> str:
    """A redirect target inside this console (a path of printable ASCII, not ``//host``), or ``/``.

    A tab or a newline is refused, not stripped: browsers drop them from a URL, so ``/\\t/host``
    would be followed as ``//host``, and a newline cannot go into a ``Location`` header.
    """
    if target and _LOCAL_PATH.fullmatch(target) and "\\" not in target:
        return target
    return "/"


def check_public_url(url: str) -> str | None:
    """What is wrong with ``--public-url`` (an ``http(s)://host[:port]`` URL, at most a ``/`` path), or None."""
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        return f"--public-url must be http://host[:port] or https://host[:port], got {url[:80]!r}"
    if parts.path not in {"", "/"} or parts.query or parts.fragment:
        return "--public-url must not have a path: the console serves from / (a proxy may not move it)"
    return None

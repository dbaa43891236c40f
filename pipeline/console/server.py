"""``Console``: the console as a service the CLI and ``pipeline up`` run until stopped."""

from __future__ import annotations

import asyncio
import logging
import os

from aiohttp import web

from pipeline.console.app import Pages, build_app
from pipeline.console.redaction import Redactor
from pipeline.console.redrive import Follower
from pipeline.console.settings import ConsoleSettings
from pipeline.console.workers import Live
from pipeline.errors import ConfigError
from pipeline.log_text import escape
from pipeline.topology import Topology

log = logging.getLogger(__name__)


class Console:
    """Serves the console on ``settings.host``:``settings.port``, samples the workers and follows redrives."""

    def __init__(self, settings: ConsoleSettings, topology: Topology) -> None:
        self.settings = settings
        self.topology = topology
        self.live = Live(settings.workers, every=settings.refresh_seconds)
        self._runner: web.AppRunner | None = None
        self._pages: Pages | None = None
        self._follower: Follower | None = None
        self._stopping = asyncio.Event()
        self.port = settings.port

    @property
    def url(self) -> str:
        """Where a browser finds it: the public URL when given, else its address (loopback for every address)."""
        if self.settings.public_url:
            return self.settings.public_url.rstrip("/") + "/"
        host = self.settings.host
        shown = "127.0.0.1" if host in {"0.0.0.0", "::", ""} else host  # noqa: S104 (naming, not binding)
        return f"http://{'[' + shown + ']' if ':' in shown else shown}:{self.port}/"

    @property
    def where(self) -> str:
        """The URL, and the address it listens on when that is not the URL's (every address, a proxy)."""
        host = self.settings.host
        bound = f"{'[' + host + ']' if ':' in host else host}:{self.port}"
        if self.url.startswith(f"http://{bound}/"):
            return self.url
        every = " (every address)" if host in {"0.0.0.0", "::", ""} else ""  # noqa: S104 (naming, not binding)
        return f"{self.url} (listening on {bound}{every})"

    async def start(self) -> None:
        """Listen (a port that cannot be had is a ConfigError) and start sampling."""
        pages = Pages(self.settings, self.topology, self.live, Redactor.of(self.topology, os.environ))
        runner = web.AppRunner(build_app(pages), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.host, self.settings.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(
                f"the console cannot listen on {self.settings.host}:{self.settings.port}: {exc}"
            ) from None
        self._runner = runner
        addresses = runner.addresses  # the bound port, which port 0 leaves to the system
        if addresses:
            self.port = int(addresses[0][1])
        self._pages = pages
        self.live.start()
        self._follower = Follower(pages.redrives)
        self._follower.start()
        roles = (
            ", ".join(f"{escape(u.name)} ({u.role})" for u in self.settings.users) or "none: loopback only"
        )
        log.info(
            "console on %s (tokens: %s; workers: %s)",
            self.where,
            roles,
            ", ".join(self.settings.workers) or "none",
        )

    async def run(self) -> None:
        """Serve until :meth:`stop`."""
        try:
            await self._stopping.wait()
        finally:
            await self.live.stop()
            if self._follower is not None:
                await self._follower.stop()
            if self._runner is not None:
                await self._runner.cleanup()
            if self._pages is not None:
                await self._pages.history.close()

    def stop(self) -> None:
        """Ask it to stop."""
        self._stopping.set()

"""Wrong tokens, rate-limited per client: after ``limit`` in ``window`` seconds, a client waits.

A token has at least 16 characters, so guessing one is hopeless, but a client
that keeps trying is either lost or guessing: after :data:`LIMIT` wrong tokens
in :data:`WINDOW` seconds its logins and bearer requests are answered 429
(with ``Retry-After``) until its oldest failure leaves the window, whatever
token it sends. Clients are told apart by their address; behind a proxy they
share one. In memory, bounded: the least recently seen clients are forgotten first.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable

LIMIT = 10
WINDOW = 300.0
MAX_CLIENTS = 10_000


class Throttle:
    """Counts each client's wrong tokens within a sliding window."""

    def __init__(
        self,
        *,
        limit: int = LIMIT,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self.max_clients = max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, client: str) -> deque[float]:
        failures = self._failures.get(client)
        if failures is None:
            return deque()
        cutoff = self.clock() - self.window
        while failures and failures[0] <= cutoff:
            failures.popleft()
        if not failures:
            del self._failures[client]
        return failures

    def wait(self, client: str) -> float:
        """Seconds ``client`` must wait before its next try (0: it may try now)."""
        failures = self._recent(client)
        if len(failures) < self.limit:
            return 0.0
        return max(failures[0] + self.window - self.clock(), 0.0)

    def failed(self, client: str) -> None:
        """``client`` sent a wrong token."""
        failures = self._recent(client)
        failures.append(self.clock())
        self._failures[client] = failures
        self._failures.move_to_end(client)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)

    def succeeded(self, client: str) -> None:
        """``client`` sent a right token: its count starts again."""
        self._failures.pop(client, None)

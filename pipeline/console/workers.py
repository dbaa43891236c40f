"""What the workers say over HTTP (``/readyz``, ``/partitions``, ``/metrics``), sampled every few seconds.

:class:`Live` asks every worker at each tick, keeps the last answers and a
short history of the summed counters, from which the console draws the
rates of first copies (accepted), duplicates and DLQ records. The history
lives in memory: it starts empty with the console.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from pipeline.cancelling import cancel_and_wait

log = logging.getLogger(__name__)

#: The counters the rate charts draw: name -> (metric sample, label filter).
RATES: dict[str, tuple[str, dict[str, str]]] = {
    "accepted": ("pipeline_events_total", {"outcome": "first"}),
    "duplicates": ("pipeline_events_total", {"outcome": "duplicate"}),
    "dlq": ("pipeline_dlq_records_total", {}),
}
HISTORY = 60  # samples kept (three minutes at the default refresh)


@dataclass
class WorkerView:
    """One worker as last seen: reachable, healthy (serving every partition it was given, ``/readyz``),
    its partitions' states and a few gauges."""

    url: str
    sampled: bool = False  # asked at least once (a console just started has not yet)
    reachable: bool = False
    healthy: bool = False
    alive: bool = False  # restoring, say: not serving everything yet, and nothing wrong
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what it serves on but warns of (a topic config)
    states: dict[str, str] = field(default_factory=dict)  # "<topic>-<partition>" -> lifecycle state
    owned: dict[str, list[int]] = field(default_factory=dict)
    gauges: dict[tuple[str, str, int], float] = field(default_factory=dict)  # (metric, topic, partition)
    totals: dict[str, float] = field(default_factory=dict)  # RATES name -> counter value
    error: str = ""

    def state_of(self, topic: str, partition: int) -> str | None:
        """The lifecycle state this worker reports for a partition (None: not assigned here)."""
        return self.states.get(f"{topic}-{partition}")

    def gauge(self, metric: str, topic: str, partition: int) -> float | None:
        """A per-partition gauge (lag, restore remaining, store keys), if this worker reports it."""
        return self.gauges.get((metric, topic, partition))


def base_url(url: str) -> str:
    """``host:port`` or a URL, as a URL without a trailing slash."""
    return (url if url.startswith("http") else f"http://{url}").rstrip("/")


async def poll_worker(session: aiohttp.ClientSession, url: str) -> WorkerView:
    """Ask one worker everything the console shows about it; an unreachable one says why."""
    view = WorkerView(url, sampled=True)
    base = base_url(url)
    try:
        async with session.get(f"{base}/readyz") as response:
            health = await response.json(content_type=None)
            view.healthy = response.status == 200
        async with session.get(f"{base}/partitions") as response:
            owned = await response.json(content_type=None)
        async with session.get(f"{base}/metrics") as response:
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        view.error = f"{type(exc).__name__}: {exc}"[:200] or type(exc).__name__
        view.healthy = False
        return view
    view.reachable = True
    if isinstance(health, dict):
        _read_health(view, health)
    if isinstance(owned, dict):
        view.owned = {str(t): [int(p) for p in ps] for t, ps in dict(owned.get("partitions") or {}).items()}
    _read_metrics(view, text)
    return view


def _read_health(view: WorkerView, health: dict[str, Any]) -> None:
    """What a ``/readyz`` body says: alive, each partition's state, the problems and the warnings."""
    view.alive = view.healthy or health.get("status") == "not ready"
    view.states = {str(k): str(v) for k, v in dict(health.get("partitions") or {}).items()}
    view.problems = [str(p) for p in health.get("problems") or []]
    view.warnings = [str(w) for w in health.get("warnings") or []]


def _read_metrics(view: WorkerView, text: str) -> None:
    """The per-partition gauges and the counters of :data:`RATES` from a ``/metrics`` page."""
    gauges = {"pipeline_consumer_lag", "pipeline_restore_remaining_records", "pipeline_store_keys"}
    totals = dict.fromkeys(RATES, 0.0)
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        view.error = "its /metrics page does not parse"
        return
    for family in families:
        for sample in family.samples:
            if sample.name in gauges and "partition" in sample.labels:
                with contextlib.suppress(ValueError):
                    where = (sample.name, sample.labels.get("topic", ""), int(sample.labels["partition"]))
                    view.gauges[where] = sample.value
            for name, (metric, wanted) in RATES.items():
                if sample.name == metric and all(sample.labels.get(k) == v for k, v in wanted.items()):
                    totals[name] += sample.value
    view.totals = totals


@dataclass(frozen=True, slots=True)
class Sample:
    """The counters of every reachable worker (by URL) at one moment."""

    at: float
    totals: dict[str, dict[str, float]]


class Live:
    """Samples the workers every ``every`` seconds in the background; the pages read the latest."""

    def __init__(self, workers: tuple[str, ...], *, every: float) -> None:
        self.workers = workers
        self.every = every
        self.views: list[WorkerView] = [WorkerView(url) for url in workers]
        self.samples: deque[Sample] = deque(maxlen=HISTORY)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin sampling."""
        self._task = asyncio.create_task(self._loop(), name="console-sampler")

    async def stop(self) -> None:
        """Stop sampling."""
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def refresh(self) -> list[WorkerView]:
        """Ask every worker now; remember the answers and one sample."""
        timeout = aiohttp.ClientTimeout(total=max(self.every, 2.0))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            views = await asyncio.gather(*(poll_worker(session, url) for url in self.workers))
        self.views = list(views)
        totals = {view.url: dict(view.totals) for view in self.views if view.reachable}
        self.samples.append(Sample(time.monotonic(), totals))
        return self.views

    async def _loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # a sampler that dies would freeze every chart: log it and go on
                log.exception("console: sampling the workers failed")
            await asyncio.sleep(self.every)

    def rates(self) -> dict[str, list[float]]:
        """Per second, between consecutive samples, for each of :data:`RATES`: each worker's increase, summed
        over the workers that answered both times (a restarted worker's drop reads 0; one that missed a
        sample adds nothing to the two intervals around it, instead of a dip and then a spike)."""
        out: dict[str, list[float]] = {name: [] for name in RATES}
        pairs = list(zip(list(self.samples)[:-1], list(self.samples)[1:], strict=True))
        for before, after in pairs:
            span = max(after.at - before.at, 1e-3)
            both = before.totals.keys() & after.totals.keys()
            for name in RATES:
                grown = sum(
                    max(after.totals[w].get(name, 0.0) - before.totals[w].get(name, 0.0), 0.0) for w in both
                )
                out[name].append(grown / span)
        return out

    def summary(self) -> dict[str, Any]:
        """How many workers answer and how many are healthy."""
        reachable = sum(1 for v in self.views if v.reachable)
        healthy = sum(1 for v in self.views if v.healthy)
        return {"workers": len(self.views), "reachable": reachable, "healthy": healthy}

"""One standby replica: a warm copy of a partition another worker serves, tailing its changelog.

A standby opens the partition's store where a served partition would (same
path, same identity checks: a store of another changelog is rebuilt, one under
another name is refused and left alone), to follow its changelog, and replays
the changelog read_committed into it in rounds
(:meth:`pipeline.state.restore.Restorer.catch_up`), each to the end the changelog has when
the round starts, then waits :data:`POLL_S` when it had nothing to do. It
writes through the same code as a restore, and nothing else: it never emits,
never commits offsets and never starts a producer (it has none).

What fails is retried: the store is closed, and opened again after a pause
that doubles up to :data:`RETRY_MAX_S`; a standby never stops the worker. When
the group makes the partition this worker's to serve, the standby is closed
first (:meth:`Standby.close`) and the partition opens the same store, fences
the previous owner and replays only what the standby had not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from pipeline.cancelling import cancel_and_wait
from pipeline.errors import (
    BrokerUnavailableError,
    StoreError,
    StoreIdentityError,
    StoreStaleError,
)
from pipeline.state import directory
from pipeline.state.restore import Restorer
from pipeline.state.store import PartitionStore
from pipeline.state.store_meta import StoreIdentity
from pipeline.worker.lifecycle import Lifecycle, StandbyState

log = logging.getLogger(__name__)

POLL_S = 0.5  # a standby level with its changelog looks for more this often
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0
RETRIED = (StoreError, KafkaError, BrokerUnavailableError, OSError)

State = StandbyState


class Standby:
    """A standby copy of ``tp``'s store, from OPENING to CLOSED (:mod:`pipeline.worker.lifecycle`)."""

    def __init__(
        self,
        tp: TopicPartition,
        *,
        changelog: TopicPartition,
        identity: StoreIdentity,
        path: Path,
        bucket_ms: int,
        restorer: Restorer,
        opener: directory.StoreOpener = PartitionStore.open,
        on_applied: Callable[[int], None] | None = None,
    ) -> None:
        self.tp = tp
        self.name = f"{tp.topic}-{tp.partition}"
        self.changelog = changelog
        self.identity = identity
        self.path = path
        self.bucket_ms = bucket_ms
        self._restorer = restorer  # the worker's restore service: its reader and budget
        self._opener = opener
        self._on_applied = on_applied  # told how many records each round replayed (a metric)
        self.lifecycle = Lifecycle.standby(self.name)
        self.store: PartitionStore | None = None
        self.position = -1  # the changelog offset the store reflects
        self.stored: int | None = None  # the checked offset its store on disk holds (None: not known yet)
        self.end: int | None = None  # the changelog's end (last stable offset) at the last round
        self.started_at = time.monotonic()
        self.level_at: float | None = None  # when the store was last level with its changelog
        self.applied = 0  # records replayed since this standby started
        self.replaying = False  # a round is replaying (closing now stops it between two writes)
        self._task: asyncio.Task[None] | None = None

    @property
    def state(self) -> StandbyState:
        """The lifecycle state."""
        return self.lifecycle.state

    @property
    def lag_records(self) -> int | None:
        """Changelog records the copy is behind, as of the last round (None before the first)."""
        if self.end is None:
            return None
        return max(self.end - (self.position + 1), 0)

    def lag_seconds(self, now: float) -> float:
        """How long since the copy was last level with its changelog (0 when it is)."""
        if self.lag_records == 0:
            return 0.0
        return now - (self.level_at if self.level_at is not None else self.started_at)

    def describe(self, now: float) -> dict[str, object]:
        """What ``/healthz`` and ``/partitions`` say about this standby."""
        return {
            "state": self.state.value,
            "replaying": self.replaying,
            "position": self.position,
            "lag_records": self.lag_records,
            "lag_seconds": round(self.lag_seconds(now), 3),
            "replayed": self.applied,  # records replayed since it started (the worker's counter sums all)
        }

    def start(self) -> None:
        """Begin following the changelog in the background."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"standby {self.name}")

    async def close(self) -> int | None:
        """Stop following and close the store (its lock released); returns the changelog offset the store
        left on disk holds, once checked against the changelog's end (-1: nothing; None: not known, so what
        was known of it before stands)."""
        task, self._task = self._task, None
        if task is not None:
            if self.replaying:
                log.info(
                    "standby %s: stopped in the middle of a round, at changelog offset %s",
                    self.name,
                    self.store.changelog_offset if self.store is not None else self.position,
                )
            await cancel_and_wait(task)
        self._close_store()
        if not self.lifecycle.closed:
            self.lifecycle.move(State.CLOSED)
        return self.stored

    async def _run(self) -> None:
        backoff = RETRY_FIRST_S
        while True:
            try:
                await self._round()
            except StoreIdentityError as exc:  # someone else's store: never touched
                log.warning("standby %s: %s; keeping no standby of it", self.name, exc)
                self._close_store()
                self.lifecycle.move(State.CLOSED)
                return
            except Exception as exc:  # any other is a bug: logged whole, and retried all the same
                if isinstance(exc, RETRIED):
                    log.warning("standby %s: %s; trying again in %.0fs", self.name, str(exc), backoff)
                else:  # a standby never stops the worker: its serving partitions go on
                    log.exception("standby %s: unexpected error; trying again in %.0fs", self.name, backoff)
                self._close_store()
                if self.state is State.FOLLOWING:
                    self.lifecycle.move(State.OPENING)
            else:
                backoff = RETRY_FIRST_S
                continue
            # waited outside the except block: the failure's traceback holds RocksDB handles, which keep
            # the closed store locked (a promotion opening it meanwhile would find it "held")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RETRY_MAX_S)

    async def _round(self) -> None:
        """Replay the changelog to the end it has now; wait when there was nothing to replay."""
        store = self._open()
        self.replaying = True
        try:
            applied, self.end = await self._restorer.catch_up(store, self.changelog)
        except StoreStaleError as exc:  # ahead of its changelog: a cache of another log
            self._rebuild(str(exc))
            return
        finally:
            self.replaying = False
        self._note(store)  # checked by the round
        self.applied += applied
        if applied and self._on_applied is not None:
            self._on_applied(applied)
        if self.position + 1 >= self.end:
            self.level_at = time.monotonic()
        if applied == 0:
            await asyncio.sleep(POLL_S)

    def _open(self) -> PartitionStore:
        """The store, opened to follow its changelog (OPENING → FOLLOWING) unless it is open already."""
        if self.store is not None:
            return self.store
        try:
            self.store = directory.open_store(
                self.path, bucket_ms=self.bucket_ms, identity=self.identity, opener=self._opener, follow=True
            )
        except StoreError:
            if not directory.holds_store(self.path):  # wiped (it could not be read), and not made again
                self.position = self.stored = -1
            raise
        # what it holds is taken now only when it is empty (new, or made again after a wipe): a round checks others
        self._note(self.store)
        if self.state is State.OPENING:
            self.lifecycle.move(State.FOLLOWING)
        log.info("standby %s: following %s from offset %s", self.name, self.changelog, self.position + 1)
        return self.store

    def _rebuild(self, why: str) -> None:
        store = self.store
        if store is None:
            return
        self.store = None
        self.position = self.stored = -1  # wiped first: what it held is gone even if the reopen fails
        self.store = directory.rebuild(store, identity=self.identity, why=why, opener=self._opener)
        self._note(self.store)

    def _note(self, store: PartitionStore) -> None:
        """Take the store's position, and, once it is checked against the changelog's end, what it holds."""
        self.position = store.changelog_offset
        if store.checked:
            self.stored = self.position

    def _close_store(self) -> None:
        store, self.store = self.store, None
        if store is None:
            return
        self._note(store)
        try:
            store.close()
        except StoreError as exc:
            log.warning("standby %s: %s", self.name, exc)

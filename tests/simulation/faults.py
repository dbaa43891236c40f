"""The faults a seed injects, drawn from it, and the store that fails on demand.

Each fault has a virtual time and a target; :mod:`tests.simulation.world` carries it out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from random import Random
from typing import Any

from pipeline.errors import StoreCorruptError, StoreStaleError
from pipeline.state.decision import Entry
from pipeline.state.store import PartitionStore
from tests.simulation.loop import CURRENT

KINDS = (
    "crash",  # SIGKILL at an arbitrary await point; restarted on the same disk
    "pause",  # SIGSTOP past the session timeout (a zombie), then SIGCONT
    "leave",  # SIGTERM (a rolling restart, or scaling in), started again later
    "join",  # one more worker (scaling out)
    "outage",  # the broker is down (sometimes longer than a transaction may stay open)
    "fence",  # another producer takes a partition's transactional id
    "producer-fatal",  # the broker answers a transaction request with an error that kills the sender
    "commit-refused",  # the broker refuses a transaction's offsets or its commit
    "disk",  # the next reads or writes of a worker's stores fail
    "foreign-store",  # a worker restarts on a store that belongs to another cluster
    "refuse-outputs",  # a topic's limits change under the workers (timestamps, sizes)
)
STORM = (
    "fatal-storm"  # for a while every transaction's producer dies: partitions break and reopen over and over
)
MAX_CORRUPT = 5  # stores called corrupt reported, of a run
RESCALE = "rescale"  # every worker stopped, ``pipeline rescale`` to ``target`` partitions, started again
RECONFIGURE = "reconfigure"  # a topic configuration changed while the workers run (``detail`` says which)
# a worker restarts with its changelog reads crawling; once it opens its partitions, a worker joins (drawn apart)
REVOKE_MID_OPEN = "revoke-mid-open"
# a second process under a running worker's instance id, for ``duration`` seconds (the static mix)
TWIN = "twin"
# the broker refuses one produce request of a partition's worker as CORRUPT_MESSAGE, once (a bit flipped on the
# wire: its CRC fails): the same records sent again are taken (the poison mix; drawn apart)
CORRUPT = "corrupt"
# the broker completes a commit of a partition's worker, its reply is lost with the connection, and another
# producer takes the transactional id before the client asks again: the retry is answered "fenced" for a
# commit that took (the default mix; drawn apart)
LOST_COMMIT = "lost-commit"
# the broker refuses the next produce request of a ``dlq replay`` (the only producer that is not
# transactional) as CORRUPT_MESSAGE, once, which aiokafka does not retry (the redrive mix; drawn apart)
REFUSE_REPLAY = "refuse-replay"
STANDBY_KINDS = (  # drawn apart (draw_standby), so that the draws of KINDS stay what they were for every seed
    "promote-mid-replay",  # a worker's standby fetches crawl; the owner of one of its standbys leaves: promoted mid-replay
    "leader-kill",  # a worker joins; the group's leader is SIGKILLed while the assignment is being made
)


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    target: int = 0  # a worker slot, or a partition
    duration: float = 0.0
    steps: int = 0  # crash: callbacks of the process still run after ``at``
    detail: str = ""

    def describe(self) -> str:
        extra = []
        if self.duration:
            extra.append(f"for {self.duration:.1f}s")
        if self.steps:
            extra.append(f"after {self.steps} more steps")
        if self.detail:
            extra.append(self.detail)
        return f"t={self.at:.2f} {self.kind} #{self.target} {' '.join(extra)}".rstrip()


def draw(
    rng: Random,
    *,
    window: float,
    workers: int,
    partitions: int,
    session_s: float,
    kinds: Mapping[str, float] | None = None,
) -> list[Fault]:
    """A fault schedule within ``window`` seconds; ``kinds`` weights the kinds (none: each as likely)."""
    faults: list[Fault] = []
    count = rng.choice((0, 1, 2, 3, 4, 6))
    weights = [kinds.get(kind, 0.0) for kind in KINDS] if kinds else None
    for _ in range(count):
        kind = rng.choices(KINDS, weights)[0] if weights else rng.choice(KINDS)
        at = rng.uniform(0.5, window)
        worker = rng.randrange(workers)
        if kind == "crash":
            faults.append(Fault(at, kind, worker, rng.uniform(0.2, 8.0), steps=rng.randint(0, 400)))
        elif kind == "pause":
            faults.append(Fault(at, kind, worker, rng.uniform(0.3, 3.0) * session_s))
        elif kind == "leave":
            faults.append(Fault(at, kind, worker, rng.uniform(0.5, 10.0)))
        elif kind == "join":
            faults.append(Fault(at, kind, workers, rng.uniform(5.0, 30.0)))
        elif kind == "outage":
            long = rng.random() < 0.3
            faults.append(Fault(at, kind, 0, rng.uniform(61.0, 95.0) if long else rng.uniform(0.5, 15.0)))
        elif kind == "fence":
            faults.append(Fault(at, kind, rng.randrange(partitions)))
        elif kind == "producer-fatal":
            faults.append(
                Fault(at, kind, rng.randrange(partitions), detail=rng.choice(("add-partitions", "end-txn")))
            )
        elif kind == "commit-refused":
            faults.append(
                Fault(at, kind, rng.randrange(partitions), detail=rng.choice(("offsets", "end-txn-retry")))
            )
        elif kind == "disk":
            faults.append(
                Fault(
                    at,
                    kind,
                    worker,
                    detail=rng.choice(("get_many", "write", "expire")),
                    steps=rng.randint(1, 3),
                )
            )
        elif kind == "foreign-store":
            faults.append(
                Fault(at, kind, worker, rng.uniform(0.2, 3.0), detail=rng.choice(("cluster", "ahead")))
            )
        elif kind == "refuse-outputs":
            faults.append(Fault(at, kind, 0, detail=rng.choice(("timestamps", "size"))))
    faults.sort(key=lambda f: f.at)
    return faults


def draw_standby(rng: Random, *, window: float, workers: int, standbys: int) -> list[Fault]:
    """Up to two of :data:`STANDBY_KINDS` within ``window`` seconds (a promotion needs standbys)."""
    faults: list[Fault] = []
    for _ in range(rng.choice((0, 0, 1, 1, 2))):
        kind = rng.choice(STANDBY_KINDS if standbys else ("leader-kill",))
        at = rng.uniform(1.0, window)
        if kind == "promote-mid-replay":
            faults.append(Fault(at, kind, rng.randrange(workers), rng.uniform(3.0, 12.0), detail="crawl"))
        else:
            faults.append(Fault(at, kind, workers, rng.uniform(0.2, 8.0)))
    return faults


class DiskFaults:
    """Which store calls fail next, per worker slot."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, str], int] = defaultdict(int)  # (slot, method) -> calls to fail

    def arm(self, slot: str, method: str, count: int) -> None:
        self.pending[(slot, method)] += count

    def take(self, slot: str, method: str) -> bool:
        key = (slot, method)
        if self.pending.get(key, 0) > 0:
            self.pending[key] -= 1
            return True
        return False


class _FailingFamily:
    """A column family (or the database) whose reads or writes fail on demand, as RocksDB's do."""

    def __init__(self, inner: Any, store: SimStore) -> None:
        self._inner = inner
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get(self, *args: Any, **kwargs: Any) -> Any:
        self._store.maybe_fail("get_many")
        return self._inner.get(*args, **kwargs)

    def write(self, *args: Any, **kwargs: Any) -> Any:
        self._store.maybe_fail("write")
        return self._inner.write(*args, **kwargs)

    def drop_column_family(self, *args: Any, **kwargs: Any) -> Any:
        self._store.maybe_fail("expire")
        return self._inner.drop_column_family(*args, **kwargs)

    def create_column_family(self, *args: Any, **kwargs: Any) -> Any:
        self._store.maybe_fail("create")  # a new bucket's column family (the time mix's bucket faults)
        return _FailingFamily(self._inner.create_column_family(*args, **kwargs), self._store)


class StoreLedger:
    """What each store on the simulated disks holds, as the world sees it: an open store's changelog
    offset live, a closed one's as it was closed (the truth a worker's claims are held to, claims.py).

    And every store a worker called corrupt (``StoreCorruptError`` as it opened or read one). Nothing
    in the simulation corrupts a store: the disk faults fail a call, as RocksDB's I/O errors do, and
    leave what is on disk whole; a foreign store is another log's, whole. So each is a problem: a
    store written in a form its own code cannot read back (a bucket width written as ``6.048e7``
    and read with ``int()``: every reopen wiped it and replayed the whole changelog, and no
    command was wrong, so no other rule saw it)."""

    def __init__(self) -> None:
        self.open: dict[Path, PartitionStore] = {}
        self.closed_at: dict[Path, int] = {}
        self.corrupt: list[str] = []  # each store called corrupt: the problem to report

    def found_corrupt(self, path: Path, exc: StoreCorruptError) -> None:
        if isinstance(exc, StoreStaleError):
            return  # another log's store, whole (a foreign store the world planted): stale.py judges those
        process = CURRENT.get()
        if len(self.corrupt) < MAX_CORRUPT:
            self.corrupt.append(
                f"{process.name if process is not None else '?'} found a store corrupt ({exc}), though "
                f"nothing in the run corrupts one: a store its own code wrote and cannot read back ({path.name})"
            )

    def opened(self, store: PartitionStore) -> None:
        self.open[store.path.resolve()] = store

    def closed(self, store: PartitionStore) -> None:
        path = store.path.resolve()
        if self.open.get(path) is store:
            del self.open[path]
        self.closed_at[path] = store.changelog_offset

    def holds(self, path: Path) -> int | None:
        """The changelog offset the store at ``path`` holds (-1: none there); None when the world never saw it."""
        path = path.resolve()
        store = self.open.get(path)
        if store is not None:
            return store.changelog_offset
        if not (path / "CURRENT").is_file():
            return -1
        return self.closed_at.get(path)


class SimStore(PartitionStore):
    """A real RocksDB store that a simulated process owns: closed when that process dies (the OS
    releases its lock), and failing on demand where RocksDB would (its database and column
    families raise as rocksdict does, so the store's own error handling runs)."""

    faults: DiskFaults | None = None
    ledger: StoreLedger | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.ledger is not None:
            self.ledger.opened(self)
        process = CURRENT.get()
        self.slot = process.name.split(".")[0] if process is not None else "?"
        if process is not None:
            process.on_crash.append(self._died)
        self._db = _FailingFamily(self._db, self)  # type: ignore[assignment]
        self._buckets = {b: _FailingFamily(f, self) for b, f in self._buckets.items()}  # type: ignore[misc]

    def _died(self) -> None:
        if not self.closed:
            self.close()

    def close(self) -> None:
        if not self.closed and self.ledger is not None:
            self.ledger.closed(self)
        super().close()

    @classmethod
    def open(cls, path: Path, **kwargs: Any) -> PartitionStore:
        try:
            return super().open(path, **kwargs)
        except StoreCorruptError as exc:
            if cls.ledger is not None:
                cls.ledger.found_corrupt(path, exc)
            raise

    def get_many(self, keys: list[bytes]) -> dict[bytes, Entry]:
        try:
            return super().get_many(keys)
        except StoreCorruptError as exc:
            if self.ledger is not None:
                self.ledger.found_corrupt(self.path, exc)
            raise

    def maybe_fail(self, method: str) -> None:
        if self.faults is not None and self.faults.take(self.slot, method):
            raise Exception(f"IO error: simulated disk fault in {method}")

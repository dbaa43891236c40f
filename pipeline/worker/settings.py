"""The worker's settings, immutable and validated at start-up: the one place every worker default lives.

Each field of :class:`WorkerSettings` has one command-line flag and one environment
variable, named in :data:`pipeline.options.WORKER_OPTIONS`; ``pipeline worker --help``
lists them. A field's default is its dataclass default (:data:`WORKER_DEFAULTS`), or,
for a field the class requires, its option's.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError

MIB = 1024 * 1024
COMMIT_POLICIES = ("caught-up", "interval")
MAX_STANDBY_REPLICAS = 8
DEFAULT_STATE_DIR = Path(".state/worker")


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How a dedupe worker runs."""

    bootstrap: str
    topology: Path
    state_dir: Path
    group: str = ""  # empty: the topology's app name (see for_topology)
    metrics_port: int | None = None
    http_host: str = "127.0.0.1"  # where that port listens; 0.0.0.0 in Kubernetes (probes, Prometheus)
    # Under load (a partition never caught up) a transaction commits at whichever of these comes
    # first; larger transactions cost less per record (docs/benchmarks.md, Worker). At low load a
    # partition commits as soon as it is caught up, so they do not set the latency there.
    commit_interval: float = 1.0  # seconds a transaction stays open at most
    max_batch: int = 10_000  # a transaction commits once it holds this many input records
    # "caught-up": commit a partition as soon as it has handled everything fetched and reached the
    # end of its log (low latency at low load); "interval": only at commit_interval or max_batch.
    commit_policy: str = "caught-up"
    # a caught-up transaction waits this long for more records before it commits (at a steady low rate a
    # transaction per cycle is most of the CPU; this adds at most this much to the latency)
    commit_linger: float = 0.02
    restore_progress_every: float = 5.0  # seconds between restore progress lines
    session_timeout_ms: int = 10_000  # how long a silent (crashed, stopped) worker keeps its partitions
    instance_id: str | None = (
        None  # static group membership: a restart with the same id gets its partitions back
    )
    # -- the constants that matter in operation ----------------------------------------------
    chunk_records: int = 250  # records handled between two yields to the event loop
    # records fetched at once, and the queue length at which a partition is paused (memory);
    # never more than max_batch (see fetch_records)
    poll_records: int = 2000
    send_bytes: int = 128 * 1024  # a producer batch this big is sent before the commit
    linger_ms: int = 5  # the transactional producers' linger
    fetch_max_bytes: int = 16 * MIB  # the worker consumer's fetch size, all partitions
    max_partition_fetch_bytes: int = 4 * MIB  # ... and per partition
    # check each fetched batch's CRC in the consumer (its cost: bench/crc_cost.py, docs/benchmarks.md);
    # the broker checks it on produce. Off as in librdkafka (check.crcs).
    check_crcs: bool = False
    # warm copies of partitions owned by other workers, tailing their changelogs (the group's leader
    # decides for the group: set it the same on every worker)
    standby_replicas: int = 0
    restore_fetch_bytes: int = 32 * MIB  # the restore consumer's fetch size
    restore_budget_bytes: int = 64 * MIB  # what all restores may fetch at once (each holds its fetch size)
    queue_bytes: int = 16 * MIB  # a partition with this many bytes queued is paused, as with poll_records
    # a record dated further ahead of the worker's clock is decided at this bound, and moves stream
    # time no further (a producer with a wrong clock must not expire the seen-set)
    max_clock_skew: float = 3600.0
    store_lock_wait: float = 30.0  # seconds to wait for a previous owner's RocksDB lock
    open_timeout: float = 120.0  # seconds a partition may keep failing to open before the worker exits
    # how long the broker lets the worker's transaction stay open before it aborts it and fences the
    # producer: a new owner waits at most this long for a stalled worker's open transaction (as Kafka
    # Streams' exactly_once_v2, whose default this is)
    transaction_timeout: float = 10.0
    stuck_after: float = (
        60.0  # seconds without progress after which /healthz and /readyz report a partition stuck
    )
    # seconds between two readings of the topics' configs while the worker runs: one it refuses to start
    # on (a changelog's retention lowered under it) is reported (pipeline/worker/topic_watch.py)
    topic_check_interval: float = 300.0

    def __post_init__(self) -> None:
        problems = []
        if not self.bootstrap.strip():
            problems.append("bootstrap servers are empty")
        if self.group != self.group.strip():
            problems.append(f"the consumer group {self.group!r} has leading or trailing spaces")
        if not 0 < self.commit_interval <= 60:
            problems.append(f"commit interval must be in (0, 60] seconds, got {self.commit_interval}")
        if not 0 <= self.commit_linger <= 60:  # beyond the commit interval, the interval decides
            problems.append(f"commit linger must be in [0, 60] seconds, got {self.commit_linger}")
        if self.max_batch < 1:
            problems.append(f"max batch must be at least 1, got {self.max_batch}")
        if self.commit_policy not in COMMIT_POLICIES:
            problems.append(
                f"commit policy must be one of {', '.join(COMMIT_POLICIES)}, got {self.commit_policy!r}"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            problems.append(f"metrics port must be in [0, 65535], got {self.metrics_port}")
        if not self.http_host.strip():
            problems.append("the HTTP listen host is empty")
        if not 1_000 <= self.session_timeout_ms <= 300_000:
            problems.append(f"session timeout must be in [1000, 300000] ms, got {self.session_timeout_ms}")
        problems += self._operational_problems()
        if problems:
            raise ConfigError("; ".join(problems))

    @property
    def fetch_records(self) -> int:
        """Records fetched at once and queued per partition before it is paused: ``poll_records``,
        but never more than a transaction's ``max_batch``."""
        return min(self.poll_records, self.max_batch)

    def for_topology(self, app: str) -> WorkerSettings:
        """These settings with the group defaulted to the topology's app name, so topologies never share one."""
        return self if self.group else replace(self, group=app)

    def _operational_problems(self) -> list[str]:
        problems = []
        if not 1 <= self.chunk_records <= 100_000:
            problems.append(f"chunk records must be in [1, 100000], got {self.chunk_records}")
        if not 1 <= self.poll_records <= 100_000:
            problems.append(f"poll records must be in [1, 100000], got {self.poll_records}")
        if not 1024 <= self.send_bytes <= 64 * MIB:
            problems.append(f"send bytes must be in [1 KiB, 64 MiB], got {self.send_bytes}")
        if not 0 <= self.linger_ms <= 1000:
            problems.append(f"linger must be in [0, 1000] ms, got {self.linger_ms}")
        for name in (
            "fetch_max_bytes",
            "max_partition_fetch_bytes",
            "restore_fetch_bytes",
            "restore_budget_bytes",
            "queue_bytes",
        ):
            value = getattr(self, name)
            if not 64 * 1024 <= value <= 1024 * MIB:
                problems.append(f"{name.replace('_', ' ')} must be in [64 KiB, 1 GiB], got {value}")
        if not 0 <= self.standby_replicas <= MAX_STANDBY_REPLICAS:
            problems.append(
                f"standby replicas must be in [0, {MAX_STANDBY_REPLICAS}], got {self.standby_replicas}"
            )
        if not 1 <= self.max_clock_skew <= 30 * 86_400:
            problems.append(f"max clock skew must be in [1, 2592000] seconds, got {self.max_clock_skew}")
        if not 1 <= self.transaction_timeout <= 900:
            problems.append(
                f"transaction timeout must be in [1, 900] seconds, got {self.transaction_timeout}"
            )
        if self.transaction_timeout <= self.commit_interval:
            problems.append(
                f"transaction timeout ({self.transaction_timeout:g}s) must be longer than the commit interval"
                f" ({self.commit_interval:g}s)"
            )
        for name in (
            "store_lock_wait",
            "open_timeout",
            "stuck_after",
            "restore_progress_every",
            "topic_check_interval",
        ):
            value = getattr(self, name)
            if not 0 < value <= 86_400:
                problems.append(f"{name.replace('_', ' ')} must be in (0, 86400] seconds, got {value}")
        return problems


WORKER_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(WorkerSettings) if f.default is not MISSING
}

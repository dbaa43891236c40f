"""Settings, immutable and validated at start-up: the one place every worker default lives.

Each field has a command-line flag and an environment variable (``pipeline
worker --help`` lists them); :data:`WORKER_DEFAULTS` is the single source of
the defaults both read.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How a dedupe worker runs."""

    bootstrap: str
    topology: Path
    state_dir: Path
    group: str = "webhook-dedupe"
    metrics_port: int | None = None
    commit_interval: float = 0.1  # seconds a transaction stays open at most
    max_batch: int = 2000  # a transaction commits once it holds this many input records
    restore_progress_every: float = 5.0  # seconds between restore progress lines
    session_timeout_ms: int = 10_000  # how long a silent (crashed, stopped) worker keeps its partitions
    instance_id: str | None = (
        None  # static group membership: a restart with the same id gets its partitions back
    )
    # -- the constants that matter in operation ----------------------------------------------
    chunk_records: int = 250  # records handled between two yields to the event loop
    send_bytes: int = 128 * 1024  # a producer batch this big is sent before the commit
    linger_ms: int = 5  # the transactional producers' linger
    fetch_max_bytes: int = 16 * MIB  # the worker consumer's fetch size, all partitions
    max_partition_fetch_bytes: int = 4 * MIB  # ... and per partition
    restore_fetch_bytes: int = 32 * MIB  # the restore consumer's fetch size
    store_lock_wait: float = 30.0  # seconds to wait for a previous owner's RocksDB lock
    open_timeout: float = 120.0  # seconds a partition may keep failing to open before the worker exits
    stuck_after: float = 60.0  # seconds without progress after which /healthz reports a partition stuck

    def __post_init__(self) -> None:
        problems = []
        if not self.bootstrap.strip():
            problems.append("bootstrap servers are empty")
        if not self.group.strip():
            problems.append("the consumer group is empty")
        if not 0 < self.commit_interval <= 60:
            problems.append(f"commit interval must be in (0, 60] seconds, got {self.commit_interval}")
        if self.max_batch < 1:
            problems.append(f"max batch must be at least 1, got {self.max_batch}")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            problems.append(f"metrics port must be in [0, 65535], got {self.metrics_port}")
        if not 1_000 <= self.session_timeout_ms <= 300_000:
            problems.append(f"session timeout must be in [1000, 300000] ms, got {self.session_timeout_ms}")
        problems += self._operational_problems()
        if problems:
            raise ConfigError("; ".join(problems))

    def _operational_problems(self) -> list[str]:
        problems = []
        if not 1 <= self.chunk_records <= 100_000:
            problems.append(f"chunk records must be in [1, 100000], got {self.chunk_records}")
        if not 1024 <= self.send_bytes <= 64 * MIB:
            problems.append(f"send bytes must be in [1 KiB, 64 MiB], got {self.send_bytes}")
        if not 0 <= self.linger_ms <= 1000:
            problems.append(f"linger must be in [0, 1000] ms, got {self.linger_ms}")
        for name in ("fetch_max_bytes", "max_partition_fetch_bytes", "restore_fetch_bytes"):
            value = getattr(self, name)
            if not 64 * 1024 <= value <= 1024 * MIB:
                problems.append(f"{name.replace('_', ' ')} must be in [64 KiB, 1 GiB], got {value}")
        for name in ("store_lock_wait", "open_timeout", "stuck_after", "restore_progress_every"):
            value = getattr(self, name)
            if not 0 < value <= 86_400:
                problems.append(f"{name.replace('_', ' ')} must be in (0, 86400] seconds, got {value}")
        return problems


WORKER_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(WorkerSettings) if f.name not in {"bootstrap", "topology", "state_dir"}
}

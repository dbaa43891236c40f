"""Settings, immutable and validated at start-up."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import ConfigError


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
        if problems:
            raise ConfigError("; ".join(problems))

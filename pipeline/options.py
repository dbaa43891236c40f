"""The flag tables: each settings field's command-line flag, environment variable and help.

Each field of :class:`~pipeline.worker.settings.WorkerSettings` and of the ingress's
:class:`~pipeline.ingress.server.IngressSettings` has one flag and one variable, named in
:data:`WORKER_OPTIONS` and :data:`INGRESS_OPTIONS`; :mod:`pipeline.cli.settings` turns them
into ``argparse`` arguments and back into settings, and the worker's supervisor into a
child's command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.kafka.settings import DEFAULT_BOOTSTRAP
from pipeline.topology import DEFAULT_TOPOLOGY
from pipeline.worker.settings import DEFAULT_STATE_DIR


@dataclass(frozen=True, slots=True)
class Option:
    """How one settings field is set from outside: its flag, its environment variable and its help."""

    field: str
    flag: str
    env: str
    help: str
    ms: bool = False  # the flag and the variable take milliseconds; the field holds seconds
    default: Any = None  # only for a field the settings class requires (a dataclass default wins)

    @property
    def dest(self) -> str:
        """The attribute of the parsed arguments that holds the flag's value."""
        return self.flag.removeprefix("--").replace("-", "_")

    def to_flag(self, value: Any) -> Any:
        """A field value in the flag's unit (milliseconds, or the text of a path)."""
        if self.ms and value is not None:
            return round(value * 1000)
        return str(value) if isinstance(value, Path) else value

    def to_field(self, value: Any) -> Any:
        """A flag value in the field's unit (a path stays text: the settings class's type says)."""
        return value / 1000 if self.ms and value is not None else value


def _option(prefix: str, field: str, help: str, *, ms: bool = False, **names: Any) -> Option:  # noqa: A002
    flag = names.pop("flag", "--" + field.replace("_", "-") + ("-ms" if ms else ""))
    env = names.pop("env", prefix + flag.removeprefix("--").replace("-", "_").upper())
    return Option(field, flag, env, help, ms=ms, **names)


def _worker(field: str, help: str, **kwargs: Any) -> Option:  # noqa: A002
    return _option("PIPELINE_", field, help, **kwargs)


def _ingress(field: str, help: str, **kwargs: Any) -> Option:  # noqa: A002
    return _option("PIPELINE_INGRESS_", field, help, **kwargs)


_BOOTSTRAP = _worker(
    "bootstrap", "Kafka bootstrap servers", env="KAFKA_BOOTSTRAP_SERVERS", default=DEFAULT_BOOTSTRAP
)
_TOPOLOGY = _worker("topology", "topology file", default=DEFAULT_TOPOLOGY)

WORKER_OPTIONS: tuple[Option, ...] = (
    _BOOTSTRAP,
    _TOPOLOGY,
    _worker("state_dir", "where the RocksDB stores live", default=DEFAULT_STATE_DIR),
    _worker(
        "group", "consumer group, also part of every transactional id (default: the topology's app name)"
    ),
    _worker("metrics_port", "serve /metrics, /healthz, /readyz and the key lookups on this port, or none"),
    _worker("http_host", "the address the metrics port listens on (0.0.0.0 in a container)"),
    _worker("commit_interval", "longest a transaction stays open", ms=True),
    _worker("max_batch", "input records after which a transaction commits"),
    _worker(
        "commit_policy",
        "caught-up: commit as soon as every partition in the transaction reached the end of its log "
        "(low latency); interval: only every commit interval or max batch (fewer, larger transactions)",
    ),
    _worker(
        "commit_linger",
        "seconds a caught-up transaction waits for more records before it commits (fewer transactions "
        "at a steady low rate, at most this much more latency)",
    ),
    _worker("restore_progress_every", "seconds between two restore progress lines"),
    _worker("session_timeout_ms", "how long a silent (crashed, stopped) worker keeps its partitions"),
    _worker(
        "instance_id",
        "static group membership (e.g. the pod name): a restarted worker gets its partitions back "
        "without a rebalance; a removed one keeps them until the session times out",
    ),
    _worker("chunk_records", "records handled between two yields to the event loop"),
    _worker(
        "poll_records",
        "records fetched at once; a partition with this many queued is paused (at most --max-batch)",
    ),
    _worker("send_bytes", "a producer batch this big is sent before the commit"),
    _worker("linger_ms", "the transactional producers' linger"),
    _worker("fetch_max_bytes", "the worker consumer's fetch size, all partitions together"),
    _worker("max_partition_fetch_bytes", "the worker consumer's fetch size per partition"),
    _worker(
        "check_crcs",
        "check every fetched batch's CRC32C in the worker (the broker checks it on produce; "
        "its cost: bench/crc_cost.py)",
    ),
    _worker(
        "standby_replicas",
        "warm copies of each partition on other workers, tailing its changelog, so that a failover "
        "replays seconds instead of the whole store (the group's leader decides: set it alike everywhere)",
    ),
    _worker("restore_fetch_bytes", "the restore consumer's fetch size"),
    _worker("restore_budget_bytes", "bytes all restores may fetch at once (each holds its fetch size)"),
    _worker("queue_bytes", "a partition with this many bytes queued is paused, as with --poll-records"),
    _worker(
        "max_clock_skew",
        "seconds a record may be dated ahead of this clock: a later one is decided at that bound "
        "and moves stream time no further",
    ),
    _worker("store_lock_wait", "seconds to wait for a previous owner's RocksDB lock"),
    _worker("open_timeout", "seconds a partition may keep failing to open before the worker exits"),
    _worker(
        "transaction_timeout",
        "seconds the broker lets the worker's transaction stay open before it aborts it (a stalled worker's)",
    ),
    _worker(
        "stuck_after", "seconds without progress after which /healthz and /readyz report a partition stuck"
    ),
    _worker(
        "topic_check_interval",
        "seconds between two checks, while the worker runs, of the topic configs it refuses to start on "
        "(a changelog's retention lowered under it): /healthz warns and pipeline_topic_config_refused is 1",
    ),
)
"""Every :class:`WorkerSettings` field's flag and variable (``pipeline worker``)."""

INGRESS_OPTIONS: tuple[Option, ...] = (
    _BOOTSTRAP,
    _TOPOLOGY,
    _ingress("host", "listen on this address"),
    _ingress("port", "listen on this port"),
    _ingress("max_body_bytes", "larger bodies get 413"),
    _ingress("produce_timeout", "seconds to wait for the broker's ack before answering 503"),
    _ingress("trust_forwarded", "use X-Forwarded-Proto/-Host for signed URLs (only behind your proxy)"),
    _ingress("shutdown_timeout", "seconds in-flight requests get to finish on stop"),
    _ingress("start_timeout", "seconds to reach the broker at start"),
    _ingress("retry_after", "seconds in the Retry-After of a 503"),
    _ingress("event_loop", "auto (uvloop when installed, else asyncio's), uvloop or asyncio"),
)
"""Every ``IngressSettings`` field's flag and variable (``pipeline ingress``)."""

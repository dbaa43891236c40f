"""The topic configs a worker refuses to start on: those under which the broker loses records it relies on.

- **An audit or DLQ topic compacted.** A keyless input record's audit and DLQ records have no key,
  which a compacted topic refuses, and compaction would drop DLQ records before their replay.
- **A changelog deleted sooner than its claims live.** The broker deletes a changelog record
  ``retention.ms`` after it was written; a claim lives for its TTL in stream time, so the changelog
  must keep records at least the largest TTL plus the margin (:attr:`Topology.changelog_retention`,
  what ``pipeline topics create`` sets). Shorter (a TTL raised in the topology without running
  ``pipeline topics create``, a changelog made by hand with the broker's default of 7 days), the
  broker deletes claims still live, and a store rebuilt from the changelog (a failover's restore, a
  new standby, a lost state dir) takes their next copies for first: a second command.
- **A changelog deleted by size** (``retention.bytes`` other than -1): the broker deletes a partition's
  oldest records once it holds that many bytes, live claims or not; the same second commands.

A changelog that is only compacted (no ``delete`` in ``cleanup.policy``) deletes nothing by time or size
and is taken as it is. A longer ``retention.ms`` (or -1) is always fine: operators raise it to cover an
outage (docs/operations.md, "Expiry and disk").
"""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.errors import ConfigError
from pipeline.topology import Topology

FOREVER = -1  # retention.ms / retention.bytes: never deleted by time / by size


def refused_configs(topology: Topology, configs: Mapping[str, Mapping[str, str]]) -> ConfigError | None:
    """The first topic config of ``configs`` (by topic, as the broker describes them) the worker must not
    start on, as the error to raise; ``None`` when there is none. A config not described is not judged."""
    topics = topology.topics
    for name in (topics.audit, topics.dlq):
        policy = configs.get(name, {}).get("cleanup.policy", "")
        if "compact" in policy:
            return ConfigError(
                f"topic {name} has cleanup.policy={policy}: the worker writes the audit and DLQ records of a "
                "keyless input record without a key, which a compacted topic refuses (and compaction would "
                "drop DLQ records before their replay); set it to delete (`pipeline topics create` does)"
            )
    changelogs = [topics.changelog] + ([topics.effects_changelog] if topology.has_effects else [])
    for name in changelogs:
        problem = _changelog_problem(topology, name, configs.get(name, {}))
        if problem is not None:
            return problem
    return None


def _changelog_problem(topology: Topology, name: str, config: Mapping[str, str]) -> ConfigError | None:
    if "delete" not in config.get("cleanup.policy", "delete"):  # the broker's default policy deletes
        return None
    needed_ms = int(topology.changelog_retention.total_seconds() * 1000)
    retention_ms = _number(config.get("retention.ms"))
    if retention_ms is not None and retention_ms != FOREVER and retention_ms < needed_ms:
        return ConfigError(
            f"changelog {name} has retention.ms={retention_ms} ({_hours(retention_ms)}), shorter than the "
            f"largest TTL plus a day ({_hours(needed_ms)}): the broker would delete claims still live, and a "
            "store rebuilt from the changelog would take their next copies for first (a second command); run "
            "`pipeline topics create` (it sets retention.ms), or raise it by hand"
        )
    retention_bytes = _number(config.get("retention.bytes"))
    if retention_bytes is not None and retention_bytes != FOREVER:
        return ConfigError(
            f"changelog {name} has retention.bytes={retention_bytes}: the broker deletes a partition's oldest "
            "claims once it holds that many bytes, live or not, and a store rebuilt from the changelog would "
            "take their next copies for first (a second command); set it to -1 (`pipeline topics create` does)"
        )
    return None


def _number(raw: str | None) -> int | None:
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None


def _hours(ms: int) -> str:
    """``ms`` for a reader: days from two days up, hours from one, else seconds."""
    hours = ms / 3_600_000
    if hours >= 48:
        return f"{hours / 24:g} days"
    return f"{hours:g} h" if hours >= 1 else f"{ms / 1000:g} s"

"""The simulation's fault mixes: what a seed's scenario is weighted toward.

A seed is run under a mix (``python -m tests.simulation.run --mix NAME``). Every mix draws
the same kinds of scenario; a directed mix draws one area's faults and workloads far more
often, so that a bug of that area is found by many seeds rather than by one in hundreds:

- ``default``: everything, the areas below each in a share of the seeds;
- ``poison``: poison and fixable records, refused outputs, small topic limits, redrives; in 60%
  of the seeds records the handler fails on (always, or until a redrive's fix), the only mix
  with them: added to another mix, they would change the scenarios of the seeds that found
  holes (``FOUND`` in test_simulation.py, the defects' seeds), which must replay as they were;
- ``standby``: standby replicas always, promotions mid-replay, leader kills, crashes, stores
  lost or foreign, rebalances while a worker opens its partitions;
- ``time``: short TTLs (an hour, the least a topology takes) with record time running hours
  in seconds, every worker down for hours then a backlog, clock jumps on one worker, the
  changelog stamped by the broker (``LogAppendTime``), standbys; in half the seeds without copies
  at the TTL boundary the sources' expiry slides (``expiry = "sliding"``: a duplicate renews its
  key's claim); in a third of the seeds with a downtime it outlasts the changelog's retention
  with nothing delivered during it (``silent``), so stores kept from before start behind the log
  start; in half the seeds a worker fails to create its next bucket or three (RocksDB refusing a
  new column family);
- ``redrive``: records a fix makes valid (a source added, a topic's limit raised), ``dlq
  replay`` runs (the real code, as a process in the world) before and after the fix, two at
  once, killed or cut off by broker outages, of records older than the TTL; in half the seeds Kafka
  refuses one produce request of a replay (``refuse-replay``); in half, one or two consoles
  redrive beside a replay run after the fix (the real ``pipeline/console`` code), half of those
  with the broker going away as the first reads the DLQ;
- ``rescale``: ``pipeline rescale`` under load in every seed (with fewer than four partitions),
  and topic configuration changes; in half the seeds the broker goes away as the rescale begins
  to read, and in half the changelogs take batches of at most 512 bytes (``CHANGELOG_LIMIT``: the
  move must batch by the changelog's own limit, not the producer's 16 KiB default); in the
  suite since 2026-12-07 (left out while rule 2 of the TTL windows had a rescale exception,
  gone since a rescale moves entries without their ``last_seen``: defect 17);
- ``static``: the workers are static members (``--instance-id``, as a StatefulSet runs them: a
  restart takes its partitions back, a stopped worker leaves no group until its session ends),
  and in 60% of the seeds a second process runs for a while under a running worker's instance
  id (a ``twin``: the group takes it in the first one's place, and the one pushed out must stop
  with ``InstanceIdTakenError``);
- ``retention``: the time scenario with a downtime in every seed, always silent and longer than the
  changelog's retention, standbys always: the stores kept from before start behind their
  changelog's log start (the replay kind), which the time mix reaches in few seeds;
- ``classic``: the scenarios as drawn before these areas existed (the seeds that found holes
  before them replay under it).

What a mix adds to the classic draw is drawn from generators of its own, so the classic part
of a seed's scenario is the same under every mix that does not reweight it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tests.simulation.faults import KINDS


@dataclass(frozen=True)
class Mix:
    """How one mix weights a seed's scenario."""

    name: str
    time: float = 0.0  # chance of the time scenario (tests/simulation/timeline.py)
    redrive: float = 0.0  # chance of fixable records and dlq replay runs (tests/simulation/operators.py)
    rescale: float = 0.0  # chance of a pipeline rescale under load
    reconfigure: float = 0.0  # chance of topic configuration changes under load
    poison_per_key: float = 0.0  # poison records per key on top of the classic draw
    kinds: Mapping[str, float] = field(default_factory=dict)  # fault kinds' weights (empty: uniform)
    small_limits: float | None = None  # chance of 4 KiB output topics (None: the classic draw)
    standbys_at_least: int = 0
    standby_faults_at_least: int = 0
    revoke_open: float = (
        0.0  # chance of a rebalance while a worker opens its partitions (faults.REVOKE_MID_OPEN)
    )
    handler: float = 0.0  # chance of records the handler fails on (tests/simulation/handlers.py)
    static: float = 0.0  # chance that the workers are static members (--instance-id, KIP-345)
    twin: float = 0.0  # with static members, chance of a second process under a running worker's instance id
    corrupt: float = 0.0  # chance of one-off CORRUPT_MESSAGE refusals (faults.CORRUPT)
    sliding: float = 0.0  # chance that the sources' expiry slides (every copy renews its key's claim)
    lost_commit: float = 0.0  # chance of a commit that took answered "fenced" (faults.LOST_COMMIT)
    silent: float = 0.0  # with a downtime, chance that it is silent and outlasts the changelog's retention
    bucket_fails: float = 0.0  # chance of a worker's next bucket creations failing (``disk``, ``create``)
    refuse_replay: float = 0.0  # with redrives, chance that Kafka refuses one produce request of a replay
    downtime: float = 0.0  # with the time scenario, chance of a downtime when its own draw gave none
    rescale_outage: float = 0.0  # with a rescale, chance that the broker goes away as it begins to read
    small_changelogs: float = 0.0  # with a rescale, chance of changelogs with a 512-byte max.message.bytes
    console: float = (
        0.0  # with redrives, chance of console redrives beside a replay run (tests/simulation/console.py)
    )


MIXES: dict[str, Mix] = {
    mix.name: mix
    for mix in (
        Mix("classic"),
        Mix(
            "default",
            time=0.3,
            redrive=0.2,
            rescale=0.08,
            reconfigure=0.15,
            revoke_open=0.15,
            lost_commit=0.15,
        ),
        Mix(
            "poison",
            redrive=0.5,
            reconfigure=0.2,
            poison_per_key=0.25,
            handler=0.6,
            corrupt=0.6,
            kinds={**dict.fromkeys(KINDS, 1.0), "refuse-outputs": 6.0, "disk": 2.0},
            small_limits=0.5,
        ),
        Mix(
            "standby",
            time=0.3,
            kinds={
                **dict.fromkeys(KINDS, 0.5),
                "crash": 3.0,
                "leave": 2.0,
                "join": 2.0,
                "foreign-store": 2.0,
                "pause": 1.5,
            },
            standbys_at_least=1,
            standby_faults_at_least=1,
            revoke_open=0.5,
        ),
        Mix(
            "time",
            time=1.0,
            redrive=0.2,
            reconfigure=0.3,
            kinds={**dict.fromkeys(KINDS, 1.0), "crash": 2.0, "foreign-store": 2.0, "refuse-outputs": 0.3},
            standbys_at_least=0,
            sliding=0.5,
            silent=0.35,
            bucket_fails=0.5,
        ),
        Mix("redrive", time=0.6, redrive=1.0, rescale=0.1, reconfigure=0.2, refuse_replay=0.5, console=0.5),
        Mix(
            "rescale",
            time=0.7,
            rescale=1.0,
            reconfigure=0.5,
            rescale_outage=0.5,
            small_changelogs=0.5,
        ),
        Mix(
            "retention",
            time=1.0,
            downtime=1.0,
            silent=1.0,
            reconfigure=0.3,
            kinds={**dict.fromkeys(KINDS, 1.0), "crash": 2.0, "leave": 2.0, "foreign-store": 2.0},
            standbys_at_least=1,
        ),
        Mix(
            "static",
            time=0.2,
            static=1.0,
            twin=0.6,
            kinds={**dict.fromkeys(KINDS, 1.0), "crash": 2.0, "pause": 2.0, "leave": 2.0},
        ),
    )
}

#: The share of each mix in a run of many seeds (``--mix suite``, what scripts/test runs): out of 24.
SUITE: tuple[tuple[str, int], ...] = (
    ("default", 8),
    ("poison", 3),
    ("standby", 3),
    ("time", 3),
    ("redrive", 3),
    ("static", 2),
    ("retention", 1),
    ("rescale", 1),
)


def suite(seeds: int, first: int = 0) -> list[tuple[str, int]]:
    """``seeds`` (mix, seed) pairs, each mix taking its share, the seeds of each counting from ``first``."""
    total = sum(share for _, share in SUITE)
    counts = [seeds * share // total for _, share in SUITE]
    counts[0] += seeds - sum(counts)
    return [(name, first + n) for (name, _), count in zip(SUITE, counts, strict=True) for n in range(count)]


def parse_runs(text: str, mix: str) -> list[tuple[str, int]]:
    """``--list``: comma-separated seeds, each ``seed`` (under ``mix``) or ``mix:seed``."""
    runs = []
    for item in text.split(","):
        name, _, seed = item.strip().rpartition(":")
        name = name or mix
        if name not in MIXES:
            raise ValueError(f"no mix {name!r} (the mixes: {', '.join(MIXES)})")
        runs.append((name, int(seed)))
    return runs

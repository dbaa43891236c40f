"""One seed's scenario, drawn from the seed under a mix: topology, workers, settings, workload, faults, and
what the mixes add (time, redrives, a rescale, topic configuration changes under load)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from random import Random
from typing import Any

from pipeline.topology import CHANGELOG_MARGIN
from tests.simulation import faults as fault_module
from tests.simulation import handlers, timeline
from tests.simulation import redrive as redrive_module
from tests.simulation.faults import RECONFIGURE, RESCALE, REVOKE_MID_OPEN, Fault
from tests.simulation.mixes import MIXES, Mix
from tests.simulation.redrive import FIXED_SOURCE, RedrivePlan
from tests.simulation.timeline import TimePlan
from tests.simulation.workload import Workload, more_poison
from tests.simulation.workload import draw as draw_workload

APP, GROUP = "sim", "sim"
RECONFIGURATIONS = ("log-append-time", "create-time", "limits-up", "limits-down")
# A changelog's max.message.bytes in the rescale mix's small-changelog seeds: above any one changelog
# record, below what a rescale moves of a partition in most seeds (defect 18: a move batched at 16 KiB)
CHANGELOG_LIMIT = 512


def _apart(seed: int, area: int) -> Random:
    """A generator of its own for one area a mix adds, so that no area's draws move another's."""
    return Random(seed * 1_000_003 + area)


@dataclass
class Scenario:
    seed: int
    partitions: int
    workers: int
    effects: bool
    flavor: str  # "3.x": no timestamp limits; "4.x": outputs refuse records more than 1 h ahead
    settings: dict[str, Any]
    workload: Workload
    faults: list[Fault]
    small_limits: bool = False  # output topics made by hand with 4 KiB max.message.bytes
    older: frozenset[str] = frozenset()  # slots running a worker from before standbys (roundrobin assignor)
    mix: str = "classic"
    time: TimePlan | None = None
    redrive: RedrivePlan | None = None
    changes: list[Fault] = field(default_factory=list)  # rescales and reconfigurations (in ``faults`` too)
    static: bool = False  # the workers run with --instance-id (their slot's name): static members
    sliding: bool = False  # the sources' expiry slides: each copy renews its key's claim
    small_changelogs: bool = False  # the changelogs made with CHANGELOG_LIMIT max.message.bytes

    @classmethod
    def draw(cls, seed: int, mix_name: str = "classic") -> Scenario:
        mix = MIXES[mix_name]
        rng = Random(seed)
        partitions = rng.choice((1, 2, 3, 4))
        workers = rng.choice((1, 2, 2, 3))
        effects = rng.random() < 0.4
        flavor = rng.choice(("3.x", "4.x"))
        session_ms = rng.choice((3000, 6000, 10000))
        settings = {
            "session_timeout_ms": session_ms,
            "commit_interval": rng.choice((0.05, 0.3, 1.0)),
            "max_batch": rng.choice((2, 7, 50, 10_000)),
            "commit_policy": rng.choice(("caught-up", "interval")),
            "poll_records": rng.choice((3, 40, 2000)),
            "chunk_records": rng.choice((1, 4, 250)),
            "linger_ms": rng.choice((0, 5)),
        }
        workload = draw_workload(
            Random(rng.getrandbits(64)), partitions=partitions, effects=effects, seed=seed
        )
        faults = fault_module.draw(
            Random(rng.getrandbits(64)),
            window=workload.duration + 5.0,
            workers=workers,
            partitions=partitions,
            session_s=session_ms / 1000,
            kinds=mix.kinds or None,
        )
        small_limits = rng.random() < (0.25 if mix.small_limits is None else mix.small_limits)
        if rng.random() < 0.2:  # partitions breaking over and over while the group moves them
            at = rng.uniform(0.5, workload.duration + 5.0)
            faults = sorted(
                [*faults, Fault(at, fault_module.STORM, 0, rng.uniform(2.0, 15.0))], key=lambda f: f.at
            )
            if not any(f.kind in ("join", "leave", "crash", "pause") for f in faults):
                kind = rng.choice(("join", "leave", "crash"))
                extra = Fault(at + rng.uniform(0.0, 5.0), kind, rng.randrange(workers), rng.uniform(1.0, 8.0))
                faults = sorted([*faults, extra], key=lambda f: f.at)
        # drawn apart, so that the draws above stay what they were for every seed
        apart = Random(seed ^ 0x57A2DB7)
        standbys: int = max(apart.choice((0, 1, 1, 2)), mix.standbys_at_least)
        settings["standby_replicas"] = standbys
        standby_faults = fault_module.draw_standby(
            apart, window=workload.duration + 5.0, workers=workers, standbys=standbys
        )
        more = _apart(seed, 9)
        while len(standby_faults) < mix.standby_faults_at_least:
            standby_faults += fault_module.draw_standby(
                more, window=workload.duration + 5.0, workers=workers, standbys=standbys
            )
        faults = sorted(faults + standby_faults, key=lambda f: f.at)
        older = frozenset({"w0"}) if workers > 1 and apart.random() < 0.2 else frozenset()
        scenario = cls(
            seed, partitions, workers, effects, flavor, settings, workload, faults, small_limits, older
        )
        scenario.mix = mix.name
        scenario._add(mix)
        return scenario

    def _add(self, mix: Mix) -> None:
        """What ``mix`` adds to the classic draw, each area from a generator of its own."""
        seed, load = self.seed, self.workload
        if mix.poison_per_key:
            rng = _apart(seed, 1)
            keys = len({d.event_key for d in load.deliveries if not d.poison})
            more_poison(rng, load, int(keys * mix.poison_per_key * rng.uniform(0.5, 1.5)))
        duration = load.duration + 5.0
        rng = _apart(seed, 2)
        if rng.random() < mix.redrive:
            self.redrive, steps = redrive_module.draw(rng, duration=duration, small_dlq=self.small_limits)
            redrive_module.add_records(rng, self.redrive, load, seed)
            self.faults = sorted(self.faults + steps, key=lambda f: f.at)
        rng = _apart(seed, 3)
        if rng.random() < mix.rescale and self.partitions < 4:
            at = rng.uniform(0.3, 0.7) * duration
            target = self.partitions + rng.choice((1, 2))
            cut = _apart(seed, 18)  # the broker going away as the rescale begins to move the changelogs
            if cut.random() < mix.rescale_outage:
                self.changes.append(Fault(at, RESCALE, target, cut.uniform(3.0, 40.0), detail="cut"))
            else:
                self.changes.append(Fault(at, RESCALE, target))
            self.small_changelogs = _apart(seed, 19).random() < mix.small_changelogs
        rng = _apart(seed, 4)
        if rng.random() < mix.reconfigure:
            for _ in range(rng.choice((1, 2))):
                self.changes.append(
                    Fault(rng.uniform(0.5, duration), RECONFIGURE, detail=rng.choice(RECONFIGURATIONS))
                )
        self.faults = sorted(self.faults + self.changes, key=lambda f: f.at)
        rng = _apart(seed, 6)
        if rng.random() < mix.revoke_open:
            at = rng.uniform(1.0, duration)
            fault = Fault(
                at, REVOKE_MID_OPEN, rng.randrange(self.workers), rng.uniform(3.0, 12.0), detail="crawl"
            )
            self.faults = sorted([*self.faults, fault], key=lambda f: f.at)
        rng = _apart(seed, 5)
        if rng.random() < mix.time:
            self.time = timeline.draw(rng, duration=load.duration, workers=self.workers)
            forced = _apart(seed, 17)
            if forced.random() < mix.downtime:
                self.time = timeline.with_downtime(self.time, forced, duration=load.duration)
            silent = _apart(seed, 14)
            # not with redrives: a DLQ record redriven after it is dated back into a claim retention deleted
            if self.time.downtime is not None and self.redrive is None and silent.random() < mix.silent:
                ttl = timedelta(hours=max(self.time.ttl_h, self.time.effect_ttl_h))
                retention = ttl + CHANGELOG_MARGIN  # the changelogs' (pipeline.topology_model)
                self.time = timeline.silence(self.time, int(retention.total_seconds() * 1000), silent)
            self.faults = timeline.apply(self.time, load, self.faults, rng)
        rng = _apart(seed, 8)
        if rng.random() < mix.static:
            self.static = True
            if rng.random() < mix.twin:
                at = rng.uniform(1.0, duration)
                twin = Fault(at, fault_module.TWIN, rng.randrange(self.workers), rng.uniform(2.0, 15.0))
                self.faults = sorted([*self.faults, twin], key=lambda f: f.at)
        rng = _apart(seed, 11)
        if rng.random() < mix.corrupt:
            corrupt = [
                Fault(
                    rng.uniform(1.0, duration),
                    fault_module.CORRUPT,
                    rng.randrange(self.partitions),
                    0.0,
                    detail=rng.choice(("", "bisecting")),  # at once, or once a worker bisects (up to 15 s)
                )
                for _ in range(rng.randint(1, 4))
            ]
            self.faults = sorted([*self.faults, *corrupt], key=lambda f: f.at)
        # not with copies at the TTL boundary: those check a fixed window to the millisecond
        boundary = self.time is not None and self.time.boundary
        self.sliding = _apart(seed, 12).random() < mix.sliding and not boundary
        rng = _apart(seed, 13)
        if rng.random() < mix.lost_commit:
            lost = Fault(rng.uniform(1.0, duration), fault_module.LOST_COMMIT, rng.randrange(self.partitions))
            self.faults = sorted([*self.faults, lost], key=lambda f: f.at)
        rng = _apart(seed, 15)
        if rng.random() < mix.bucket_fails:
            at = rng.uniform(1.0, load.duration + 5.0)  # load.duration: after a downtime too
            bucket = Fault(at, "disk", rng.randrange(self.workers), detail="create", steps=rng.randint(1, 3))
            self.faults = sorted([*self.faults, bucket], key=lambda f: f.at)
        rng = _apart(seed, 20)
        if self.redrive is not None and rng.random() < mix.console:
            after = [
                f for f in self.faults if f.kind == redrive_module.REPLAY and f.detail == "after the fix"
            ]
            at = (rng.choice(after).at if after else duration) + rng.uniform(0.0, 1.0)
            away = int(rng.uniform(3.0, 40.0)) if rng.random() < 0.5 else 0
            console = Fault(at, redrive_module.CONSOLE, rng.choice((1, 2)), steps=away)
            self.faults = sorted([*self.faults, console], key=lambda f: f.at)
        rng = _apart(seed, 16)
        if self.redrive is not None and rng.random() < mix.refuse_replay:
            replays = [f for f in self.faults if f.kind == redrive_module.REPLAY]
            at = rng.choice(replays).at if replays else rng.uniform(1.0, duration)  # as a replay starts
            refuse = Fault(at, fault_module.REFUSE_REPLAY)
            self.faults = sorted([*self.faults, refuse], key=lambda f: f.at)
        rng = _apart(seed, 7)  # after the time area, whose draws follow the deliveries
        if rng.random() < mix.handler:
            fixable = self.redrive is not None
            handlers.add_records(rng, load, seed, fixable=fixable, ahead=_apart(seed, 10))
            if self.redrive is not None:
                self.redrive = replace(self.redrive, causes=(*self.redrive.causes, redrive_module.HANDLER))

    @property
    def refusals(self) -> bool:
        """Whether outputs may be refused for their size or time, so that valid records may go to the DLQ."""
        return (
            self.small_limits
            or any(f.kind == "refuse-outputs" for f in self.faults)
            or (self.redrive is not None and redrive_module.SIZE in self.redrive.causes)
            or any(f.kind == RECONFIGURE and f.detail == "limits-down" for f in self.faults)
        )

    def describe(self) -> str:
        lines = [
            f"seed {self.seed} ({self.mix} mix): {self.workers} workers, broker {self.flavor}"
            + (", 4 KiB output topics" if self.small_limits else "")
            + (f", changelogs of {CHANGELOG_LIMIT} bytes" if self.small_changelogs else "")
            + (
                f", {', '.join(sorted(self.older))} on older code (roundrobin, no standbys)"
                if self.older
                else ""
            )
            + (", static members (--instance-id)" if self.static else "")
            + (", sliding expiry" if self.sliding else "")
            + f", settings {self.settings}",
            f"workload: {self.workload.describe()}",
            "faults: " + ("; ".join(f.describe() for f in self.faults) or "none"),
        ]
        if self.time is not None:
            lines.append(f"time: {self.time.describe()}")
        if self.redrive is not None:
            lines.append(f"redrive: {self.redrive.describe()}")
        return "\n".join(lines)

    def topology_text(self, *, fixed: bool = False) -> str:
        """The topology the workers run (``fixed``: with the source a redrive's fix adds)."""
        ttl = f"{self.time.ttl_h}h" if self.time else "7d"
        effect_ttl = f"{self.time.effect_ttl_h}h" if self.time else "30d"
        expiry = "sliding" if self.sliding else "fixed"
        text = f"""
[app]
name = "{APP}"
[topics]
input = "{APP}.raw"
commands = "{APP}.events"
audit = "{APP}.deliveries"
dlq = "{APP}.dlq"
changelog = "{APP}-seen-changelog"
partitions = {self.partitions}
[sources.stripe]
provider = "stripe"
verify = "none"
ttl = "{ttl}"
expiry = "{expiry}"
"""
        if fixed:
            text += f"""
[sources.{FIXED_SOURCE}]
provider = "stripe"
verify = "none"
ttl = "{ttl}"
expiry = "{expiry}"
"""
        if self.effects:
            text += f"""
[[routes]]
source = "stripe"
event = "checkout.session.completed"
topic = "{APP}.orders"
command = "fulfil-order"
effect_key = "data.object.payment_intent"
effect_ttl = "{effect_ttl}"
[[routes]]
source = "stripe"
event = "payment_intent.succeeded"
topic = "{APP}.orders"
command = "fulfil-order"
effect_key = "data.object.id"
effect_ttl = "{effect_ttl}"
"""
        return text

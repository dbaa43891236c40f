"""The fault mixes draw what they are for: each directed mix its area in every seed (or the share it says), the
classic mix the scenarios as before, and ``--mix suite`` each mix's share of a run."""

from __future__ import annotations

from collections import Counter

from tests.simulation import handlers, redrive, timeline
from tests.simulation.faults import LOST_COMMIT, REFUSE_REPLAY, RESCALE, REVOKE_MID_OPEN, STANDBY_KINDS, TWIN
from tests.simulation.mixes import MIXES, parse_runs, suite
from tests.simulation.scenario import Scenario

SEEDS = range(150)


def _kinds(scenario: Scenario) -> set[str]:
    return {fault.kind for fault in scenario.faults}


def test_each_directed_mix_draws_its_area_in_its_seeds() -> None:
    """time: a time plan in every seed, and downtimes, record time running ahead and clock jumps among them;
    redrive: a fix and replays in every seed; standby: standbys and a standby fault in every seed, a rebalance
    while a worker opens its partitions in about half; poison: more poison than the classic draw."""
    time = [Scenario.draw(seed, "time") for seed in SEEDS]
    assert all(s.time is not None for s in time)
    assert sum(timeline.DOWNTIME in _kinds(s) for s in time) > 30
    assert sum(s.time is not None and s.time.span_ms > 0 for s in time) > 60
    assert sum(timeline.CLOCK_JUMP in _kinds(s) for s in time) > 30
    drives = [Scenario.draw(seed, "redrive") for seed in SEEDS]
    assert all(s.redrive is not None and {redrive.FIX, redrive.REPLAY} <= _kinds(s) for s in drives)
    standby = [Scenario.draw(seed, "standby") for seed in SEEDS]
    assert all(s.settings["standby_replicas"] >= 1 and _kinds(s) & set(STANDBY_KINDS) for s in standby)
    assert 50 < sum(REVOKE_MID_OPEN in _kinds(s) for s in standby) < 100
    poison = Counter(
        d.poison is not None for seed in SEEDS for d in Scenario.draw(seed, "poison").workload.deliveries
    )
    classic = Counter(
        d.poison is not None for seed in SEEDS for d in Scenario.draw(seed, "classic").workload.deliveries
    )
    assert poison[True] > 2 * classic[True]


def test_the_classic_mix_adds_nothing_and_the_others_keep_its_draws() -> None:
    """Under the classic mix no seed has a time plan, a redrive or a rescale; a seed that draws none of the
    default mix's areas has the very scenario it has under the classic mix."""
    same = 0
    for seed in SEEDS:
        classic = Scenario.draw(seed, "classic")
        assert classic.time is None
        assert classic.redrive is None
        assert RESCALE not in _kinds(classic)
        default = Scenario.draw(seed, "default")
        if (
            default.time is None
            and default.redrive is None
            and not default.changes
            and REVOKE_MID_OPEN not in _kinds(default)
            and LOST_COMMIT not in _kinds(default)
        ):
            assert default.describe().replace("default mix", "classic mix") == classic.describe()
            same += 1
    assert same > 30


def test_a_suite_gives_each_mix_its_share() -> None:
    """500 seeds of the suite: 171 of the default mix, 62 of each directed one, 41 of the static one and 20 each of
    the retention and rescale ones, each mix's from seed 0; a list names seeds by mix."""
    runs = suite(500)
    assert len(runs) == 500
    assert Counter(mix for mix, _ in runs) == {
        "default": 171,
        "poison": 62,
        "standby": 62,
        "time": 62,
        "redrive": 62,
        "static": 41,
        "retention": 20,
        "rescale": 20,
    }
    assert ("time", 0) in runs
    assert ("time", 61) in runs
    assert ("rescale", 19) in runs
    assert parse_runs("classic:187,12", "time") == [("classic", 187), ("time", 12)]
    assert set(MIXES) == {
        "classic",
        "default",
        "poison",
        "standby",
        "time",
        "redrive",
        "rescale",
        "static",
        "retention",
    }


def test_only_the_poison_mix_has_records_the_handler_fails_on_and_a_fixable_handler_only_with_a_redrive() -> (
    None
):
    """Poison seeds: records the handler always fails on in more than half, a handler bug a redrive's fix removes
    in some, always with its fix and replays; no other mix has either (their seeds replay as they were)."""
    poison = [Scenario.draw(seed, "poison") for seed in SEEDS]
    failing = [s for s in poison if any(d.poison == handlers.REASON for d in s.workload.deliveries)]
    fixable = [s for s in poison if any(d.cause == handlers.REASON for d in s.workload.deliveries)]
    assert 70 < len(failing) < 110
    assert 20 < len(fixable) < len(failing)
    assert all(s.redrive is not None and redrive.HANDLER in s.redrive.causes for s in fixable)
    for mix in set(MIXES) - {"poison"}:
        for seed in range(40):
            assert not any(b"sim_fault" in d.value for d in Scenario.draw(seed, mix).workload.deliveries)


def test_only_the_static_mix_runs_static_members_and_twins_and_only_under_them() -> None:
    """static: every seed's workers are static members, a twin in about 60% of them; no other mix has either."""
    static = [Scenario.draw(seed, "static") for seed in SEEDS]
    assert all(s.static for s in static)
    assert 60 < sum(TWIN in _kinds(s) for s in static) < 120
    for mix in ("classic", "default", "poison", "standby", "time", "redrive", "rescale"):
        drawn = [Scenario.draw(seed, mix) for seed in SEEDS[:30]]
        assert not any(s.static or TWIN in _kinds(s) for s in drawn), mix


def test_a_silent_downtime_outlasts_the_changelog_and_delivers_nothing() -> None:
    """time: in some seeds every worker is down longer than the changelog's retention (the largest TTL plus
    a day), nothing is delivered during it, and no delivery after it is dated back behind its producer's clock."""
    silent = [s for seed in SEEDS if (s := Scenario.draw(seed, "time")).time and s.time.silent]
    assert 8 < len(silent) < 40
    for scenario in silent:
        plan = scenario.time
        assert plan is not None
        assert plan.downtime is not None
        assert not plan.boundary
        assert scenario.redrive is None
        start, end = plan.downtime.at, plan.downtime.at + plan.downtime.duration
        assert plan.downtime.duration > (max(plan.ttl_h, plan.effect_ttl_h) + 24) * 3600
        during = [d for d in scenario.workload.deliveries if start <= d.at < end]
        assert not during
        after = [d for d in scenario.workload.deliveries if d.at >= end]
        assert after
        assert all(d.timestamp_skew_ms >= 0 for d in after)


def test_the_time_mix_fails_bucket_creations_in_about_half_its_seeds() -> None:
    """time: about half the seeds arm a worker's next one to three bucket creations to fail (a ``disk``
    fault on ``create``); no other mix does."""
    armed = [
        seed
        for seed in SEEDS
        if any(f.kind == "disk" and f.detail == "create" for f in Scenario.draw(seed, "time").faults)
    ]
    assert 50 < len(armed) < 100
    assert not any(f.detail == "create" for seed in SEEDS for f in Scenario.draw(seed, "default").faults)


def test_the_redrive_mix_refuses_a_replays_produce_in_about_half_its_seeds() -> None:
    """redrive: about half the seeds have Kafka refuse one produce request of a dlq replay, armed as a replay
    run starts; no other mix does."""
    armed = [s for s in SEEDS if any(f.kind == REFUSE_REPLAY for f in Scenario.draw(s, "redrive").faults)]
    assert 50 < len(armed) < 100
    for seed in armed[:20]:
        faults = Scenario.draw(seed, "redrive").faults
        [refuse] = [f for f in faults if f.kind == REFUSE_REPLAY]
        assert any(f.kind == redrive.REPLAY and f.at == refuse.at for f in faults)
    assert not any(f.kind == REFUSE_REPLAY for seed in SEEDS for f in Scenario.draw(seed, "default").faults)

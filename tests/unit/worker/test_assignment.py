"""The leader's plan: balanced actives on the most current copies, sticky, standbys spread and never beside their active."""

from __future__ import annotations

import random
from collections import Counter

from aiokafka import TopicPartition

from pipeline.worker.assignment import CAUGHT_UP, Claim, Plan, plan

TOPIC = "raw"
SUB = frozenset({TOPIC})


def _tps(n: int) -> list[TopicPartition]:
    return [TopicPartition(TOPIC, p) for p in range(n)]


def _check_invariants(plans: dict[str, Plan], partitions: int, replicas: int) -> None:
    actives = [tp for p in plans.values() for tp in p.active]
    assert sorted(actives) == _tps(partitions)  # every partition served exactly once
    counts = [len(p.active) for p in plans.values()]
    assert max(counts) - min(counts) <= 1  # balanced
    for name, p in plans.items():
        assert not set(p.active) & set(p.standby), f"{name} holds a standby of its own active"
        assert len(set(p.standby)) == len(p.standby)
    copies = Counter(tp for p in plans.values() for tp in p.standby)
    assert all(copies[tp] == min(replicas, len(plans) - 1) for tp in _tps(partitions))


def test_a_fresh_group_is_spread_round_robin_with_one_standby_each() -> None:
    """Three members holding nothing: two partitions each, and each partition's standby on another member."""
    plans = plan(_tps(6), {m: Claim(SUB) for m in ("a", "b", "c")}, replicas=1)
    _check_invariants(plans, 6, 1)
    assert [len(p.standby) for p in plans.values()] == [2, 2, 2]


def test_the_most_current_copy_serves_the_partition() -> None:
    """Of two members holding a copy, the one further along the changelog (by more than CAUGHT_UP) gets the partition."""
    tp = TopicPartition(TOPIC, 0)
    members = {"a": Claim(SUB, {tp: 100}), "b": Claim(SUB, {tp: 100 + CAUGHT_UP + 1}), "c": Claim(SUB)}
    plans = plan([tp], members, replicas=1)
    assert plans["b"].active == [tp]
    assert plans["a"].standby == [tp]  # the warm copy keeps the standby


def test_after_the_owner_dies_its_partitions_go_to_their_standbys() -> None:
    """Each survivor holding a caught-up standby of a dead member's partition is given that partition."""
    tps = _tps(6)
    before = plan(tps, {m: Claim(SUB) for m in ("a", "b", "c")}, replicas=1)
    positions = {tp: 1000 + tp.partition for tp in tps}
    claims = {
        name: Claim(
            SUB,
            {tp: positions[tp] for tp in [*p.active, *p.standby]},
            active=frozenset(p.active),
        )
        for name, p in before.items()
    }
    dead = "a"
    lost = before[dead].active
    survivors = {name: claim for name, claim in claims.items() if name != dead}
    after = plan(tps, survivors, replicas=1)
    _check_invariants(after, 6, 1)
    for tp in lost:
        holder = next(name for name, p in before.items() if tp in p.standby)
        assert tp in after[holder].active
    for name in survivors:
        assert set(before[name].active) <= set(after[name].active)  # sticky: nothing moved needlessly


def test_the_same_claims_give_the_same_plan() -> None:
    """A stable group rejoining keeps every assignment, and any leader plans the same (deterministic)."""
    tps = _tps(5)
    first = plan(tps, {m: Claim(SUB) for m in ("a", "b")}, replicas=1)
    claims = {
        name: Claim(SUB, dict.fromkeys([*p.active, *p.standby], 7), active=frozenset(p.active))
        for name, p in first.items()
    }
    assert plan(tps, claims, replicas=1) == plan(tps, dict(reversed(list(claims.items()))), replicas=1)
    assert {n: p.active for n, p in plan(tps, claims, replicas=1).items()} == {
        n: p.active for n, p in first.items()
    }


def test_balance_wins_over_a_member_that_holds_every_copy() -> None:
    """A member holding the best copy of all partitions still serves only its share."""
    tps = _tps(4)
    members = {"a": Claim(SUB, dict.fromkeys(tps, 50)), "b": Claim(SUB)}
    plans = plan(tps, members, replicas=1)
    _check_invariants(plans, 4, 1)
    assert len(plans["a"].active) == 2


def test_an_older_member_gets_work_but_no_standbys() -> None:
    """A member without the standby protocol (older code) serves its share and is given no standby."""
    members = {"new": Claim(SUB), "old": Claim(SUB, standby_capable=False), "new2": Claim(SUB)}
    plans = plan(_tps(6), members, replicas=1)
    assert len(plans["old"].active) == 2
    assert plans["old"].standby == []
    assert Counter(tp for p in plans.values() for tp in p.standby) == Counter(_tps(6))


def test_replicas_beyond_the_other_members_are_capped() -> None:
    """Two members and two replicas asked: each partition gets the one standby another member can hold."""
    plans = plan(_tps(3), {"a": Claim(SUB), "b": Claim(SUB)}, replicas=2)
    _check_invariants(plans, 3, 2)


def test_no_replicas_gives_no_standbys() -> None:
    """With replicas 0 the plan is actives only."""
    plans = plan(_tps(4), {"a": Claim(SUB), "b": Claim(SUB)}, replicas=0)
    assert all(p.standby == [] for p in plans.values())
    _check_invariants(plans, 4, 0)


def test_a_member_gets_only_topics_it_subscribes_to() -> None:
    """Partitions of a topic a member does not subscribe to go to the others, standbys included."""
    other = TopicPartition("effects", 0)
    members = {"a": Claim(frozenset({TOPIC, "effects"})), "b": Claim(SUB)}
    plans = plan([*_tps(2), other], members, replicas=1)
    assert other in plans["a"].active
    assert other not in plans["b"].active + plans["b"].standby


def test_more_members_than_partitions_leaves_some_idle() -> None:
    """Four members, two partitions: two serve, and the standbys go to the idle ones first."""
    plans = plan(_tps(2), {m: Claim(SUB) for m in "abcd"}, replicas=1)
    _check_invariants(plans, 2, 1)
    idle = [n for n, p in plans.items() if not p.active]
    assert sorted(tp for n in idle for tp in plans[n].standby) == _tps(2)


def test_any_claims_give_a_complete_balanced_plan() -> None:
    """Over 300 random groups (positions, previous actives, older members): every invariant of a plan holds."""
    rng = random.Random(26)
    for _ in range(300):
        partitions = rng.randint(1, 12)
        names = [f"m{i}" for i in range(rng.randint(1, 5))]
        replicas = rng.randint(0, 3)
        tps = _tps(partitions)
        members = {
            name: Claim(
                SUB,
                {tp: rng.randint(-1, 50) for tp in tps if rng.random() < 0.5},
                active=frozenset(tp for tp in tps if rng.random() < 0.3),
                standby_capable=rng.random() < 0.9,
            )
            for name in names
        }
        plans = plan(tps, members, replicas=replicas)
        actives = [tp for p in plans.values() for tp in p.active]
        assert sorted(actives) == tps
        counts = [len(p.active) for p in plans.values()]
        assert max(counts) - min(counts) <= 1
        capable = [n for n in names if members[n].standby_capable]
        for name, p in plans.items():
            assert not set(p.active) & set(p.standby)
            assert len(set(p.standby)) == len(p.standby)
            assert members[name].standby_capable or not p.standby
        copies = Counter(tp for p in plans.values() for tp in p.standby)
        for tp in tps:
            owner_capable = any(tp in plans[n].active for n in capable)
            assert copies[tp] == min(replicas, len(capable) - owner_capable)


def test_a_member_that_once_held_every_partition_does_not_take_every_standby_of_one_owner() -> None:
    """A group grown one member at a time (the first held every store): whichever member dies, each of its
    partitions goes to a survivor holding its standby, because one owner's standbys are spread, not piled
    on the member with the most copies on disk."""
    tps = _tps(6)
    first = dict.fromkeys(tps, 100)  # "a" served everything before the others joined
    second = dict.fromkeys(tps[1::2], 100)  # "b" served half of it in the next generation
    grown = {"a": Claim(SUB, first), "b": Claim(SUB, second), "c": Claim(SUB)}
    before = plan(tps, grown, replicas=1)
    _check_invariants(before, 6, 1)
    for dead in ("a", "b", "c"):
        survivors = {
            name: Claim(SUB, dict.fromkeys([*p.active, *p.standby], 200), active=frozenset(p.active))
            for name, p in before.items()
            if name != dead
        }
        after = plan(tps, survivors, replicas=1)
        for tp in before[dead].active:
            holder = next(name for name, p in before.items() if tp in p.standby)
            assert tp in after[holder].active, (dead, tp, before, after)


def test_a_served_copy_a_few_records_behind_a_standby_stays_where_it_is() -> None:
    """A standby reported a commit marker ahead of the active copy: both count as current, so the partition
    stays with its owner, and the dead member's partition goes to the standby's member instead of a member
    without a copy (the failover a real three-worker group showed)."""
    tps = _tps(6)
    claims = {
        "a": Claim(SUB, {tps[1]: 50, tps[4]: 50, tps[0]: 61, tps[2]: 40}, active=frozenset({tps[1], tps[4]})),
        "c": Claim(SUB, {tps[0]: 60, tps[3]: 50, tps[4]: 50, tps[5]: 40}, active=frozenset({tps[0], tps[3]})),
    }  # "b" served 2 and 5 and died: a keeps the standby of 2, c of 5
    plans = plan(tps, claims, replicas=1)
    assert set(plans["a"].active) == {tps[1], tps[4], tps[2]}
    assert set(plans["c"].active) == {tps[0], tps[3], tps[5]}


def test_an_old_store_on_disk_within_caught_up_does_not_outrank_a_standby() -> None:
    """A member whose disk keeps an old store of the dead member's partition (from serving it in an earlier
    generation) loses it to the member holding its standby, and takes the one it holds the standby of."""
    tps = _tps(6)
    claims = {
        "a": Claim(
            SUB, {tps[0]: 1556, tps[1]: 791, tps[3]: 1487, tps[4]: -1}, active=frozenset({tps[0], tps[3]})
        ),
        "c": Claim(SUB, {tps[2]: 1508, tps[5]: 1308, tps[4]: 824}, active=frozenset({tps[2], tps[5]})),
    }  # "b" served 1 and 4 and died: a keeps the standby of 1, c of 4; a's disk has an empty store of 4
    plans = plan(tps, claims, replicas=1)
    assert set(plans["a"].active) == {tps[0], tps[3], tps[1]}
    assert set(plans["c"].active) == {tps[2], tps[5], tps[4]}


def _members(count: int) -> list[str]:
    return [f"m{i}" for i in range(count)]


def _shape(plans: dict[str, Plan]) -> dict[str, tuple[list[int], list[int]]]:
    """Each member's (active, standby) partition numbers."""
    return {
        n: ([tp.partition for tp in p.active], [tp.partition for tp in p.standby]) for n, p in plans.items()
    }


def test_a_fresh_group_is_dealt_round_robin() -> None:
    """Members holding nothing and serving nothing: partition p goes to the (p mod M)-th member, as roundrobin deals."""
    for partitions in range(1, 10):
        for count in range(1, 6):
            names = _members(count)
            plans = plan(_tps(partitions), {n: Claim(SUB) for n in names}, replicas=0)
            assert {n: p.active for n, p in plans.items()} == {
                n: [tp for tp in _tps(partitions) if tp.partition % count == i] for i, n in enumerate(names)
            }, (partitions, count)


def test_sticky_owners_keep_all_that_balance_allows() -> None:
    """Over 300 random groups with copies all current (within CAUGHT_UP): each member keeps its previous
    partitions up to its share, and no more partitions move than balance needs."""
    rng = random.Random(7)
    for _ in range(300):
        tps = _tps(rng.randint(1, 12))
        names = _members(rng.randint(1, 5))
        before = {tp: rng.choice([*names, "gone"]) for tp in tps}  # "gone" left the group
        top = 1_000_000
        current = [top, top - 1, top - CAUGHT_UP]
        members = {
            n: Claim(
                SUB,  # a previous owner holds a current copy; any other member one or none
                {tp: rng.choice(current) for tp in tps if before[tp] == n or rng.random() < 0.5},
                active=frozenset(tp for tp in tps if before[tp] == n),
            )
            for n in names
        }
        plans = plan(tps, members, replicas=rng.randint(0, 2))
        base, extra = divmod(len(tps), len(names))
        prev = {n: len(members[n].active) for n in names}
        kept = {n: len(set(plans[n].active) & members[n].active) for n in names}
        for n in names:
            assert kept[n] >= min(prev[n], base), (n, members, plans)
        most = sum(min(c, base) for c in prev.values()) + min(extra, sum(c > base for c in prev.values()))
        assert sum(kept.values()) == most, (members, plans)


def test_each_partition_goes_to_its_most_current_copy_when_that_is_balanced() -> None:
    """Over 300 random groups where one member per partition is ahead of all others by more than CAUGHT_UP and
    those members make a balanced plan: that is the plan, whoever served what before and whatever else is on disk."""
    rng = random.Random(11)
    top = 1_000_000
    for _ in range(300):
        tps = _tps(rng.randint(1, 12))
        names = _members(rng.randint(1, 5))
        dealt = rng.sample(names, len(names))
        shuffled = rng.sample(tps, len(tps))
        target = {tp: dealt[i % len(dealt)] for i, tp in enumerate(shuffled)}
        stale = [None, -1, 0, top // 2, top - CAUGHT_UP - 1]
        members = {}
        for n in names:
            positions = {tp: top for tp in tps if target[tp] == n}
            for tp in tps:
                behind = rng.choice(stale)
                if target[tp] != n and behind is not None:
                    positions[tp] = behind
            served = frozenset(tp for tp in tps if rng.random() < 0.3)
            members[n] = Claim(SUB, positions, active=served)
        plans = plan(tps, members, replicas=rng.randint(0, 2))
        assert {tp: n for n, p in plans.items() for tp in p.active} == target, (members, plans)


def test_a_copy_exactly_caught_up_behind_still_counts_as_current() -> None:
    """The sticky owner's copy CAUGHT_UP records behind the best keeps its partition; one record more and it moves."""
    tp = TopicPartition(TOPIC, 0)
    for behind, owner in ((CAUGHT_UP, "a"), (CAUGHT_UP + 1, "b")):
        members = {
            "a": Claim(SUB, {tp: 50_000 - behind}, active=frozenset({tp})),
            "b": Claim(SUB, {tp: 50_000}),
        }
        assert plan([tp], members, replicas=0)[owner].active == [tp]


def test_partitions_beyond_the_share_of_their_only_subscribers_go_to_the_least_loaded_of_them() -> None:
    """A member subscribing only to a topic without partitions takes none: the two others, each at its share of
    two, take one more each of the six, not both extra partitions on the first."""
    members = {"a": Claim(SUB), "b": Claim(SUB), "idle": Claim(frozenset({"effects"}))}
    assert _shape(plan(_tps(6), members, replicas=0)) == {
        "a": ([0, 2, 3], []),
        "b": ([1, 4, 5], []),
        "idle": ([], []),
    }


def test_a_fresh_groups_standbys_are_spread_by_owner_then_work_then_round_robin() -> None:
    """Each partition's standbys go to members keeping the fewest of its owner's, then doing the least work, never
    beyond their even share while another has room: the plans of fresh groups, partition by partition."""
    expected = {
        (2, 3, 1): {"m0": ([0], [1]), "m1": ([1], []), "m2": ([], [0])},
        (3, 3, 1): {"m0": ([0], [2]), "m1": ([1], [0]), "m2": ([2], [1])},
        (4, 3, 1): {"m0": ([0, 3], [2]), "m1": ([1], [0]), "m2": ([2], [1, 3])},
        (5, 3, 1): {"m0": ([0, 3], [2, 4]), "m1": ([1, 4], [3]), "m2": ([2], [0, 1])},
        (3, 4, 2): {"m0": ([0], [2]), "m1": ([1], [0, 2]), "m2": ([2], [1]), "m3": ([], [0, 1])},
        (5, 4, 2): {
            "m0": ([0, 4], [2, 3]),
            "m1": ([1], [0, 3, 4]),
            "m2": ([2], [0, 1]),
            "m3": ([3], [1, 2, 4]),
        },
        (9, 4, 2): {
            "m0": ([0, 4, 8], [2, 3, 5, 7]),
            "m1": ([1, 5], [0, 3, 4, 6]),
            "m2": ([2, 6], [0, 1, 5, 7, 8]),
            "m3": ([3, 7], [1, 2, 4, 6, 8]),
        },
    }
    for (partitions, count, replicas), shape in expected.items():
        plans = plan(_tps(partitions), {n: Claim(SUB) for n in _members(count)}, replicas=replicas)
        assert _shape(plans) == shape, (partitions, count, replicas)


def test_the_partitions_nobody_holds_are_still_dealt_round_robin_after_a_current_copy_took_its_own() -> None:
    """m1 holds the best copy of partition 0 (m0 one far behind): m1 serves it, and partitions 1 and 2, which
    nobody holds, are dealt as roundrobin deals them (1 to m1, 2 to m0), not both to the least loaded."""
    tp0 = TopicPartition(TOPIC, 0)
    members = {"m0": Claim(SUB, {tp0: 0}), "m1": Claim(SUB, {tp0: 3 * CAUGHT_UP})}
    assert _shape(plan(_tps(3), members, replicas=1)) == {"m0": ([2], [0, 1]), "m1": ([0, 1], [2])}


def test_partitions_left_over_go_one_at_a_time_to_the_least_loaded_subscriber_a_tie_to_the_first() -> None:
    """Nine partitions over four members (a share of two, one member three): of the five effects partitions, only
    c and d subscribe; c takes three, d is at its two of raw; of the two left, the first goes to d (less loaded,
    now tied with c at three) and the second to c, the first of the two tied."""
    effects = frozenset({"effects"})
    members = {"a": Claim(SUB), "b": Claim(SUB), "c": Claim(effects), "d": Claim(SUB | effects)}
    tasks = [*_tps(4), *(TopicPartition("effects", p) for p in range(5))]
    plans = plan(tasks, members, replicas=0)
    assert {n: [(tp.topic, tp.partition) for tp in p.active] for n, p in plans.items()} == {
        "a": [(TOPIC, 3)],
        "b": [(TOPIC, 0)],
        "c": [("effects", 0), ("effects", 1), ("effects", 2), ("effects", 4)],
        "d": [("effects", 3), (TOPIC, 1), (TOPIC, 2)],
    }

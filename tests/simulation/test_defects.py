"""The simulation can fail: each defect it was built for, put back into a copy of pipeline/, fails its seed (of its mix).

The same seeds pass on the code as it is (they are among the 500 test_simulation runs).
docs/reliability.md has the table; tests/simulation/defects.py the patches.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.simulation.defects import DEFECTS, census, main, make_copy, run_with_defect

CASES = [
    # refused outputs: abort, isolate, DLQ, refused again, forever
    (1, "classic", 0, "livelock"),
    # one record dated ahead expires the seen-set
    (2, "classic", 0, "stripe:evt_0_38: sim.raw-1@11 (s76) (time 1767225606301) was first inside the window"),
    # a store ahead of its changelog trusted
    (3, "classic", 5, "stripe:evt_5_20: sim.raw-1@8 (s32) (time 1767225605944) was duplicate"),
    # a zombie's offsets without its generation
    (4, "classic", 17, "sim.raw-0@6 (s34): 2 audit records, expected 1"),
    # a reopen racing a rebalance: the revoked tasks stay in the table, their partitions never served again
    (
        5,
        "default",
        0,
        "PartitionUnservedError('partition sim-effects-0 is assigned but not served for 120s')",
    ),
    # batches larger than the topic takes
    (6, "classic", 29, "as larger than its max.message.bytes"),
    # offsets read while a transaction holds them
    (7, "classic", 22, "sim.raw-0@3 (s3): 2 audit records, expected 1"),
    # a store restored only to the last stable offset
    (8, "classic", 6, "stripe:evt_6_8: sim.raw-0@19 (s17) (time 1767079128903) was first inside the window"),
    # a redriven record claimed only until its own timestamp plus the TTL
    (9, "redrive", 1, "acme:evt_1_a7: sim.raw-0@60 (a7.0, replayed-from) claimed until"),
    # buckets expired by the wall clock: a backlog hours old loses its claims
    (10, "time", 4, "(s54) (time 1767225970426) was first inside the window of the claim"),
    # a key still alive at its expiry time
    (11, "time", 5, "(b00) (time 1767052819126) was duplicate, but the claim"),
    # a replayed record skips the seen-set: two redrives, two commands
    (12, "redrive", 1, "(a7.1, replayed-from) (time 1767225612883) was first inside the window"),
    # a restored store takes stream time from the changelog batches' timestamps
    (13, "time", 5, "stripe:evt_5_13: sim.raw-1@2 (s22) claimed until"),
    # dlq replay ends at a silence and exits 0
    (14, "redrive", 1, "replay1 exited 0 without replaying"),
    # a rescale moves entries with their last_seen: a partition takes another's stream time
    (17, "rescale", 1, "stripe:evt_1_13: sim.raw-3@2 (s22, rerouted-from) claimed until"),
    # a rescale's move in batches its changelog refuses: the rescale never ends, no worker can start
    # (first caught by default seed 2872 alone; since the rescale mix's 512-byte changelogs, 16 of rescale 0-59)
    (18, "rescale", 13, "ConfigError('changelog sim-seen-changelog has 5 partitions but sim.raw has 3"),
    # the rescale's consumer stopped with aiokafka's stop in an outage: a CancelledError ends the rescale
    # (first caught by default seed 2269 alone; since the rescale mix cuts the broker as a rescale reads, 25 of rescale 0-59)
    (19, "rescale", 2, "ConfigError('changelog sim-seen-changelog has 3 partitions but sim.raw has 1"),
    # a command topic's limit lowered under running workers, never read again: refused transactions for every record
    # (first caught by default seed 3276 alone, as a livelock; since the reread rule, rereads.py, 13 of poison 0-39)
    (20, "poison", 1, "did not read its topics' limits again in between"),
    # a record whose handling raises is redone forever, never dead-lettered (tests/simulation/handlers.py)
    (21, "poison", 0, "livelock"),
    # a standby's rounds raise a bug it catches, logs and retries: the worker lives on (tests/simulation/world.py)
    (22, "standby", 0, "logged an unexpected error in worker.standby: standby sim.raw-3: unexpected error"),
    # standbys given but never kept: no command is wrong, every promotion is cold (tests/simulation/warmth.py)
    (23, "standby", 0, "w1.1 holds no standby of sim-effects-1, which its assignment gives it"),
    # a bisection that isolates at two records: a record whose outputs the broker takes is restamped (blame.py)
    (
        24,
        "poison",
        43,
        "sim.raw-0@48 (s21) was restamped (original timestamp 1767225609527), but the broker refused",
    ),
    # a record refused for its timestamp dead-lettered without a redo stamped now (tests/simulation/blame.py)
    (
        25,
        "poison",
        40,
        "sim.raw-1@25 (s32) went to the DLQ as unproducible, but its outputs were refused for their",
    ),
    # a worker pushed out of its group by a twin under its instance id exits with aiokafka's unreadable error
    (26, "static", 2, "w0.1 exited on its own: exit 1: KafkaError('FencedInstanceIdError()')"),
    # a standby's store opened without its identity: a restarted worker's store claims nothing (tests/simulation/world.py)
    (
        28,
        "standby",
        4,
        "w1.2 found a store it wrote without its identity: store <state>/w1/sim/sim/sim-effects-1",
    ),
    # a standby's replayed records never counted: the operator's metric says 0 (tests/simulation/warmth.py)
    (
        29,
        "standby",
        0,
        "w0's standbys replayed 41 changelog records, but pipeline_standby_records_total says 0",
    ),
    # a record alone judged on its first refusal: a one-off corrupt refusal of a DLQ record stops the partition
    (
        27,
        "poison",
        6,
        "cannot be written even to the DLQ (handler-error): the broker refused it: CorruptRecordException()",
    ),
    # a claim forgets its first copy's body: a different body under the key is a duplicate (rule 6, windows.py)
    (
        30,
        "default",
        0,
        "stripe:evt_0_65: sim.raw-0@8 (s124) was duplicate, but its body is not the body of sim.raw-0@0 (s123)",
    ),
    # sliding expiry ignored: a duplicate never renews its key's claim (rule 7, windows.py)
    (31, "time", 0, "a copy at 1767225602347 moves it to 1767232802347"),
    # a commit that may have taken redone like an aborted one (the lost-commit fault, faults.py)
    (32, "default", 17, "sim.raw-0@2 (s35): 2 audit records, expected 1"),
    # dlq replay --dry-run sends what it says it would replay (the dry run before the last replay, operators.py)
    (33, "redrive", 0, "records (a dry run must send nothing)"),
    # a store behind its changelog's log start asks for the deleted offset for ever (a silent downtime, timeline.py)
    (34, "retention", 0, "w0.2's standby of sim-effects-3 is following at changelog offset -1"),
    # a bucket whose creation failed is deleted from a table it never entered (bucket faults, mixes.py)
    (35, "time", 28, "w1.1 exited on its own: exit 1: KeyError(490899)"),
    # stores found on disk at start claim their positions unchecked (issue 34, item 7; claims.py)
    (36, "standby", 8, "w1.2 claims sim.raw-0 at changelog offset 1070, beyond its changelog's end 74"),
    # a task released before its restore checked its store claims it (issue 34, item 7; found by claims.py)
    (37, "default", 23, "w0.4 claims sim.raw-1 at changelog offset 1002, beyond its changelog's end 2"),
    # a replay that Kafka refused a record of exits 0 (refuse-replay, and the landed check, operators.py)
    (
        38,
        "redrive",
        0,
        "replay2 exited 0 saying it replayed sim.dlq:3:2, but no record replayed from it is in Kafka",
    ),
    # a standby wipes a store past the stable end, its last commit's markers on their way (stale.py)
    (
        39,
        "standby",
        0,
        "w2.1 called its store of sim-seen-changelog-3 at changelog offset 5 stale against an end of 3",
    ),
    # the census's plausible bugs (defects.py 40-47): never in the code, each caught by a default seed
    (
        40,
        "default",
        35,
        "stripe:evt_35_3: sim.raw-1@13 (s8) (time 1766978604828) was first inside the window",
    ),
    (
        41,
        "default",
        14,
        "stripe:evt_14_19: sim.raw-0@28 (s34) (time 1767225616860) was duplicate, but no copy claimed",
    ),
    (42, "default", 0, "stripe:evt_0_6: sim.raw-0@3 (s13) claimed until 1767671838523, not one TTL"),
    (
        43,
        "default",
        18,
        "stripe:evt_18_23: sim.raw-0@55 (b4-) is a duplicate of a claim expiring at 1767226858992",
    ),
    (44, "default", 0, "not settled 900s after the schedule"),
    (
        45,
        "default",
        8,
        "stripe:evt_8_z2: sim.raw-1@36 (b2-) (time 1767102226386) was duplicate, but no copy claimed",
    ),
    (
        46,
        "default",
        7,
        "stripe:evt_7_56: sim.raw-2@58 (s115) (time 1767198071131) was first inside the window",
    ),
    (
        47,
        "default",
        10,
        "stripe:evt_10_15: sim.raw-0@4 (s26) (time 1767210811383) was first inside the window",
    ),
    # a store level with its changelog at start claims nothing (the claim rule's under-claim at start)
    (48, "standby", 0, "w2.2 found its store of sim-effects-2 at changelog offset 13 at start, inside its"),
    # the console's DLQ read takes a silence for the end: a page shows fewer records, a redrive marks the rest gone
    # (5 of redrive seeds 0-59: 4, 26, 39, 45, 57; the console redrives of tests/simulation/console.py)
    (49, "redrive", 4, "console1's page read 0 of the 6 DLQ records it chose, and said nothing"),
    # a duplicate's claim forgets its key's command: only the key report (pipeline inspect) shows it; the rule
    # that every claim names its key's command (claim_names.py) came from the expiry kind's ledger run
    (
        50,
        "default",
        0,
        "stripe:evt_0_6: its claim at sim-seen-changelog@7 names command None of topic 'sim.orders'",
    ),
    # a claim that does not count a duplicate, or a conflict: only the key report shows the counts; the rule that
    # every claim counts its window's copies (claim_counts.py) came from the expiry kind's ledger run
    (
        51,
        "default",
        0,
        "stripe:evt_0_0: its claim at sim-seen-changelog@6 (first copy at partition 0 offset 4)",
    ),
    (52, "default", 0, "counts 2 duplicates, 0 conflicts; its window's audit records say 2 and 1"),
    # a bucket width its own store cannot read back: every reopen wipes the store and replays the whole changelog,
    # no command wrong; the rule that no store is found corrupt (faults.StoreLedger) came from the expiry ledger
    (53, "default", 0, "has unreadable metadata: invalid literal for int() with base 10: b'259200000.0'"),
    # --since at a DLQ record's exact timestamp leaves that record out; no seed used --since before the operator's
    # look once a run is over (operators.look_since)
    (54, "redrive", 0, "replay5 exited 0 without replaying sim.dlq:0:2 (unknown-source)"),
    # a replay that takes every DLQ record whatever --reason says: redrive seeds 0-2 passed until a replay that
    # exits 0 was checked for records its filter leaves
    (
        55,
        "redrive",
        0,
        "replay1 replayed sim.dlq:1:0 (bad-body, stamped 1767225604826), which its filter leaves",
    ),
]


@pytest.mark.parametrize(
    ("defect", "mix", "seed", "problem"), CASES, ids=[f"defect-{d}-{m}-seed-{s}" for d, m, s, _ in CASES]
)
def test_the_defect_put_back_fails_its_seed(defect: int, mix: str, seed: int, problem: str) -> None:
    """With the fix undone in a copy of pipeline/, the recorded seed fails, and for the recorded reason."""
    result = run_with_defect(defect, ["--mix", mix, "--seed", str(seed)], timeout=300)
    assert result.returncode == 1, result.stdout[:3000] + result.stderr[-2000:]
    assert problem in result.stdout, result.stdout[:3000]


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_each_patch_still_finds_the_fix_it_undoes(defect: int, tmp_path: Path) -> None:
    """Every defect patch applies to pipeline/ as it is: a reworded fix fails here in a second, not after a run."""
    make_copy(defect, tmp_path)


def test_the_census_names_the_run_that_caught_each_defect(capsys: pytest.CaptureFixture[str]) -> None:
    """The census runs a defect against the seeds until one fails, names that run, and counts no miss."""
    assert census([2], "classic", 1, 0) == 0
    assert capsys.readouterr().out.startswith("defect 2: caught by classic:0 (1 runs, ")


def test_the_defects_command_refuses_a_defect_it_does_not_have() -> None:
    """An unknown defect number is a usage error (exit 2), not a run of nothing."""
    with pytest.raises(SystemExit) as exited:
        main(["999"])
    assert exited.value.code == 2

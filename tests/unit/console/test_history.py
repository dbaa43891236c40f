"""The redrive history as read back from its topic: runs, their records, and each DLQ record's latest mark."""

from __future__ import annotations

from pipeline import topology
from pipeline.console.history import History, Run, RunRecord, _record_value, _run_value, new_run_id

TOPO = topology.parse({"app": {"name": "shop"}, "sources": {"github": {"verify": "none"}}})


def _run(run_id: str, at_ms: int, state: str = "sent") -> Run:
    return Run(
        id=run_id,
        user="bob",
        role="redrive",
        remote="10.0.0.1",
        at_ms=at_ms,
        dlq="shop.dlq",
        input="shop.raw",
        chosen="2 selected",
        count=2,
        reasons={"bad-signature": 2},
        state=state,
        audit_starts={0: 5, 1: 9},
        dlq_starts={0: 2},
    )


def test_a_history_read_back_has_every_run_and_the_latest_state_of_each_record() -> None:
    """Values replayed in topic order (a record written again wins) rebuild the runs exactly, the
    newest run first, and mark each DLQ record by the latest run that redrove it."""
    history = History("b:1", TOPO)
    first, second = _run("20261130-100000-aaaa", 1), _run("20261130-110000-bbbb", 2)
    sent = RunRecord(first.id, 0, 3, "bad-signature", "github:d-1", state="sent", to_partition=1)
    failed = RunRecord(first.id, 0, 4, "bad-signature", "github:d-2", state="sent", to_partition=0)
    failed_again = RunRecord(
        first.id,
        0,
        4,
        "bad-signature",
        "github:d-2",
        "sent",
        0,
        outcome="invalid",
        outcome_reason="bad-signature",
        new_record=(0, 9),
    )
    resolved = RunRecord(first.id, 0, 3, "bad-signature", "github:d-1", "sent", 1, outcome="first")
    again = RunRecord(second.id, 0, 3, "bad-signature", "github:d-1", "sent", 1, outcome="duplicate")
    for value in [_run_value(first), _record_value(sent), _record_value(failed), _record_value(failed_again)]:
        history._apply(value)
    history._apply(_record_value(resolved))
    history._apply(_record_value(again))  # before its run: kept until the run comes
    history._apply(_run_value(second))
    history._apply(b"not json")
    history._apply(b'{"kind": "run"}')
    assert [r.id for r in history.newest_first()] == [second.id, first.id]
    read = history.runs[first.id]
    assert (read.audit_starts, read.dlq_starts, read.reasons) == ({0: 5, 1: 9}, {0: 2}, {"bad-signature": 2})
    assert [(r.offset, r.mark) for r in read.ordered()] == [(3, "resolved"), (4, "failed again")]
    assert read.records[(0, 4)].new_record == (0, 9)
    assert read.done
    assert read.counts == {"resolved": 1, "failed again": 1}
    latest = history.mark((0, 3))
    assert latest is not None
    assert (latest.run, latest.outcome) == (second.id, "duplicate")
    assert history.mark((1, 1)) is None


def test_a_records_mark_and_outcome_in_words() -> None:
    """Planned or sent without an outcome: redriven; first or duplicate: resolved; invalid: failed again; skipped says why."""
    record = RunRecord("r", 0, 1, "bad-body", None)
    assert (record.mark, record.outcome_text) == ("redriven", "not sent")
    record.state = "sent"
    assert record.outcome_text == "sent, waiting for the worker"
    record.outcome, record.outcome_reason = "invalid", "bad-body"
    assert (record.mark, record.outcome_text) == ("failed again", "invalid (bad-body)")
    skipped = RunRecord("r", 0, 2, "too-large", None, state="skipped", skip="truncated")
    assert (skipped.mark, skipped.outcome_text) == ("not replayable", "skipped: truncated")


def test_a_run_waits_until_each_record_it_sent_has_an_outcome() -> None:
    """A running run is never done; a sent run is done once every sent record has an outcome."""
    seen = []
    run = _run("r", 1, state="running")
    run.records[(0, 1)] = RunRecord("r", 0, 1, "x", None, state="sent", outcome="first")
    seen.append(run.done)
    run.state = "sent"
    seen.append(run.done)
    run.records[(0, 2)] = RunRecord("r", 0, 2, "x", None, state="sent")
    seen.append(run.done)
    assert seen == [False, True, False]


def test_run_ids_sort_by_time_and_differ() -> None:
    """``YYYYmmdd-HHMMSS-xxxx``: later runs sort later; two at the same second differ."""
    assert new_run_id(1_796_032_800_000).startswith("20261130-100000-")
    assert new_run_id(0) < new_run_id(1_796_032_800_000)
    assert len({new_run_id(0) for _ in range(50)}) > 1

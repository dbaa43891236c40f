"""``pipeline inspect``'s report: counts as ``/metrics`` counts them, invalid-only keys named, text never shows None."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline import topology
from pipeline.records.key_report import Delivery, DlqRecord, Report
from pipeline.records.lookup import _from_worker, key_url, summarise

ROOT = Path(__file__).resolve().parents[3]


def _topo() -> topology.Topology:
    return topology.load(ROOT / "topologies" / "default.toml")


def _audit(outcome: str, first_seen_at: int, **extra: object) -> dict[str, Any]:
    return {
        "key": "stripe:evt_1",
        "outcome": outcome,
        "partition": 1,
        "offset": 7,
        "first_seen_at": first_seen_at,
        "source": "stripe",
        "event_type": "invoice.paid",
        "expires_at": first_seen_at + 1000,
        **extra,
    }


def _report(values: list[dict[str, Any]], times: list[int]) -> Report:
    report = Report(key="stripe:evt_1", dlq_topic="webhooks.dlq")
    report.deliveries = [
        Delivery(
            outcome=str(v["outcome"]),
            timestamp=t,
            audit_partition=0,
            audit_offset=i,
            reason=v.get("reason"),
            replayed_from=v.get("replayed_from"),
        )
        for i, (v, t) in enumerate(zip(values, times, strict=True))
    ]
    summarise(report, values, _topo())
    return report


def test_audit_fallback_counts_duplicates_of_the_current_claim_only() -> None:
    """Duplicates of an expired earlier claim are not counted, and last seen is the newest copy's time."""
    values = [
        _audit("first", 100),
        _audit("duplicate", 100),
        _audit("first", 5000),
        _audit("duplicate", 5000),
    ]
    report = _report(values, [100, 150, 5000, 5200])
    assert (report.known, report.first_seen, report.duplicates, report.last_seen) == (True, 5000, 1, 5200)
    assert (report.command, report.command_topic) == ("handle", "webhooks.events")


def test_duplicates_and_conflicts_are_counted_apart_as_metrics_count_them() -> None:
    """A conflict is not a duplicate (``pipeline_events_total`` has one outcome each), from the audit and from a worker."""
    values = [
        _audit("first", 100),
        _audit("duplicate", 100),
        _audit("conflict", 100),
        _audit("duplicate", 100),
    ]
    report = _report(values, [100, 200, 300, 400])
    assert (report.duplicates, report.conflicts) == (2, 1)
    worker = Report(key="stripe:evt_1")
    entry = {"first_seen": 100, "offset": 7, "duplicates": 3, "conflicts": 1, "expires_at": 1100}
    _from_worker(
        worker, "w:1", {"topic": "t", "partition": 1, "entry": entry | {"command": "c", "topic": "x"}}
    )
    assert (worker.duplicates, worker.conflicts) == (2, 1)


def test_a_key_whose_deliveries_were_all_invalid_is_reported_as_such() -> None:
    """Invalid deliveries and DLQ records make 'not processed' with the reasons, never a bare 'known no'."""
    values = [_audit("invalid", 100, reason="bad-signature"), _audit("invalid", 100, reason="bad-signature")]
    report = _report(values, [100, 200])
    report.dlq = [DlqRecord(0, 4, 100, "bad-signature", "no signature matched")]
    assert (report.known, report.status) == (False, "not processed")
    text = "\n".join(report.lines())
    assert "known         no: 2 deliveries, none processed: 2 invalid (bad-signature 2); 1 in the DLQ" in text
    assert "dlq           webhooks.dlq:0:4 bad-signature" in text
    assert Report(key="x", where="audit topic a").status == "never seen"


def test_a_replayed_delivery_says_where_it_was_replayed_from() -> None:
    """A redriven record's delivery reads 'first, replayed from <dlq>:<p>:<o>'."""
    report = _report([_audit("first", 100, replayed_from="webhooks.dlq:0:4")], [100])
    assert report.deliveries[0].label == "first, replayed from webhooks.dlq:0:4"


def test_last_seen_is_never_before_first_seen() -> None:
    """A duplicate whose record timestamp is earlier than the first copy's shows the first copy's time."""
    report = _report([_audit("first", 5000), _audit("duplicate", 5000)], [5000, 4000])
    assert report.last_seen == 5000


def test_lines_use_iso_times_and_never_print_none() -> None:
    """Every time is ISO 8601 UTC, and a command without a known topic or a dropped event reads as words."""
    report = Report(
        key="a", known=True, where="w", topic="t", partition=0, first_seen=0, offset=3, expires_at=86_400_000
    )
    report.command = "fulfil"
    text = "\n".join(report.lines())
    assert "None" not in text
    assert "first seen    1970-01-01T00:00:00.000Z at offset 3" in text
    assert "command       fulfil\n" in text
    assert "expires       1970-01-02T00:00:00.000Z" in text
    report.dropped = True
    assert "command       none (dropped by a route)" in report.lines()


def test_key_url_quotes_the_whole_key() -> None:
    """'/', '?', '#', '%' and spaces in a key stay inside the one path segment."""
    url = key_url("127.0.0.1:9100", "src:a/b?c#d%2Fe f")
    assert str(url) == "http://127.0.0.1:9100/keys/src%3Aa%2Fb%3Fc%23d%252Fe%20f"
    assert url.raw_path.count("/") == 2

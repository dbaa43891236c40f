"""``pipeline inspect``'s report: the audit fallback counts only the current claim, and the text never shows None."""

from __future__ import annotations

from pathlib import Path

from pipeline import topology
from pipeline.ops.lookup import Report, key_url, summarise

ROOT = Path(__file__).resolve().parents[2]


def _topo() -> topology.Topology:
    return topology.load(ROOT / "topologies" / "default.toml")


def _audit(outcome: str, first_seen_at: int, **extra: object) -> dict[str, object]:
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


def test_audit_fallback_counts_duplicates_of_the_current_claim_only() -> None:
    """Duplicates of an expired earlier claim are not counted, and last seen is the newest copy's time."""
    report = Report(key="stripe:evt_1")
    deliveries = [
        _audit("first", 100),
        _audit("duplicate", 100),
        _audit("first", 5000),
        _audit("duplicate", 5000),
    ]
    report.deliveries = deliveries
    summarise(report, [100, 150, 5000, 5200], _topo())
    assert (report.known, report.first_seen, report.duplicates, report.last_seen) == (True, 5000, 1, 5200)
    assert (report.command, report.command_topic) == ("handle", "webhooks.events")


def test_last_seen_is_never_before_first_seen() -> None:
    """A duplicate whose record timestamp is earlier than the first copy's shows the first copy's time."""
    report = Report(key="stripe:evt_1", deliveries=[_audit("first", 5000), _audit("duplicate", 5000)])
    summarise(report, [5000, 4000], _topo())
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

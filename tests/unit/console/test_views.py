"""Rendering: every value escaped, secrets redacted, hex dumps and charts as plain shapes."""

from __future__ import annotations

from pathlib import Path

from pipeline import topology
from pipeline.console.charts import bars, sparkline
from pipeline.console.dlq_view import detail
from pipeline.console.views import REDACTED, Redactor, hexdump, key_path, make_environment
from pipeline.records.dlq import parse_entry

ROOT = Path(__file__).resolve().parents[3]
EVIL = "<script>alert(1)</script><img src=x onerror=alert(2)>"


def test_templates_escape_what_a_webhook_controls() -> None:
    """A key and a body holding markup come out as text: no tag survives rendering."""
    env = make_environment()
    html = env.from_string("<p>{{ key }}</p><pre>{{ body }}</pre><a href='{{ key | keypath }}'>x</a>").render(
        key=EVIL, body=f'{{"note": "{EVIL}"}}'
    )
    assert "<script>" not in html
    assert "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert key_path("a/b?c#d") == "/keys/a%2Fb%3Fc%23d"


def test_no_shipped_template_marks_anything_safe() -> None:
    """No template opts out of escaping (``|safe``, ``autoescape false``, ``Markup``)."""
    for path in (ROOT / "pipeline" / "console" / "templates").glob("*.html"):
        text = path.read_text(encoding="utf-8")
        for opt_out in ("|safe", "| safe", "autoescape false", "Markup"):
            assert opt_out not in text, f"{path.name} uses {opt_out}"


def test_secrets_and_credential_headers_are_redacted() -> None:
    """The topology's secret values vanish from text, bytes and headers; credential headers are hidden whole."""
    topo = topology.load(ROOT / "topologies" / "default.toml")
    variable = next(s.secret_env[0] for s in topo.sources.values() if s.secret_env)
    redactor = Redactor.of(topo, {variable: "whsec_topsecretvalue"})
    assert redactor.text("x whsec_topsecretvalue y") == f"x {REDACTED} y"
    assert redactor.data(b"..whsec_topsecretvalue..") == f"..{REDACTED}..".encode()
    assert redactor.header("http-authorization", "Bearer abc") == REDACTED
    assert redactor.header("http-x-api-key", "abc") == REDACTED
    assert redactor.header("http-stripe-signature", "t=1,v1=ab") == "t=1,v1=ab"
    assert Redactor(["abc"]).text("abc") == "abc"  # too short to be a secret: ordinary text stays


def test_a_dlq_record_detail_shows_headers_and_body_as_received_minus_secrets() -> None:
    """Headers come from headers_base64 in order; a body that is not UTF-8 has no text, only hex."""
    value = (
        b'{"reason": "bad-body", "key": "k", "headers_base64": [["source", "c3RyaXBl"], ["http-cookie", "YT1i"]],'
        b' "value_base64": "/wA8c2NyaXB0Pg=="}'
    )
    shown = detail(parse_entry(0, 5, 1000, b"k", value), Redactor([]))
    assert shown.headers == [("source", "stripe"), ("http-cookie", REDACTED)]
    assert shown.body_text is None
    assert shown.body_bytes == 10
    assert shown.body_hex.startswith("00000000  ff 00 3c 73 63 72 69 70 74 3e")
    assert shown.body_hex.endswith("|..<script>|")


def test_hexdump_is_sixteen_bytes_a_line_and_bounded() -> None:
    """Offsets, hex and printable text per line; past the limit a line says how much is left."""
    dump = hexdump(bytes(range(40)), limit=32)
    lines = dump.splitlines()
    assert lines[1].startswith("00000010  10 11 12")
    assert lines[-1] == "... 8 more bytes"


def test_charts_scale_to_their_box() -> None:
    """The highest value touches the top; bars share the width; nothing to draw is a flat line or no bar."""
    line = sparkline([0.0, 5.0, 10.0], width=100, height=50)
    assert line.points == "0.0,49.0 50.0,25.0 100.0,1.0"
    assert (line.latest, line.peak) == (10.0, 10.0)
    assert sparkline([]).points.endswith(",48")
    drawn = bars([("a", 1), ("b", 4)], width=100, height=41)
    assert [round(b.height) for b in drawn] == [10, 40]
    assert drawn[1].x == 51
    assert bars([]) == []

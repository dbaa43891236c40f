"""Rendering: every value escaped, secrets redacted, hex dumps and charts as plain shapes."""

from __future__ import annotations

from pathlib import Path

from pipeline import topology
from pipeline.console.charts import bars, sparkline
from pipeline.console.record_view import detail
from pipeline.console.redaction import REDACTED, Redactor, signature_headers
from pipeline.console.views import hexdump, key_path, make_environment
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
    assert redactor.header("http-stripe-signature", "t=1,v1=ab") == REDACTED
    assert redactor.header("http-x-note", "t=1,v1=ab") == "t=1,v1=ab"
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


NEW_SECRET = "gh-rotated-secret-0123456789"
CASES = [
    # (where it sits, as the console would show it)
    ('{"id": "evt_1", "signing_secret": "' + NEW_SECRET + '"}', '"signing_secret": "[redacted]"'),
    ('{"config": {"webhook": {"api_key": 1234567890}}}', '"api_key": "[redacted]"'),
    ("debug: secret=" + NEW_SECRET + " at start", "secret=[redacted] at start"),
    ("Authorization: Bearer " + NEW_SECRET, "Authorization: Bearer [redacted]"),
    ("the key is whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw.", "the key is [redacted]."),
    ("sk_live_51HxxxxxxxxxxxxxxxxxxxQ and ghp_abcdefghijklmnopqrstuvwx12", "[redacted] and [redacted]"),
]


def test_secrets_are_redacted_without_the_console_knowing_them() -> None:
    """With no secret loaded (or only last month's), a secret in a field or pair named as one, or of a
    known shape, is hidden all the same; ordinary text is left alone."""
    for redactor in (Redactor(), Redactor(["gh-old-secret-0123456789"])):
        for text, shown in CASES:
            redacted = redactor.text(text)
            assert shown in redacted, text
            assert NEW_SECRET not in redacted
            assert redactor.data(text.encode()) == redacted.encode()
        ordinary = '{"type": "invoice.paid", "note": "no signature matched: Stripe-Signature differs"}'
        assert redactor.text(ordinary) == ordinary


def test_a_loaded_secret_is_redacted_wherever_it_appears() -> None:
    """A configured secret's value is hidden in free text, where no name or shape gives it away."""
    redactor = Redactor([NEW_SECRET])
    assert redactor.text(f"x{NEW_SECRET}y") == f"x{REDACTED}y"
    assert NEW_SECRET.encode() not in redactor.data(b"%s" % NEW_SECRET.encode())


def test_every_providers_signature_headers_are_redacted_by_name() -> None:
    """Each header a preset signs with is known to the redactor, whatever the console's environment."""
    from pipeline import providers  # noqa: PLC0415

    names = signature_headers()
    redactor = Redactor([], names)
    for provider in providers.names():
        if provider == "generic":
            continue
        signed = providers.build(provider).sign(
            b"{}", "whsec_" + "QUFB" * 8, timestamp=1, msg_id="m", url="https://x.example/h"
        )
        sig = [h for h in signed if "sig" in h.lower() or "hmac" in h.lower()]
        assert sig, provider
        for header in sig:
            assert header.lower() in names, (provider, header)
            assert redactor.header(f"http-{header.lower()}", signed[header]) == REDACTED


def test_a_generic_sources_own_signature_header_is_redacted() -> None:
    """A ``generic`` source names its signature header in the topology: that one is hidden too."""
    topo = topology.parse(
        {
            "sources": {
                "acme": {
                    "provider": "generic",
                    "secrets": ["ACME"],
                    "options": {"key_header": "X-Acme-Id", "signature_header": "X-Acme-Mac"},
                }
            }
        }
    )
    assert Redactor.of(topo, {}).header("http-x-acme-mac", "abc") == REDACTED


def test_hidden_characters_are_shown_escaped_in_every_printed_value() -> None:
    """A bidi override or zero-width space in a key prints as its escape; a body keeps its line breaks."""
    env = make_environment()
    html = env.from_string("<h1>{{ key }}</h1><pre>{{ body | lines }}</pre><i>{{ body }}</i>").render(
        key="invoice\u202egnp.exe\u200b", body='{\n\t"a": "<\u2066>"\n}'
    )
    assert "<h1>invoice\\u202egnp.exe\\u200b</h1>" in html
    assert "<pre>{\n\t&#34;a&#34;: &#34;&lt;\\u2066&gt;&#34;\n}</pre>" in html
    assert "<i>{\\n\\t&#34;a&#34;" in html
    assert "\u202e" not in html

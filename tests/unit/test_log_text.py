"""Input in a log line stays on its line and reads as what it holds."""

from __future__ import annotations

import pytest

from pipeline.log_text import escape, reveal


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("stripe:evt_1", "stripe:evt_1"),
        ("k\nINFO redrive 99 by mallory", "k\\nINFO redrive 99 by mallory"),
        ("a\r\x1b[31mred", "a\\r\\x1b[31mred"),
        ("invoice\u202egnp.exe", "invoice\\u202egnp.exe"),
        ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
        ("line\u2028sep", "line\\u2028sep"),
        ("filler\u3164", "filler\\u3164"),
        ("tag\U000e0041", "tag\\U000e0041"),
        ("café 東京", "café 東京"),
    ],
)
def test_escape_writes_every_control_format_and_separator_character_as_its_escape(
    text: str, shown: str
) -> None:
    """Line breaks, terminal escapes, bidi overrides, zero-width and invisible characters come out escaped."""
    assert escape(text) == shown


def test_escape_bounds_the_text_and_takes_any_value() -> None:
    """A long value is cut with an ellipsis; None and numbers print as themselves."""
    assert escape("x" * 300, 10) == "x" * 10 + "…"
    assert escape(None) == "None"
    assert escape(17) == "17"


def test_reveal_keeps_the_line_breaks_a_body_needs() -> None:
    """For a body shown over several lines, newlines and tabs stay; a bidi override does not."""
    assert reveal('{\n\t"a": "\u202eb"\n}', keep="\n\t") == '{\n\t"a": "\\u202eb"\n}'

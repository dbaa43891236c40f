"""Input made safe to show: one log line per event, and characters that hide or reorder text made visible.

Keys, sources, header values and user names come from outside. Written into a
log line as they are, a ``\\n`` in a key forges a second line ("redrive 99 by
mallory"), and a right-to-left override or a zero-width space makes a key read
as something else (``invoice\\u202egnp.exe`` shows as ``invoiceexe.png``).
:func:`escape` writes every such character as its Python escape (``\\n``,
``\\x1b``, ``\\u202e``), so a line stays one line and reads as what it holds.
Pure: no I/O.
"""

from __future__ import annotations

import unicodedata

#: Characters that draw nothing (Hangul fillers) yet are letters, so ``isprintable`` keeps them.
_INVISIBLE_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")
#: Unicode categories shown escaped: controls, format characters (bidi controls, zero-width
#: spaces and joiners, the BOM, tags), line and paragraph separators, and unassigned code points.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def _hidden(ch: str) -> bool:
    return unicodedata.category(ch) in _HIDDEN_CATEGORIES or ch in _INVISIBLE_LETTERS


def _escaped(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, f"\\x{code:02x}")
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def reveal(text: str, *, keep: str = "") -> str:
    """``text`` with every control, format (bidi, zero-width) and separator character written as its
    escape, except those in ``keep`` (``"\\n\\t"`` for a body shown over several lines)."""
    if text.isprintable() and not _INVISIBLE_LETTERS.intersection(text):
        return text  # the usual case: nothing to escape
    return "".join(_escaped(ch) if ch not in keep and _hidden(ch) else ch for ch in text)


def escape(value: object, limit: int = 200) -> str:
    """``value`` as text for one log line: :func:`reveal`-ed (no line breaks, nothing hidden), cut to
    ``limit`` characters with ``…``."""
    text = value if isinstance(value, str) else str(value)
    cut = len(text) > limit
    shown = reveal(text[:limit] if cut else text)
    return shown + "…" if cut else shown

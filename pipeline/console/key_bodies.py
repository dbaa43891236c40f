"""The bodies the key page shows: the first delivery, any conflicting one, and the command's value.

Read from Kafka where the lookup found them (the input record at the first
copy's partition and offset, each conflicting delivery's input record, the
command record), redacted like every body the console shows
(:mod:`pipeline.console.redaction`), as text when it is UTF-8 and as hex
otherwise. A record retention has removed says so instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import orjson

from pipeline.console.record_view import body_view
from pipeline.console.redaction import Redactor
from pipeline.records.key_history import Stored, read_at
from pipeline.records.key_report import Report
from pipeline.topology import Topology

MAX_CONFLICTS = 3  # conflicting deliveries whose bodies are shown (the list counts them all)
MAX_SHOWN = 65_536  # bytes of a body shown


@dataclass(frozen=True, slots=True)
class Body:
    """One body on the key page."""

    title: str  # "First delivery", "Conflicting delivery 2", "Command"
    where: str  # topic:partition:offset
    text: str | None  # None: not UTF-8 (or gone): see hex and note
    hex: str
    size: int
    note: str  # why it is missing or cut, or ""


async def bodies(report: Report, topology: Topology, bootstrap: str, redactor: Redactor) -> list[Body]:
    """The bodies of ``report``'s key that Kafka still holds (or a note saying it does not)."""
    wanted: list[tuple[str, str, int, int, bool]] = []  # title, topic, partition, offset, is the command
    if report.known and report.topic and report.partition is not None and report.offset is not None:
        wanted.append(("First delivery", report.topic, report.partition, report.offset, False))
    conflicts = [d for d in report.deliveries if d.outcome == "conflict" and d.partition is not None]
    for number, delivery in enumerate(conflicts[:MAX_CONFLICTS], 1):
        topic = topology.topics.effects if delivery.stage == "effect" else topology.topics.input
        wanted.append(
            (f"Conflicting delivery {number}", topic, delivery.partition or 0, delivery.offset or 0, False)
        )
    command = report.command_record
    if command is not None:
        wanted.append((f"Command ({report.command})", command.topic, command.partition, command.offset, True))
    found = await asyncio.gather(*(read_at(bootstrap, t, p, o) for _, t, p, o, _ in wanted))
    return [
        _body(title, f"{t}:{p}:{o}", stored, redactor, pretty=is_command)
        for (title, t, p, o, is_command), stored in zip(wanted, found, strict=True)
    ]


def _body(title: str, where: str, stored: Stored | None, redactor: Redactor, *, pretty: bool) -> Body:
    if stored is None or stored.value is None:
        return Body(
            title, where, None, "", 0, "no longer in Kafka (removed by retention) or not readable now"
        )
    data = stored.value
    if pretty:
        with contextlib.suppress(orjson.JSONDecodeError):
            data = orjson.dumps(orjson.loads(data), option=orjson.OPT_INDENT_2)
    data = redactor.data(data)  # whole, so no secret is cut in two below
    note = f"only the first {MAX_SHOWN} of {len(data)} bytes are shown" if len(data) > MAX_SHOWN else ""
    text, dump = body_view(data[:MAX_SHOWN], Redactor())
    if text is None and note:  # cut inside a character: show the text up to it
        text = data[:MAX_SHOWN].decode("utf-8", "ignore") if _utf8(data) else None
    return Body(title, where, text, dump, len(stored.value), note)


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True

"""The DLQ's pages: the list, one record, the confirmation of a redrive, the run, and the history of runs.

A redrive is two POSTs. The first (``/dlq/redrive/confirm``) works out what
the page chose, the checked records or every record the page counted (its
filters within its snapshot), and shows the count and the reasons. The second
(``/dlq/redrive``) works it out again, runs only if it is still the same set
(its digest; else 409 and a new confirmation), and goes to the run's page.
Bad filters are a 400 with the form kept; an unknown record is a 404.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from pipeline.console import dlq_view
from pipeline.console.auth import Sessions, client_of, require_redrive
from pipeline.console.charts import bars
from pipeline.console.dlq_query import BadQueryError, DlqQuery, parse_query
from pipeline.console.dlq_read import NoSuchRecordError, read_record, read_records
from pipeline.console.dlq_view import EventTypes, Row
from pipeline.console.history import History, HistoryUnavailableError
from pipeline.console.record_view import detail
from pipeline.console.redaction import Redactor
from pipeline.console.redrive import Redrives
from pipeline.console.settings import ConsoleSettings
from pipeline.records.dlq import records_of
from pipeline.topology import Topology

log = logging.getLogger(__name__)
Page = Callable[..., web.Response]
CONFIRM_LISTED = 100  # records the confirmation lists by name (it counts them all)


class DlqPages:
    """The DLQ handlers and what they share."""

    def __init__(
        self,
        settings: ConsoleSettings,
        topology: Topology,
        *,
        page: Page,
        sessions: Sessions,
        redactor: Redactor,
        history: History,
        redrives: Redrives,
    ) -> None:
        self.settings = settings
        self.topology = topology
        self.page = page
        self.sessions = sessions
        self.redactor = redactor
        self.history = history
        self.redrives = redrives
        self.types = EventTypes(topology)

    def error(self, request: web.Request, status: int, message: str) -> web.Response:
        """A page that says, in one line, why the request failed."""
        return self.page(request, "error.html", status=status, message=message)

    async def _history_note(self) -> str:
        """Read the history; what the page should say when it cannot (the marks are then missing)."""
        try:
            await self.history.refresh()
        except HistoryUnavailableError as exc:
            return f"Redrive marks are missing: {exc}"
        return ""

    async def _load(self, query: DlqQuery) -> dlq_view.DlqPage:
        return await dlq_view.load(
            self.settings.bootstrap,
            self.topology,
            query,
            marks=self.history.mark,
            redactor=self.redactor,
            types=self.types,
            page_size=self.settings.dlq_shown,
        )

    # -- the list and one record --------------------------------------------------------------

    async def dlq(self, request: web.Request) -> web.Response:
        """``/dlq``: counts, marks and one page of the records a query takes (400 with the form kept)."""
        try:
            query = parse_query(request.query, now=datetime.now(UTC))
        except BadQueryError as exc:
            fields = {
                name: str(request.query.get(name, ""))[:200]
                for name in ("reason", "source", "key", "type", "text", "since", "until", "open")
            }
            return self.page(
                request, "dlq.html", status=400, problem=str(exc), note="", fields=fields, summary=None
            )
        note = await self._history_note()
        summary = await self._load(query)
        return self.page(
            request,
            "dlq.html",
            problem="",
            note=note,
            fields=query.fields,
            summary=summary,
            chart=bars(summary.over_time),
            redactor=self.redactor,
        )

    async def dlq_record(self, request: web.Request) -> web.Response:
        """``/dlq/P/O``: one record, its mark and its copies; 404 at once for a record that is not there."""
        dlq = self.topology.topics.dlq
        text_p, text_o = request.match_info["partition"], request.match_info["offset"]
        if not (text_p.isdigit() and text_o.isdigit() and len(text_p) <= 9 and len(text_o) <= 19):
            return self.error(
                request,
                404,
                f"no record at {dlq}:{text_p[:20]}:{text_o[:20]}: a DLQ record is /dlq/PARTITION/OFFSET",
            )
        partition, offset = int(text_p), int(text_o)
        try:
            entry = await read_record(self.settings.bootstrap, dlq, partition, offset)
        except NoSuchRecordError as exc:
            return self.error(request, 404, str(exc))
        note = await self._history_note()
        view = "hex" if request.query.get("view") == "hex" else "text"
        copy_of = dlq_view.copy_of(entry, dlq)
        return self.page(
            request,
            "dlq_record.html",
            d=detail(entry, self.redactor),
            view=view,
            mark=self.history.mark((partition, offset)),
            copy_of=copy_of,
            note=note,
        )

    # -- redrive --------------------------------------------------------------------------------

    async def _chosen(self, form: Any) -> tuple[list[Row], str, dict[str, str]]:
        """What a redrive form chose: its rows, in words, and the fields that choose it again."""
        if form.get("all") == "1":
            query = parse_query(form, now=datetime.now(UTC))
            if query.upto is None:
                raise BadQueryError("the page's snapshot (upto) is missing: open the DLQ page again")
            rows = (await self._load(query.at_page(1))).selection
            said = " ".join(f"{k}={v}" for k, v in query.params(with_upto=False).items() if k != "page")
            return rows, f"all {len(rows)} matching {said or 'no filter'}", {"all": "1", **query.params()}
        try:
            wanted = records_of([str(r) for r in form.getall("record", [])])
        except ValueError as exc:
            raise BadQueryError(str(exc)) from None
        dlq = self.topology.topics.dlq
        rows = [
            dlq_view.row_of(entry, dlq, self.types)
            async for entry in read_records(self.settings.bootstrap, dlq, wanted)
        ]
        return rows, f"{len(rows)} selected", {"record": ",".join(f"{p}:{o}" for p, o in sorted(wanted))}

    async def confirm(self, request: web.Request) -> web.Response:
        """POST ``/dlq/redrive/confirm``: the count and reasons of what would be redriven, and the button."""
        require_redrive(self.sessions.required(request))
        form = await request.post()
        try:
            rows, said, fields = await self._chosen(form)
        except BadQueryError as exc:
            return self.error(request, 400, str(exc))
        return self._confirmation(request, rows, said, fields, status=200 if rows else 400)

    def _confirmation(
        self,
        request: web.Request,
        rows: list[Row],
        said: str,
        fields: dict[str, str],
        *,
        status: int,
        changed: str = "",
    ) -> web.Response:
        marks: Counter[str] = Counter()
        for row in rows:
            record = self.history.mark(row.at)
            marks[record.mark if record is not None else "open"] += 1
        return self.page(
            request,
            "confirm.html",
            status=status,
            rows=rows[:CONFIRM_LISTED],
            count=len(rows),
            said=said,
            reasons=Counter(row.reason for row in rows),
            marks=marks,
            truncated=sum(1 for row in rows if row.truncated),
            fields=fields,
            digest=dlq_view.selection_digest(row.at for row in rows),
            changed=changed,
        )

    async def redrive(self, request: web.Request) -> web.StreamResponse:
        """POST ``/dlq/redrive``: run the confirmed redrive, if the choice is still what was confirmed."""
        user = require_redrive(self.sessions.required(request))
        form = await request.post()
        try:
            rows, said, fields = await self._chosen(form)
        except BadQueryError as exc:
            return self.error(request, 400, str(exc))
        if not rows:
            return self.error(request, 400, "no DLQ record chosen: check the records to redrive")
        if form.get("digest") != dlq_view.selection_digest(row.at for row in rows):
            changed = f"What the page chose changed since it was confirmed ({form.get('count', '?')} then, {len(rows)} now): check again."
            return self._confirmation(request, rows, said, fields, status=409, changed=changed)
        try:
            run = await self.redrives.run(rows, user, client_of(request), said)
        except HistoryUnavailableError as exc:
            return self.error(request, 503, f"nothing was redriven: {exc}")
        raise web.HTTPSeeOther(f"/redrives/{run.id}")

    async def history_page(self, request: web.Request) -> web.Response:
        """``/redrives``: every run in the history, the newest first."""
        note = await self._history_note()
        return self.page(request, "history.html", runs=self.history.newest_first(), note=note)

    async def run_page(self, request: web.Request) -> web.Response:
        """``/redrives/ID`` (and its fragment): one run, each record and what became of it."""
        run = self.history.runs.get(request.match_info["run"])
        if run is None:
            note = await self._history_note()
            run = self.history.runs.get(request.match_info["run"])
            if run is None:
                return self.error(request, 404, note or "no such redrive in the history")
        name = "_redrive.html" if request.path.startswith("/fragments/") else "redrive.html"
        return self.page(request, name, run=run)

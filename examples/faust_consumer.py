"""A faust-streaming CI service for ``topologies/github.toml``: builds and reviews applied once in PostgreSQL.

It uses ``pipeline.downstream.faust_agent``: a read_committed faust app, typed
commands, and ``apply_once_agent``, which applies each command with
``apply_once_async`` under the service name (``--service``, default ``ci``):
the effect key is claimed in ``ci_applied_commands`` in the same database
transaction as the effect. faust acknowledges a command only after that
transaction has committed and then commits the Kafka offset.

    python examples/faust_consumer.py --broker 127.0.0.1:19092 \\
        --dsn postgresql://postgres@127.0.0.1:15432/pipeline --expect 10

The topology's routes, and what this service does with them:

- ``build`` on ``git.pushes`` (GitHub ``push``): queue one build row
  (``builds``: repository, ref, head commit). Queuing is not idempotent by
  itself (a redelivered push would queue a second build); apply-once keeps it
  to one per delivery.
- ``review`` on ``git.pull-requests`` (``pull_request.*``): upsert the pull
  request's state (``pull_requests``), never moving it back to an older
  ``updated_at``, and count its events (``events = events + 1``, again only
  correct because each command is applied once).
- ``handle`` on ``git.events`` (every other event) is not read; ``ping`` is
  dropped by the topology.

It stops after ``--expect`` commands or ``--max-idle`` seconds without one and
prints a JSON summary line: ``{"seen", "applied", "repeats", "skipped", "invalid"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from pipeline import topology
from pipeline.downstream import Command, CommandRecordError
from pipeline.downstream.faust_agent import Outcome, apply_once_agent, read_committed_app
from pipeline.resources import resolve_topology

try:  # the faust and postgres extras: one line naming them, not a traceback
    import faust
    import psycopg
except ImportError as exc:
    sys.exit(f"examples/faust_consumer.py needs {exc.name}: pip install 'webhook-pipeline[faust,postgres]'")

SCHEMA = (
    (
        "CREATE TABLE IF NOT EXISTS builds (id bigserial PRIMARY KEY, repository text NOT NULL,"
        " ref text NOT NULL, head text NOT NULL, effect_key text NOT NULL)"
    ),
    (
        "CREATE TABLE IF NOT EXISTS pull_requests (repository text NOT NULL, number integer NOT NULL,"
        " state text NOT NULL, head text, updated_at text NOT NULL, events integer NOT NULL,"
        " PRIMARY KEY (repository, number))"
    ),
)


def _repository(command: Command) -> str:
    repo = command.event.get("repository")
    name = repo.get("full_name") if isinstance(repo, dict) else None
    if not isinstance(name, str):
        raise CommandRecordError("event.repository.full_name", "is missing")
    return name


async def build(cursor: psycopg.AsyncCursor[Any], command: Command) -> None:
    """Queue a build of the pushed head commit."""
    ref, head = command.event.get("ref"), command.event.get("after")
    if not isinstance(ref, str) or not isinstance(head, str):
        raise CommandRecordError("event.ref/event.after", "is missing")
    await cursor.execute(
        "INSERT INTO builds (repository, ref, head, effect_key) VALUES (%s, %s, %s, %s)",
        (_repository(command), ref, head, command.effect_key),
    )


async def review(cursor: psycopg.AsyncCursor[Any], command: Command) -> None:
    """Record the pull request's latest state and count the event."""
    pr = command.event.get("pull_request")
    if not isinstance(pr, dict) or not isinstance(pr.get("number"), int):
        raise CommandRecordError("event.pull_request.number", "is missing")
    head = pr.get("head")
    sha = head.get("sha") if isinstance(head, dict) else None
    updated_at = str(pr.get("updated_at") or "")
    await cursor.execute(
        "INSERT INTO pull_requests AS p (repository, number, state, head, updated_at, events)"
        " VALUES (%s, %s, %s, %s, %s, 1) ON CONFLICT (repository, number) DO UPDATE SET"
        " events = p.events + 1,"
        " state = CASE WHEN EXCLUDED.updated_at >= p.updated_at THEN EXCLUDED.state ELSE p.state END,"
        " head = CASE WHEN EXCLUDED.updated_at >= p.updated_at THEN EXCLUDED.head ELSE p.head END,"
        " updated_at = GREATEST(p.updated_at, EXCLUDED.updated_at)",
        (_repository(command), pr["number"], str(pr.get("state") or "open"), sha, updated_at),
    )


# the command names github.toml routes (tests/integration check them against the file)
HANDLERS = {"build": build, "review": review}


def topics_for(topo: topology.Topology) -> list[str]:
    """The topics of ``topo`` that carry ``build`` or ``review`` commands."""
    return sorted({r.topic for r in topo.routes if r.command in HANDLERS and r.topic})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"))
    parser.add_argument("--topology", default="github", help="whose command topics to read (default: github)")
    parser.add_argument("--topic", action="append", help="read this topic instead (repeatable)")
    parser.add_argument("--service", default="ci", help="names the service's tables (default: ci)")
    parser.add_argument(
        "--group", default=None, help="the faust app id, i.e. consumer group (default: service)"
    )
    parser.add_argument(
        "--dsn", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:15432/pipeline")
    )
    parser.add_argument("--expect", type=int, default=0, help="stop after this many commands (0: no limit)")
    parser.add_argument("--max-idle", type=float, default=10.0, help="stop after this many idle seconds")
    parser.add_argument("--data-dir", type=Path, default=None, help="faust's data directory (default: temp)")
    return parser.parse_args(argv)


def build_app(args: argparse.Namespace, counts: dict[str, int]) -> tuple[Any, dict[str, Any]]:
    """The faust app with its apply-once agent, and a timer that stops ``state["worker"]`` when done."""
    topics = args.topic or topics_for(topology.load(resolve_topology(args.topology)))
    app = read_committed_app(
        args.group or args.service,
        broker=f"kafka://{args.broker}",
        datadir=str(args.data_dir),
        web_enabled=False,
    )
    state: dict[str, Any] = {"last": time.monotonic(), "stopping": None, "worker": None}
    names: dict[Outcome, str] = {"applied": "applied", "repeat": "repeats", "skipped": "skipped"}

    def on_outcome(_command: Command, outcome: Outcome) -> None:
        counts["seen"] += 1
        counts[names.get(outcome, "invalid")] += 1
        state["last"] = time.monotonic()

    apply_once_agent(
        app, topics, service=args.service, dsn=args.dsn, handlers=HANDLERS, on_outcome=on_outcome
    )

    @app.timer(0.2)  # type: ignore[untyped-decorator]
    async def stop_when_done() -> None:
        done = args.expect and counts["seen"] >= args.expect
        idle = time.monotonic() - state["last"] > args.max_idle
        if (done or idle) and state["stopping"] is None:
            why = "expected count reached" if done else "idle"
            print(f"faust_consumer: stopping ({why}) after {counts['seen']} commands", file=sys.stderr)
            # stop from a task of its own: stopping cancels this timer's task.
            state["stopping"] = asyncio.ensure_future(state["worker"].stop())

    return app, state


def run(args: argparse.Namespace) -> dict[str, int]:
    """Create the effect tables, run the worker until it stops itself, return the counts."""
    with psycopg.connect(args.dsn) as conn, conn.transaction():
        for statement in SCHEMA:
            conn.execute(statement)
    counts = {"seen": 0, "applied": 0, "repeats": 0, "skipped": 0, "invalid": 0}
    app, state = build_app(args, counts)
    # the worker's spinner and logs go to stderr; stdout carries only the final summary line
    worker = faust.Worker(app, loglevel="WARNING", quiet=True, stdout=sys.stderr, redirect_stdouts=False)
    state["worker"] = worker
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    return counts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "WARNING"), stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="faust-consumer.") as tmp:
        if args.data_dir is None:
            args.data_dir = Path(tmp)
        counts = run(args)
    print(orjson.dumps(counts).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

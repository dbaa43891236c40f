"""The console's redrive (the real ``Redrives`` over the real broker, no browser) at the edges: a record the effect
stage dead-lettered, redriven twice at once and by ``pipeline dlq replay`` beside them (one command; before, the
console skipped it as "not from the input topic"), and a broker outage as it reads the DLQ (every record sent, or
the run failed; before, the records it had not read were marked gone)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from pipeline.console import redrive as redrive_module
from pipeline.console.dlq_read import read_records
from pipeline.console.dlq_view import EventTypes, row_of
from pipeline.console.history import History, Run, RunRecord
from pipeline.console.redrive import Redrives
from pipeline.console.settings import Role, User
from tests.chaos.cluster import Broker
from tests.integration.harness import Env, read_committed, write_topology
from tests.integration.test_dlq_replay import (
    OUTAGE_S,
    _cli,
    _dlq_record,
    _old_effect_dlq_record,
    _start_after,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MakeEnv = Callable[..., Any]
ANN = User("ann", Role.REDRIVE, "token-of-ann")


async def _console_redrive(env: Env, at: tuple[int, int]) -> tuple[Redrives, Run]:
    """One console's redrive of the DLQ record ``at``, as the page's "redrive" button runs it."""
    dlq = env.topo.topics.dlq
    rows = [
        row_of(entry, dlq, EventTypes(env.topo)) async for entry in read_records(env.bootstrap, dlq, {at})
    ]
    assert len(rows) == 1
    redrives = Redrives(env.bootstrap, env.topo, History(env.bootstrap, env.topo))
    return redrives, await redrives.run(rows, ANN, "127.0.0.1", "1 selected")


async def test_an_effect_stage_record_redriven_from_two_consoles_and_the_cli_at_once_gives_one_command(
    pipeline_env: MakeEnv, unique: Callable[[str], str]
) -> None:
    """Each console sends it back to the effects topic on its effect key's partition (not to the input); with the
    CLI's replay beside them, the route's topic gets exactly one command, and each console's history records the
    effect stage's outcome: one `first` among the three copies, the others `duplicate`."""
    orders = unique("orders")
    route = (
        f'[[routes]]\nsource = "stripe"\nevent = "checkout.session.completed"\ntopic = "{orders}"\n'
        'command = "fulfil-order"\neffect_key = "data.object.payment_intent"\n'
    )
    env: Env = await pipeline_env(extra=route)
    key, value = _old_effect_dlq_record(env, orders, "pi_console")
    producer = AIOKafkaProducer(bootstrap_servers=env.bootstrap, acks="all")
    await producer.start()
    try:
        sent = await producer.send_and_wait(env.topo.topics.dlq, value, key=key)
    finally:
        await producer.stop()
    env.start_worker("w1")

    cli = asyncio.create_task(asyncio.to_thread(_cli, env, "replay"))
    (one, first_run), (two, second_run) = await asyncio.gather(
        _console_redrive(env, (sent.partition, sent.offset)),
        _console_redrive(env, (sent.partition, sent.offset)),
    )
    assert (await cli).returncode == 0
    for run in (first_run, second_run):
        assert run.state == "sent", run.error
        (record,) = run.records.values()
        assert (record.state, record.to_topic) == ("sent", env.topo.topics.effects), record

    outcomes: Counter[str] = Counter()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        followed: list[RunRecord] = []
        for redrives, run in ((one, first_run), (two, second_run)):
            await redrives.follow(redrives.history.runs[run.id])
            followed += redrives.history.runs[run.id].records.values()
        outcomes = Counter(str(r.outcome) for r in followed)
        if all(r.outcome is not None for r in followed):
            break
        await asyncio.sleep(1.0)
    assert sum(outcomes.values()) == 2, outcomes
    assert set(outcomes) <= {"first", "duplicate"}, outcomes
    await asyncio.sleep(2.0)  # time for a command too many to show
    env.stop_all()
    for redrives in (one, two):
        await redrives.history.close()
    commands = await read_committed(env.bootstrap, orders, idle=1.0)
    assert Counter(r.key.decode() for r in commands) == Counter({"fulfil-order:pi_console": 1})
    audit = await read_committed(env.bootstrap, env.topo.topics.audit, idle=1.0)
    assert len(audit) == 3  # the effect stage's, once for each copy: two consoles and the CLI


@pytest.mark.parametrize("outage_s", [OUTAGE_S])
async def test_a_broker_outage_as_the_console_reads_the_dlq_redrives_every_record_or_fails_the_run(
    own_broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outage_s: float
) -> None:
    """The broker stops after the redrive read its first DLQ record, for longer than the 5 s of silence the read
    used to take for the end: the run still sends every chosen record once (or fails, saying so, with the rest
    left planned); before, it marked the records it had not read "no longer in the DLQ" and ended `sent`."""
    await asyncio.to_thread(own_broker.start)
    app = f"app-{uuid.uuid4().hex[:10]}"
    env = Env(own_broker.bootstrap, write_topology(tmp_path / f"{app}.toml", app), tmp_path, f"{app}-group")
    await env.create_topics()
    topo = env.topo
    total = 3000  # about 3 MB on one DLQ partition: several fetches
    producer = AIOKafkaProducer(bootstrap_servers=own_broker.bootstrap, acks="all", linger_ms=20)
    await producer.start()
    try:
        for index in range(total):
            key, value = _dlq_record(topo.topics.input, index, "unknown-source")
            await producer.send(topo.topics.dlq, value, key=key, partition=0)
        await producer.flush()
    finally:
        await producer.stop()
    # the first and the last 300: nothing is sent while the read crosses the records between (a send
    # blocked by the outage would hide the read's silence behind it)
    wanted = {(0, 0)} | {(0, offset) for offset in range(total - 300, total)}
    rows = [
        row_of(entry, topo.topics.dlq, EventTypes(topo))
        async for entry in read_records(env.bootstrap, topo.topics.dlq, wanted)
    ]
    assert len(rows) == len(wanted)

    outage: list[threading.Thread] = []
    real = read_records

    async def read_then_lose_the_broker(*args: Any) -> Any:
        async for entry in real(*args):
            yield entry
            if not outage:  # here, between two fetches: the read's consumer loses the broker
                own_broker.stop()
                back = threading.Thread(target=_start_after, args=(own_broker, outage_s))
                back.start()
                outage.append(back)

    monkeypatch.setattr(redrive_module, "read_records", read_then_lose_the_broker)
    redrives = Redrives(env.bootstrap, topo, History(env.bootstrap, topo))
    try:
        run = await redrives.run(rows, ANN, "127.0.0.1", f"{len(rows)} selected")
    finally:
        for thread in outage:
            await asyncio.to_thread(thread.join)
        await redrives.history.close()
    assert outage, "the broker was never stopped"

    states = Counter(record.state for record in run.records.values())
    assert states["skipped"] == 0, [r.skip for r in run.records.values() if r.skip]
    inputs = await read_committed(own_broker.bootstrap, topo.topics.input, idle=1.0, timeout=120)
    sources = Counter(dict(r.headers)["replayed-from"].decode() for r in inputs)
    assert all(n == 1 for n in sources.values()), "a DLQ record was redriven twice"
    sent = {f"{topo.topics.dlq}:{r.partition}:{r.offset}" for r in run.records.values() if r.state == "sent"}
    assert sent == set(sources)  # what the history says was sent is what reached the input
    if run.state == "sent":
        assert states == Counter({"sent": len(wanted)})
    else:  # the outage outlasted what the read waits: the run says so, the rest is left to redrive again
        assert run.state == "failed", run
        assert "ReadIncompleteError" in run.error

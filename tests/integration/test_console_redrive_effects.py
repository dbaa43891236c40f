"""A record the effect stage dead-lettered, redriven from the console (the real ``Redrives`` over the real broker,
no browser) twice at once and by ``pipeline dlq replay`` beside them: one command, and the console's history
follows the effect stage's outcome. Before, the console skipped such a record as "not from the input topic"."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from pipeline.console.dlq_read import read_records
from pipeline.console.dlq_view import EventTypes, row_of
from pipeline.console.history import History, Run, RunRecord
from pipeline.console.redrive import Redrives
from pipeline.console.settings import Role, User
from tests.integration.harness import Env, read_committed
from tests.integration.test_dlq_replay import _cli, _old_effect_dlq_record

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

"""``pipeline rescale`` (pipeline/ops/rescale.py) run whole against the broker model through aiokafka: entries
move in batches the changelog takes and without their ``last_seen``, the input topic grows only once every
entry has moved, and a changelog written while the entries moved fails the rescale before the input grows."""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from pipeline.kafka.admin import partition_count, topic_specs
from pipeline.kafka.partitioner import owner_partition
from pipeline.ops.rescale import RescaleError, rescale
from pipeline.state.decision import Entry
from pipeline.topology import Topology, parse
from tests.simulation import codes, logs, wire
from tests.simulation.records import ABORT, decode_produced, plain_batch
from tests.simulation.test_broker_rules import GROUP, Model

BOOTSTRAP = f"{wire.HOST}:{wire.PORT}"

SMALL = 4096  # a changelog's max.message.bytes: far less than aiokafka's default batch of 16 KiB


def _topology(partitions: int = 1) -> Topology:
    return parse(
        tomllib.loads(
            f"""
[app]
name = "sim"
[topics]
input = "sim.raw"
partitions = {partitions}
[sources.stripe]
provider = "stripe"
verify = "none"
"""
        )
    )


def _model(topology: Topology, keys: int) -> Model:
    """A model holding the topology's topics (the changelog taking at most SMALL bytes a batch) and ``keys``
    entries in the changelog, each in a batch of its own on its key's partition."""
    model = Model()
    model.loop.max_time = 10_000.0
    for spec in topic_specs(topology):
        limit = SMALL if spec.name == topology.topics.changelog else logs.TopicConfig.max_message_bytes
        model.broker.create_topic(spec.name, spec.partitions, logs.TopicConfig(max_message_bytes=limit))
    for i in range(keys):
        key = f"stripe:evt_{i}".encode()
        _write_entry(
            model, topology, key, offset=i, partition=owner_partition(key, topology.topics.partitions)
        )
    return model


def _write_entry(model: Model, topology: Topology, key: bytes, *, offset: int, partition: int = 0) -> None:
    now = model.broker.now_ms()
    value = Entry(now, now + 86_400_000, partition, offset, last_seen=now, command="c" * 100).encode()
    [produced] = decode_produced(plain_batch([(key, value, [], now)]))
    log = model.broker.log(topology.topics.changelog, partition)
    assert log is not None
    error, _ = log.append(produced, model.broker.topics[topology.topics.changelog].config, now)
    assert error == codes.NONE


async def _rescale(
    topology: Topology, partitions: int, state: Path, progress: Callable[[str], None], **options: float
) -> int:
    return await rescale(
        BOOTSTRAP,
        topology,
        partitions=partitions,
        group=GROUP,
        state_file=state,
        progress=progress,
        **options,
    )


def _unseen(value: bytes) -> bytes:
    """An entry as the rescale moves it: its ``last_seen`` (another partition's stream time) cleared."""
    return Entry.decode(value)._replace(last_seen=0).encode()


def _entries(model: Model, topology: Topology, partition: int) -> dict[bytes, bytes]:
    log = model.broker.log(topology.topics.changelog, partition)
    assert log is not None
    return {
        record.key: record.value
        for stored in log.batches
        for record in stored.records
        if record.key is not None and record.value is not None
    }


def test_a_rescale_moves_every_entry_in_batches_its_changelog_takes(tmp_path: Path) -> None:
    """Sixty entries, far more than one 4 KiB batch, all reach their new owner's changelog partition (their
    last_seen cleared: a restore must not take another partition's stream time, defect 17); the
    input topic is raised last, after every entry moved (found by simulation seeds 1332, 1476, 2258 and 2872:
    the move sent 16 KiB batches, the changelog refused them, and the workers started on the half-done rescale)."""
    topology = _topology()
    model = _model(topology, keys=60)
    before = _entries(model, topology, 0)
    lines: list[str] = []

    async def scenario(model: Model) -> None:
        moved = await _rescale(topology, 2, tmp_path / "r.json", lines.append)
        wanted = {key: _unseen(value) for key, value in before.items() if owner_partition(key, 2) == 1}
        assert moved == len(wanted) > 10
        assert _entries(model, topology, 1) == wanted
        for spec in topic_specs(topology):
            assert await partition_count(BOOTSTRAP, spec.name) == 2

    assert not model.run_clients(scenario).errors
    raises = [line for line in lines if "-> 2 partitions" in line]
    assert raises[-1].strip().startswith(f"{topology.topics.input}:")
    assert lines.index(raises[-1]) > max(i for i, line in enumerate(lines) if "keys read" in line)
    assert not (tmp_path / "r.json").exists()


def test_a_changelog_written_while_its_entries_move_fails_the_rescale_before_the_input_grows(
    tmp_path: Path,
) -> None:
    """A claim written to an old changelog partition after the rescale read it (a worker that joined
    meanwhile) would stay on the old owner: the rescale fails naming the partition, the input keeps its count
    (a worker started now refuses: changelog and input counts differ), and the next run moves the claim too."""
    topology = _topology()
    model = _model(topology, keys=20)
    late = next(
        f"stripe:late_{i}".encode() for i in range(100) if owner_partition(f"stripe:late_{i}".encode(), 2)
    )
    state = tmp_path / "r.json"

    def write_after_the_read(line: str) -> None:
        if "keys read" in line and late not in _entries(model, topology, 0):
            _write_entry(model, topology, late, offset=99)

    async def scenario(model: Model) -> None:
        with pytest.raises(RescaleError, match=r"sim-seen-changelog\[0\] written while the rescale ran"):
            await _rescale(topology, 2, state, write_after_the_read)
        assert await partition_count(BOOTSTRAP, topology.topics.input) == 1
        assert await partition_count(BOOTSTRAP, topology.topics.changelog) == 2
        assert late not in _entries(model, topology, 1)
        await rescale(
            BOOTSTRAP, topology, partitions=2, group=GROUP, state_file=state, progress=lambda _l: None
        )
        assert late in _entries(model, topology, 1)
        assert await partition_count(BOOTSTRAP, topology.topics.input) == 2

    assert not model.run_clients(scenario).errors


def test_entries_moving_between_old_partitions_are_not_taken_for_a_workers_writes(tmp_path: Path) -> None:
    """From two partitions to three some keys move from one old partition to the other: the rescale counts
    its own writes and succeeds (found by simulation seed 54 of the default mix, on the first version of the
    check, which failed every such rescale), and every entry sits on its new owner's partition."""
    topology = _topology(partitions=2)
    model = _model(topology, keys=60)
    before = {**_entries(model, topology, 0), **_entries(model, topology, 1)}

    async def scenario(model: Model) -> None:
        moved = await _rescale(topology, 3, tmp_path / "r.json", lambda _line: None)
        between = [key for key in before if owner_partition(key, 2) != owner_partition(key, 3) < 2]
        assert between
        changed = [key for key in before if owner_partition(key, 3) != owner_partition(key, 2)]
        assert moved == len(changed)
        for key, value in before.items():
            moved = owner_partition(key, 3) != owner_partition(key, 2)
            assert _entries(model, topology, owner_partition(key, 3))[key] == (
                _unseen(value) if moved else value
            )
        assert await partition_count(BOOTSTRAP, topology.topics.input) == 3

    assert not model.run_clients(scenario).errors


def test_a_worker_joining_while_the_entries_move_fails_the_rescale_before_the_input_grows(
    tmp_path: Path,
) -> None:
    """A worker that joins the group during the move (a supervisor restarting it) fails the rescale, naming the
    group, and the input topic keeps its count."""
    topology = _topology()
    model = _model(topology, keys=20)
    joins: list[asyncio.Task[dict[str, int]]] = []

    def join_during_the_move(line: str) -> None:
        if "keys read" in line and not joins:
            joins.append(asyncio.ensure_future(model.join("")))

    async def scenario(model: Model) -> None:
        with pytest.raises(RescaleError, match=r"1 worker\(s\) joined group group while the rescale ran"):
            await _rescale(topology, 2, tmp_path / "r.json", join_during_the_move)
        assert await partition_count(BOOTSTRAP, topology.topics.input) == 1

    assert not model.run_clients(scenario).errors


def test_a_rescale_stopped_after_the_input_grew_finishes_without_moving_again(tmp_path: Path) -> None:
    """A run stopped after it raised the input (its moves checked) resumes without checking the changelogs
    again: a worker started meanwhile may have written to them, and the rescale still ends."""
    topology = _topology()
    model = _model(topology, keys=20)
    state = tmp_path / "r.json"

    def stop_after_the_input(line: str) -> None:
        if line.strip() == f"{topology.topics.input}: 1 -> 2 partitions":
            raise KeyboardInterrupt

    async def scenario(model: Model) -> None:
        with pytest.raises(KeyboardInterrupt):
            await _rescale(topology, 2, state, stop_after_the_input)
        assert state.exists()
        _write_entry(model, topology, b"stripe:after", offset=50)  # a worker started on the rescaled topics
        lines: list[str] = []
        assert await _rescale(topology, 2, state, lines.append) == 0
        assert any("the entries moved in an earlier run" in line for line in lines)
        assert not state.exists()

    assert not model.run_clients(scenario).errors


def test_a_transaction_left_open_on_a_changelog_makes_the_rescale_wait_then_fail_before_the_input_grows(
    tmp_path: Path,
) -> None:
    """An old changelog partition holds an open transaction (a worker killed mid-commit): the rescale waits for
    it, gives up after its timeout naming the partition, with the input unraised; once the transaction ends
    (the broker aborts it), the next run moves the entries and raises the input."""
    topology = _topology()
    model = _model(topology, keys=20)
    state = tmp_path / "r.json"
    now = model.broker.now_ms()
    pid, epoch = 7_777, 0
    builder = DefaultRecordBatchBuilder(2, 0, 1, pid, epoch, 0, 1024 * 1024)
    builder.append(0, timestamp=now, key=b"stripe:pending", value=b"{}", headers=[])
    [pending] = decode_produced(bytes(builder.build()))
    log = model.broker.log(topology.topics.changelog, 0)
    assert log is not None
    assert log.append(pending, model.broker.topics[topology.topics.changelog].config, now)[0] == codes.NONE

    async def scenario(model: Model) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(RescaleError, match=r"sim-seen-changelog\[0\] still holds an open transaction"):
            await _rescale(topology, 2, state, lambda _line: None, open_transaction_timeout=5.0)
        assert loop.time() - began >= 5.0  # it waited for the transaction
        assert await partition_count(BOOTSTRAP, topology.topics.input) == 1
        log.append_marker(pid, epoch, ABORT, model.broker.now_ms())
        assert await _rescale(topology, 2, state, lambda _line: None) > 0
        assert await partition_count(BOOTSTRAP, topology.topics.input) == 2

    assert not model.run_clients(scenario).errors


def test_a_rescale_killed_between_its_sends_and_its_progress_file_ends_on_a_later_run(tmp_path: Path) -> None:
    """2 -> 3, killed after partition 1's moves were written but before the progress file counted them: those
    writes land on partition 0, already read, and the next run takes them for a worker's and fails before the
    input grows (its moves forgotten); the run after that moves everything again and raises the input, every
    entry on its new owner."""
    topology = _topology(partitions=2)
    model = _model(topology, keys=60)
    before = {**_entries(model, topology, 0), **_entries(model, topology, 1)}
    state = tmp_path / "r.json"
    reads: list[str] = []

    def killed_after_the_second_read(line: str) -> None:
        if "keys read" in line:
            reads.append(line)
            if len(reads) == 2:
                raise KeyboardInterrupt

    async def scenario(model: Model) -> None:
        with pytest.raises(KeyboardInterrupt):
            await _rescale(topology, 3, state, killed_after_the_second_read)
        with pytest.raises(RescaleError, match=r"sim-seen-changelog\[0\] written while the rescale ran"):
            await _rescale(topology, 3, state, lambda _line: None)
        assert await partition_count(BOOTSTRAP, topology.topics.input) == 2
        await _rescale(topology, 3, state, lambda _line: None)
        assert await partition_count(BOOTSTRAP, topology.topics.input) == 3
        for key, value in before.items():
            owner = owner_partition(key, 3)
            moved = owner != owner_partition(key, 2)
            assert _entries(model, topology, owner)[key] == (_unseen(value) if moved else value)

    assert not model.run_clients(scenario).errors
    assert not state.exists()

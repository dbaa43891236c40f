"""``pipeline worker --processes N``: the supervisor's restart policy, its stop, and the children's command lines."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import build_parser, main, parse_processes, worker_settings
from pipeline.errors import ConfigError
from pipeline.worker.parent_watch import SUPERVISOR_PID_ENV
from pipeline.worker.settings import WorkerSettings
from pipeline.worker.supervisor import (
    ChildSpec,
    RestartPolicy,
    Supervisor,
    SupervisorError,
    child_settings,
    child_specs,
    exit_text,
)

# A fake worker: argv[1] is a directory for its marker files, argv[2] what it does.
CHILD = r"""
import os, pathlib, signal, sys, time
home, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
if mode == "fail":
    sys.exit(3)
if mode == "once-then-serve" and not (home / "ran-once").exists():
    (home / "ran-once").touch()
    sys.exit(0)
if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
short = mode == "short" and len(list(home.glob("ready-*"))) < 4  # the first four runs are short
(home / f"ready-{os.getpid()}").touch()
time.sleep(0.3 if short else 3600)
sys.exit(1)
"""

FAST = RestartPolicy(first_backoff=0.05, max_backoff=0.2, healthy_after=30.0, max_fast_failures=3, grace=5.0)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No setting leaks in from the environment that runs the tests."""
    for name in list(os.environ):
        if name.startswith("PIPELINE_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)


def _specs(home: Path, *modes: str) -> list[ChildSpec]:
    return [ChildSpec(i, (sys.executable, "-c", CHILD, str(home), mode)) for i, mode in enumerate(modes)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


async def _until(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


def _ready(home: Path) -> set[int]:
    return {int(p.name.removeprefix("ready-")) for p in home.glob("ready-*")}


def test_backoff_doubles_from_one_second_to_thirty() -> None:
    """The default policy waits 1, 2, 4, 8, 16 then 30 s; a child that ran long restarts after 1 s."""
    policy = RestartPolicy()
    assert [policy.backoff(n) for n in range(8)] == [1, 1, 2, 4, 8, 16, 30, 30]
    assert (policy.healthy_after, policy.max_fast_failures, policy.grace) == (60.0, 5, 30.0)


def test_exit_text_names_the_signal() -> None:
    """A child killed by a signal is reported by the signal's name."""
    assert (exit_text(3), exit_text(-9), exit_text(0)) == ("3", "SIGKILL", "0")


async def test_a_crashed_child_is_restarted_with_its_own_spec(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGKILL on one child: it is started again, logged with its index, pid and status; the other is untouched."""
    caplog.set_level(logging.INFO, logger="pipeline.worker.supervisor")
    supervisor = Supervisor(_specs(tmp_path, "serve", "serve"), FAST)
    await supervisor.start()
    runner = asyncio.create_task(supervisor.run())
    await _until(lambda: len(_ready(tmp_path)) == 2)
    victim, other = supervisor.children[0].pid, supervisor.children[1].pid
    os.kill(victim, signal.SIGKILL)
    await _until(lambda: len(_ready(tmp_path)) == 3)
    assert supervisor.restarts == {0: 1, 1: 0}
    assert supervisor.children[1].pid == other
    assert f"child 0 (pid {victim}) exited with SIGKILL; restarting in 0.05 s" in caplog.text
    supervisor.stop()
    await runner
    assert not any(_alive(pid) for pid in _ready(tmp_path))


async def test_a_child_that_exits_0_unasked_is_restarted(tmp_path: Path) -> None:
    """Exit status 0 while the supervisor is not stopping is restarted too."""
    supervisor = Supervisor(_specs(tmp_path, "once-then-serve"), FAST)
    await supervisor.start()
    runner = asyncio.create_task(supervisor.run())
    await _until(lambda: len(_ready(tmp_path)) == 1)
    assert supervisor.restarts == {0: 1}
    supervisor.stop()
    await runner


async def test_a_crash_loop_stops_everything_with_one_line(tmp_path: Path) -> None:
    """A child failing fast max_fast_failures times in a row stops the healthy ones and raises."""
    supervisor = Supervisor(_specs(tmp_path, "serve", "fail"), FAST)
    await supervisor.start()
    with pytest.raises(SupervisorError) as raised:
        await asyncio.wait_for(supervisor.run(), 20)
    message = str(raised.value)
    assert "worker process 1 exited 3 times in a row within 30 s of starting" in message
    assert "status 3" in message
    assert "\n" not in message
    assert supervisor.restarts[1] == 2
    assert not any(_alive(p.pid) for p in supervisor.children.values())


async def test_a_child_that_ran_long_enough_resets_the_count(tmp_path: Path) -> None:
    """Four exits after healthy_after seconds of running each never add up to a crash loop of two."""
    policy = RestartPolicy(first_backoff=0.05, healthy_after=0.2, max_fast_failures=2, grace=5.0)
    supervisor = Supervisor(_specs(tmp_path, "short"), policy)
    await supervisor.start()
    runner = asyncio.create_task(supervisor.run())
    await _until(lambda: len(_ready(tmp_path)) == 5, timeout=20)
    assert supervisor.restarts[0] == 4
    assert not runner.done()
    supervisor.stop()
    await runner


async def test_stop_forwards_sigterm_and_returns_when_all_exit_0(tmp_path: Path) -> None:
    """stop() sends SIGTERM to every child; run() returns once each exited 0, leaving no process."""
    supervisor = Supervisor(_specs(tmp_path, "serve", "serve", "serve"), FAST)
    await supervisor.start()
    runner = asyncio.create_task(supervisor.run())
    await _until(lambda: len(_ready(tmp_path)) == 3)
    began = time.monotonic()
    supervisor.stop()
    await runner
    assert time.monotonic() - began < 3
    assert [p.returncode for p in supervisor.children.values()] == [0, 0, 0]
    assert supervisor.restarts == {0: 0, 1: 0, 2: 0}


async def test_a_straggler_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    """A child that ignores SIGTERM is SIGKILLed after grace seconds, and run() says so in one line."""
    policy = RestartPolicy(first_backoff=0.05, grace=0.5)
    supervisor = Supervisor(_specs(tmp_path, "serve", "ignore"), policy)
    await supervisor.start()
    runner = asyncio.create_task(supervisor.run())
    await _until(lambda: len(_ready(tmp_path)) == 2)
    supervisor.stop()
    with pytest.raises(
        SupervisorError, match=r"did not stop cleanly: child 1 \(pid \d+\) exited with SIGKILL$"
    ):
        await runner
    assert supervisor.children[0].returncode == 0
    assert not any(_alive(pid) for pid in _ready(tmp_path))


def _settings(**changes: Any) -> WorkerSettings:
    base = WorkerSettings(
        bootstrap="kafka:9092", topology=Path("t.toml"), state_dir=Path("/var/state"), group="g"
    )
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    ("port", "instance", "ports", "ids"),
    [
        (9100, "pod-0", [9100, 9101, 9102], ["pod-0-0", "pod-0-1", "pod-0-2"]),
        (None, None, [None, None, None], [None, None, None]),
        (0, None, [0, 0, 0], [None, None, None]),
    ],
)
def test_each_child_gets_its_own_state_dir_port_and_member_id(
    port: int | None, instance: str | None, ports: list[int | None], ids: list[str | None]
) -> None:
    """The children's command lines parse back to the supervisor's settings, each with its own dir, port and id."""
    settings = _settings(metrics_port=port, instance_id=instance, max_batch=500, commit_interval=0.25)
    specs = child_specs(settings, 3, log_level="DEBUG")
    parsed = []
    for spec in specs:
        argv = list(spec.argv)
        assert argv[:6] == [sys.executable, "-m", "pipeline", "--log-level", "DEBUG", "worker"]
        assert not any(a.startswith("--processes") for a in argv)
        parsed.append(worker_settings(build_parser().parse_args(argv[5:])))
        assert parsed[-1] == child_settings(settings, spec.index)
    assert [p.state_dir for p in parsed] == [Path(f"/var/state/proc-{i}") for i in range(3)]
    assert [p.metrics_port for p in parsed] == ports
    assert [p.instance_id for p in parsed] == ids
    assert {(p.max_batch, p.commit_interval, p.group, p.bootstrap) for p in parsed} == {
        (500, 0.25, "g", "kafka:9092")
    }


def test_children_do_not_inherit_the_process_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """PIPELINE_PROCESSES is left out of a child's environment, so a child never supervises."""
    monkeypatch.setenv("PIPELINE_PROCESSES", "4")
    monkeypatch.setenv("PIPELINE_MAX_BATCH", "7")
    spec = child_specs(_settings(), 2)[1]
    assert spec.env is not None
    assert "PIPELINE_PROCESSES" not in spec.env
    assert spec.env["PIPELINE_MAX_BATCH"] == "7"  # overridden by the flag, which the child gets too
    assert "--max-batch=10000" in spec.argv


def test_children_are_told_the_supervisors_pid() -> None:
    """Each child's environment names the supervisor, so a child can stop once it is gone."""
    for spec in child_specs(_settings(), 3):
        assert spec.env is not None
        assert spec.env[SUPERVISOR_PID_ENV] == str(os.getpid())


def test_child_specs_refuse_what_cannot_be_split() -> None:
    """One process needs no supervisor, and the children's metrics ports must exist."""
    with pytest.raises(ConfigError, match="2 to 256 processes"):
        child_specs(_settings(), 1)
    with pytest.raises(ConfigError, match=r"65534\.\.65537 go past 65535"):
        child_specs(_settings(metrics_port=65534), 4)


def test_processes_takes_a_count_or_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    """--processes and PIPELINE_PROCESSES: a count, auto (one per CPU), default 1."""
    parser = build_parser()
    assert parser.parse_args(["worker"]).processes == 1
    assert parser.parse_args(["worker", "--processes", "3"]).processes == 3
    monkeypatch.setenv("PIPELINE_PROCESSES", "auto")
    assert parser.parse_args(["worker"]).processes == (os.cpu_count() or 1)
    assert parse_processes("AUTO") == (os.cpu_count() or 1)


@pytest.mark.parametrize(
    ("text", "problem"), [("0", "0 is not in [1, 256]"), ("two", "'two' is not a process count or auto")]
)
def test_a_bad_process_count_is_one_line_and_exit_2(
    text: str, problem: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad --processes or PIPELINE_PROCESSES ends with exit 2 and one line naming it."""
    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args(["worker", "--processes", text])
    assert raised.value.code == 2
    assert f"argument --processes: {problem}" in capsys.readouterr().err
    monkeypatch.setenv("PIPELINE_PROCESSES", text)
    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args(["worker"])
    assert raised.value.code == 2
    assert capsys.readouterr().err == (
        f"pipeline worker: error: environment variable PIPELINE_PROCESSES: {problem}\n"
    )


def test_an_unsplittable_metrics_port_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`pipeline worker --processes 4 --metrics-port 65534` exits 1 with one line, before starting anything."""
    topo = Path(__file__).resolve().parents[3] / "topologies" / "default.toml"
    code = main(
        [
            "worker",
            "--processes",
            "4",
            "--metrics-port",
            "65534",
            "--topology",
            str(topo),
            "--state-dir",
            str(tmp_path),
        ]
    )
    assert code == 1
    assert capsys.readouterr().err == "pipeline: error: metrics ports 65534..65537 go past 65535\n"


async def test_a_stop_while_children_start_is_clean(tmp_path: Path) -> None:
    """SIGTERM reaching a child before it installed its handler counts as a clean stop, not a failure."""
    supervisor = Supervisor(_specs(tmp_path, "serve", "serve"), FAST)
    await supervisor.start()
    supervisor.stop()
    await asyncio.wait_for(supervisor.run(), 10)
    assert {p.returncode for p in supervisor.children.values()} <= {0, -signal.SIGTERM}

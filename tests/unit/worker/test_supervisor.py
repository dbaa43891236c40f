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
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.cli import build_parser, main, parse_processes, worker_settings
from pipeline.errors import ConfigError
from pipeline.worker import supervisor as supervisor_module
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
    settings_argv,
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


# -- the supervisor over fake children: no process, no clock ---------------------------------------


@dataclasses.dataclass
class Run:
    """What one start of a child does: exit with ``code`` after ``lifetime`` seconds (None: run until
    signalled), exiting with ``on_term`` on SIGTERM (None: ignore it); ``gone``: it already exited unreaped."""

    code: int | None = None
    lifetime: float = 0.0
    on_term: int | None = 0
    gone: bool = False


class FakeChild:
    """A child process the test's :class:`Launcher` made: exits as its :class:`Run` says, records its signals."""

    def __init__(self, pid: int, run: Run, launcher: Launcher) -> None:
        self.pid = pid
        self.run = run
        self.launcher = launcher
        self.returncode: int | None = None
        self.signals: list[Any] = []
        self._exited = asyncio.Event()
        if run.code is not None:
            self.exit(run.code)

    def exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        self.launcher.now += self.run.lifetime  # the supervisor's clock: it ran this long
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: Any) -> None:
        self.signals.append(signum)
        if self.run.gone:  # exited, not reaped yet: the kernel knows no such process
            asyncio.get_running_loop().call_soon(self.exit, 0)
            raise ProcessLookupError(self.pid)
        if signum == signal.SIGKILL:
            self.exit(-signal.SIGKILL)
        elif signum == signal.SIGTERM and self.run.on_term is not None:
            self.exit(self.run.on_term)


class Launcher:
    """Stands in for asyncio.create_subprocess_exec: each start takes the next :class:`Run` (or OSError) of ``plan``."""

    def __init__(self, *plan: Run | OSError) -> None:
        self.plan = list(plan)
        self.now = 1000.0
        self.calls: list[tuple[tuple[str, ...], dict[str, Any]]] = []
        self.children: list[FakeChild] = []
        self.during: Any = None  # called while a start is under way

    async def __call__(self, *argv: str, **kwargs: Any) -> FakeChild:
        self.calls.append((argv, kwargs))
        if self.during is not None:
            self.during()
        step = self.plan.pop(0) if self.plan else Run()
        if isinstance(step, OSError):
            raise step
        child = FakeChild(100 + len(self.children), step, self)
        self.children.append(child)
        return child


@pytest.fixture
def launcher(monkeypatch: pytest.MonkeyPatch) -> Launcher:
    """Children are :class:`FakeChild` objects, and the supervisor's monotonic clock is the launcher's."""
    made = Launcher()
    monkeypatch.setattr(asyncio, "create_subprocess_exec", made)
    monkeypatch.setattr(supervisor_module, "time", SimpleNamespace(monotonic=lambda: made.now))
    return made


NOW = RestartPolicy(first_backoff=0.0, max_backoff=0.0, healthy_after=60.0, max_fast_failures=3, grace=5.0)


def _fake_specs(count: int, env: dict[str, str] | None = None) -> list[ChildSpec]:
    return [ChildSpec(i, ("worker", str(i)), env) for i in range(count)]


def test_exit_text_of_a_status_that_names_no_signal_is_the_number() -> None:
    """A negative status that is no signal's number is reported as it is."""
    assert exit_text(-100) == "-100"


def test_settings_argv_spells_switches_and_settings_turned_off() -> None:
    """A switch on is its flag, off is --no-<flag>; an optional number off is "none", an optional text "" ."""
    on = settings_argv(_settings(check_crcs=True, metrics_port=None, instance_id=None))
    assert "--check-crcs" in on
    assert "--no-check-crcs" not in on
    assert "--metrics-port=none" in on
    assert "--instance-id=" in on
    assert "--no-check-crcs" in settings_argv(_settings(check_crcs=False))


def test_children_log_at_info_unless_told() -> None:
    """Without a log level, each child runs `pipeline --log-level INFO worker`."""
    assert child_specs(_settings(), 2)[0].argv[3:6] == ("--log-level", "INFO", "worker")


def test_a_supervisor_runs_up_to_256_processes() -> None:
    """256 children are allowed, 257 are not."""
    assert len(child_specs(_settings(), 256)) == 256
    with pytest.raises(ConfigError, match="2 to 256 processes, got 257"):
        child_specs(_settings(), 257)


def test_the_children_metrics_ports_may_end_at_65535() -> None:
    """Ports 65534..65535 are fine; 65535..65536 are not."""
    assert [s.index for s in child_specs(_settings(metrics_port=65534), 2)] == [0, 1]
    with pytest.raises(ConfigError, match=r"metrics ports 65535\.\.65536 go past 65535"):
        child_specs(_settings(metrics_port=65535), 2)


def test_a_supervisor_without_children_is_a_configuration_error() -> None:
    """No spec: ConfigError, named."""
    with pytest.raises(ConfigError, match=r"^a supervisor needs at least one child$"):
        Supervisor([])


async def test_each_child_starts_with_its_specs_command_and_environment(launcher: Launcher) -> None:
    """The child's argv and environment are the spec's (None: the supervisor's own); its keeper task is named after it."""
    specs = [ChildSpec(0, ("worker", "0"), {"A": "1"}), ChildSpec(1, ("worker", "1"))]
    supervisor = Supervisor(specs, NOW)
    await supervisor.start()
    assert launcher.calls == [(("worker", "0"), {"env": {"A": "1"}}), (("worker", "1"), {"env": None})]
    names = {task.get_name() for task in asyncio.all_tasks()}
    assert {"child-0", "child-1"} <= names
    supervisor.stop()
    await supervisor.run()
    assert [c.signals for c in launcher.children] == [[signal.SIGTERM], [signal.SIGTERM]]


async def test_a_child_that_cannot_start_stops_the_others_and_says_which(launcher: Launcher) -> None:
    """An OSError starting child 1: child 0 gets SIGTERM, and start() raises naming child 1 and the error."""
    launcher.plan = [Run(), OSError("no such file: worker")]
    supervisor = Supervisor(_fake_specs(2), NOW)
    with pytest.raises(SupervisorError, match=r"^cannot start worker process 1: no such file: worker$"):
        await supervisor.start()
    assert launcher.children[0].signals == [signal.SIGTERM]


async def test_a_restart_that_cannot_start_ends_run_with_the_reason(launcher: Launcher) -> None:
    """A child exits and its restart fails: run() raises with the start's error, after stopping the others."""
    launcher.plan = [Run(code=3), Run(), OSError("fork failed")]
    supervisor = Supervisor(_fake_specs(2), NOW)
    await supervisor.start()
    with pytest.raises(SupervisorError, match=r"^cannot start worker process 0: fork failed$"):
        await asyncio.wait_for(supervisor.run(), 5)
    assert launcher.children[1].signals == [signal.SIGTERM]


async def test_a_child_started_while_the_supervisor_stops_is_sent_sigterm(launcher: Launcher) -> None:
    """stop() arriving while a child is being started: the new child is asked to stop at once."""
    supervisor = Supervisor(_fake_specs(1), NOW)
    launcher.during = supervisor.stop
    await supervisor.start()
    await asyncio.wait_for(supervisor.run(), 5)
    assert launcher.children[0].signals == [signal.SIGTERM]


async def test_a_crash_loop_names_the_child_its_last_pid_and_status(launcher: Launcher) -> None:
    """Three fast failures of child 0: run() raises with one line naming it, its last pid and status."""
    launcher.plan = [Run(code=3, lifetime=1.0), Run(), Run(code=3, lifetime=1.0), Run(code=3, lifetime=1.0)]
    supervisor = Supervisor(_fake_specs(2), NOW)
    await supervisor.start()
    with pytest.raises(SupervisorError) as raised:
        await asyncio.wait_for(supervisor.run(), 5)
    assert str(raised.value) == (
        "worker process 0 exited 3 times in a row within 60 s of starting (last: pid 103, status 3); "
        "stopped every process: see its log above"
    )
    assert supervisor.restarts == {0: 2, 1: 0}


async def test_a_child_that_ran_exactly_healthy_after_is_no_fast_failure(launcher: Launcher) -> None:
    """With max_fast_failures 1, exits after exactly healthy_after seconds are restarted; one sooner gives up."""
    policy = dataclasses.replace(NOW, max_fast_failures=1)
    launcher.plan = [Run(code=1, lifetime=60.0), Run(code=1, lifetime=60.0), Run(code=1, lifetime=59.5)]
    supervisor = Supervisor(_fake_specs(1), policy)
    await supervisor.start()
    with pytest.raises(SupervisorError, match="exited 1 times in a row within 60 s of starting"):
        await asyncio.wait_for(supervisor.run(), 5)
    assert supervisor.restarts == {0: 2}


async def test_every_child_that_did_not_stop_cleanly_is_named(launcher: Launcher) -> None:
    """Two children exiting non-zero on SIGTERM: run() names both, in one line."""
    launcher.plan = [Run(on_term=1), Run(on_term=2)]
    supervisor = Supervisor(_fake_specs(2), NOW)
    await supervisor.start()
    supervisor.stop()
    with pytest.raises(SupervisorError) as raised:
        await supervisor.run()
    assert str(raised.value) == (
        "worker processes did not stop cleanly: child 0 (pid 100) exited with 1; child 1 (pid 101) exited with 2"
    )


async def test_a_child_already_gone_when_signalled_is_no_error(launcher: Launcher) -> None:
    """SIGTERM to a child that exited but was not reaped yet (ProcessLookupError): the stop goes on, cleanly."""
    launcher.plan = [Run(gone=True), Run()]
    supervisor = Supervisor(_fake_specs(2), NOW)
    await supervisor.start()
    supervisor.stop()
    await asyncio.wait_for(supervisor.run(), 5)
    assert [c.returncode for c in launcher.children] == [0, 0]


async def test_the_kill_after_the_grace_period_names_only_the_children_still_running(
    launcher: Launcher, caplog: pytest.LogCaptureFixture
) -> None:
    """Grace over: the warning lists the children still running (not those that exited), and only they get SIGKILL."""
    launcher.plan = [Run(), Run(on_term=None), Run()]
    supervisor = Supervisor(_fake_specs(3), dataclasses.replace(NOW, grace=0.0))
    await supervisor.start()
    supervisor.stop()
    with (
        caplog.at_level(logging.WARNING, logger="pipeline.worker.supervisor"),
        pytest.raises(SupervisorError, match=r"child 1 \(pid 101\) exited with SIGKILL$"),
    ):
        await supervisor.run()
    assert "worker processes 1 (pid 101) did not stop within 0 s; killing them" in caplog.text
    assert [c.signals for c in launcher.children] == [
        [signal.SIGTERM],
        [signal.SIGTERM, signal.SIGKILL],
        [signal.SIGTERM],
    ]

"""``pipeline worker --processes N``: N worker processes in one group, under one supervisor.

The supervisor runs each child (``python -m pipeline worker ...`` with the
supervisor's own settings, see :func:`child_specs`) and keeps it running: a child
that exits while the supervisor is not stopping (a crash, a SIGKILL, even exit 0)
is started again after a backoff that doubles from ``first_backoff`` to
``max_backoff`` and resets once a child has run ``healthy_after`` seconds. A child
that fails ``max_fast_failures`` times in a row, each within ``healthy_after`` of
its start, is a misconfiguration, not bad luck: every child is stopped and
:meth:`Supervisor.run` raises :class:`SupervisorError` (one line, exit 1).

:meth:`Supervisor.stop` (SIGTERM or SIGINT through the CLI) sends SIGTERM to
every child, waits ``grace`` seconds, then SIGKILLs what is left. ``run``
returns only when every child stopped with status 0 (or by that SIGTERM, which a
child still starting has no handler for yet); otherwise it raises.

Children inherit the supervisor's stdout, stderr, environment (minus
``PIPELINE_PROCESSES``, plus ``PIPELINE_SUPERVISOR_PID``), working directory and
process group. A child whose supervisor is gone (SIGKILLed: it could not stop
them) stops by itself within a second, as on SIGTERM (see
:mod:`pipeline.worker.parent_watch`), so that a supervisor started in its place
finds the stores free. Each has its own
state dir (``<state-dir>/proc-<i>``: two processes never open one RocksDB
store), its own metrics port (the base port + i) and its own static member id
(``<instance-id>-<i>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pipeline.errors import ConfigError, PipelineError
from pipeline.options import WORKER_OPTIONS
from pipeline.worker.parent_watch import SUPERVISOR_PID_ENV
from pipeline.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

MAX_PROCESSES = 256
PROCESSES_ENV = "PIPELINE_PROCESSES"


class SupervisorError(PipelineError):
    """The supervised worker processes could not be kept running, or did not stop cleanly."""

    reason = "supervisor"


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """When a child that exited is started again, when the supervisor gives up, how long a stop may take."""

    first_backoff: float = 1.0  # seconds before the first restart
    max_backoff: float = 30.0  # the doubling stops here
    healthy_after: float = 60.0  # a child that ran this long resets the backoff and the failure count
    max_fast_failures: int = 5  # this many exits in a row, each before healthy_after: give up
    grace: float = 30.0  # seconds from SIGTERM to SIGKILL on stop

    def backoff(self, failures: int) -> float:
        """Seconds before restarting a child that failed fast ``failures`` times in a row (0: it ran long)."""
        return min(self.first_backoff * 2.0 ** max(failures - 1, 0), self.max_backoff)


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """How to start child ``index``."""

    index: int
    argv: tuple[str, ...]
    env: Mapping[str, str] | None = None  # None: the supervisor's environment


def exit_text(code: int) -> str:
    """``3``, or ``SIGKILL`` for a child killed by a signal."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-code).name
    return str(code)


# -- what each child runs ------------------------------------------------------------------------------


def settings_argv(settings: WorkerSettings) -> list[str]:
    """``--flag=value`` for every worker setting, so a child gets exactly these settings whatever its environment."""
    hints = typing.get_type_hints(WorkerSettings)
    argv = []
    for option in WORKER_OPTIONS:
        value = option.to_flag(getattr(settings, option.field))
        if isinstance(value, bool):
            argv.append(option.flag if value else "--no-" + option.flag.removeprefix("--"))
        elif value is None:  # an optional setting turned off: "" for text, "none" for a number
            argv.append(f"{option.flag}=" + ("" if str in typing.get_args(hints[option.field]) else "none"))
        else:
            argv.append(f"{option.flag}={value}")
    return argv


def child_settings(settings: WorkerSettings, index: int) -> WorkerSettings:
    """Child ``index``'s settings: its own state dir, metrics port and static member id."""
    port = settings.metrics_port
    return replace(
        settings,
        state_dir=settings.state_dir / f"proc-{index}",
        metrics_port=None if port is None else (port + index if port else 0),
        instance_id=None if settings.instance_id is None else f"{settings.instance_id}-{index}",
    )


def child_specs(settings: WorkerSettings, processes: int, *, log_level: str = "INFO") -> list[ChildSpec]:
    """The ``pipeline worker`` command line of each of ``processes`` children; ConfigError if they cannot differ."""
    if not 2 <= processes <= MAX_PROCESSES:
        raise ConfigError(f"a supervisor runs 2 to {MAX_PROCESSES} processes, got {processes}")
    port = settings.metrics_port
    if port and port + processes - 1 > 65535:
        raise ConfigError(f"metrics ports {port}..{port + processes - 1} go past 65535")
    env = {name: value for name, value in os.environ.items() if name != PROCESSES_ENV}
    env[SUPERVISOR_PID_ENV] = str(os.getpid())  # a child stops once this process is gone
    prefix = (sys.executable, "-m", "pipeline", "--log-level", log_level, "worker")
    return [
        ChildSpec(i, (*prefix, *settings_argv(child_settings(settings, i))), env) for i in range(processes)
    ]


# -- the supervisor ------------------------------------------------------------------------------------


class Supervisor:
    """Keeps one process per :class:`ChildSpec` running until :meth:`stop`; a :class:`~pipeline.service.Service`."""

    def __init__(self, specs: Sequence[ChildSpec], policy: RestartPolicy | None = None) -> None:
        if not specs:
            raise ConfigError("a supervisor needs at least one child")
        self.specs = list(specs)
        self.policy = policy or RestartPolicy()
        self.children: dict[int, asyncio.subprocess.Process] = {}  # index -> the running process
        self.restarts = dict.fromkeys((s.index for s in self.specs), 0)
        self._stopping = asyncio.Event()
        self._keepers: list[asyncio.Task[None]] = []
        self._failure: str | None = None  # why the supervisor gave up
        self._unclean: list[str] = []  # children that did not stop with 0 when asked to

    async def start(self) -> None:
        """Start every child (each then kept running by its own task)."""
        for spec in self.specs:
            try:
                process = await self._spawn(spec)
            except SupervisorError:
                self.stop()
                await self._wait_for_children()
                raise
            self._keepers.append(asyncio.create_task(self._keep(spec, process), name=f"child-{spec.index}"))
        log.info("supervisor started %d worker processes", len(self.specs))

    def stop(self) -> None:
        """Ask every child to stop (SIGTERM) and :meth:`run` to return."""
        if not self._stopping.is_set():
            self._stopping.set()
            self._signal_all(signal.SIGTERM)

    async def run(self) -> None:
        """Wait for :meth:`stop` or a crash loop; stop every child; raise unless all exited 0."""
        try:
            await self._stopping.wait()
        finally:
            self.stop()
            await self._wait_for_children()
        if self._failure is not None:
            raise SupervisorError(self._failure)
        if self._unclean:
            raise SupervisorError("worker processes did not stop cleanly: " + "; ".join(self._unclean))
        log.info("supervisor stopped: every worker process exited cleanly")

    # -- internals ---------------------------------------------------------------------------------
    async def _spawn(self, spec: ChildSpec) -> asyncio.subprocess.Process:
        try:
            process = await asyncio.create_subprocess_exec(*spec.argv, env=spec.env)
        except OSError as exc:
            raise SupervisorError(f"cannot start worker process {spec.index}: {exc}") from None
        self.children[spec.index] = process
        log.info("child %d started (pid %d)", spec.index, process.pid)
        if self._stopping.is_set():  # stop() came while it was being started
            process.send_signal(signal.SIGTERM)
        return process

    async def _keep(self, spec: ChildSpec, process: asyncio.subprocess.Process) -> None:
        """Wait for the child; restart it with backoff until the supervisor stops or gives up."""
        failures = 0
        while True:
            started = time.monotonic()
            code = await process.wait()
            ran = time.monotonic() - started
            if self._stopping.is_set():
                if code not in (0, -signal.SIGTERM):  # -SIGTERM: asked while starting, before its handler
                    self._unclean.append(
                        f"child {spec.index} (pid {process.pid}) exited with {exit_text(code)}"
                    )
                return
            failures = 0 if ran >= self.policy.healthy_after else failures + 1
            if failures >= self.policy.max_fast_failures:
                self._give_up(spec, process.pid, code, failures)
                return
            delay = self.policy.backoff(failures)
            log.warning(
                "child %d (pid %d) exited with %s; restarting in %g s",
                spec.index,
                process.pid,
                exit_text(code),
                delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            if self._stopping.is_set():
                return
            try:
                process = await self._spawn(spec)
            except SupervisorError as exc:
                self._failure = str(exc)
                self.stop()
                return
            self.restarts[spec.index] += 1

    def _give_up(self, spec: ChildSpec, pid: int, code: int, failures: int) -> None:
        self._failure = (
            f"worker process {spec.index} exited {failures} times in a row within "
            f"{self.policy.healthy_after:g} s of starting (last: pid {pid}, status {exit_text(code)}); "
            "stopped every process: see its log above"
        )
        log.error("%s", self._failure)
        self.stop()

    def _signal_all(self, signum: signal.Signals) -> None:
        for process in self.children.values():
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)

    async def _wait_for_children(self) -> None:
        """Wait ``grace`` seconds for every keeper to see its child exit, then SIGKILL the rest."""
        if not self._keepers:
            return
        _, pending = await asyncio.wait(self._keepers, timeout=self.policy.grace)
        if pending:
            left = [f"{i} (pid {p.pid})" for i, p in sorted(self.children.items()) if p.returncode is None]
            log.warning(
                "worker processes %s did not stop within %g s; killing them",
                ", ".join(left),
                self.policy.grace,
            )
            self._signal_all(signal.SIGKILL)
            await asyncio.wait(pending)

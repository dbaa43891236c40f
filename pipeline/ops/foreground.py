"""Running ``pipeline up`` in the foreground: signals, a forced exit, and port checks.

The first Ctrl-C or SIGTERM stops everything cleanly (while still starting, it
abandons the start and stops what already runs, the broker included); a second
one exits at once, leaving a detached ``kafka.sh stop`` to stop the broker
``up`` started. No signal is ever ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from pipeline.config import DEFAULT_TOPOLOGY
from pipeline.errors import PipelineError
from pipeline.ops.sign import DEFAULT_URL

if TYPE_CHECKING:
    from pipeline.ops.up import LocalBroker, Up
    from pipeline.topology import Topology

DEFAULT_METRICS_PORT = 9100  # pipeline inspect's default --workers port

FORCED_EXIT = 130


def busy_port(ports: Iterable[int], host: str = "127.0.0.1") -> int | None:
    """The first of ``ports`` that cannot be bound on ``host`` now, or None when all are free."""
    for port in ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the broker binds
            try:
                sock.bind((host, port))
            except OSError:
                return port
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free on ``host`` now, for a service asked to listen on port 0."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def controller_port(port: int, environ: dict[str, str] | os._Environ[str] | None = None) -> int:
    """The controller port kafka.sh uses with broker port ``port``."""
    env = os.environ if environ is None else environ
    text = env.get("KAFKA_CONTROLLER_PORT", "")
    return int(text) if text.isdigit() else port + 1


def own_broker_running(broker: LocalBroker) -> bool:
    """Whether a broker kafka.sh started for this port and run directory is alive (its pid file)."""
    pid_file = broker.run_dir / str(broker.port) / "kafka.pid"
    try:
        pid = int(pid_file.read_text(encoding="utf-8").strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def refuse_busy_ports(broker: LocalBroker | None, *, ingress_port: int, metrics_port: int) -> None:
    """Raise, in one line, when a port ``up`` needs is taken or named twice; before anything starts.

    The ports are the ingress's and the worker's metrics port (0: any free one), and, when
    ``up`` starts the local ``broker``, its Kafka and controller ports, unless the broker
    kafka.sh started there earlier is running (``up`` uses it again).
    """
    wanted: list[tuple[int, str, str]] = []
    if broker is not None and not own_broker_running(broker):
        kafka_hint = (
            "pipeline up never uses a broker it did not start: stop that process, choose another"
            f" --kafka-port, or use it with --bootstrap 127.0.0.1:{broker.port}"
        )
        controller_hint = (
            "the local broker's controller listens there: stop that process, or choose another"
            " --kafka-port (the controller takes the next port) or KAFKA_CONTROLLER_PORT"
        )
        wanted += [
            (broker.port, "Kafka port", kafka_hint),
            (controller_port(broker.port), "controller port (KAFKA_CONTROLLER_PORT)", controller_hint),
        ]
    wanted += [
        (ingress_port, "ingress port", "stop that process or choose another --ingress-port"),
        (metrics_port, "metrics port", "stop that process or choose another --metrics-port"),
    ]
    wanted = [(port, what, hint) for port, what, hint in wanted if port != 0]  # 0: the system picks one
    named: dict[int, str] = {}
    for port, what, _hint in wanted:
        if port in named:
            raise PipelineError(
                f"the {named[port]} and the {what} are both {port}: give them different ports"
            )
        named[port] = what
    for port, what, hint in wanted:
        if busy_port([port]) is not None:
            raise PipelineError(f"{what} {port} on 127.0.0.1 is already in use by another process; {hint}")


def stop_detached(script: Path, port: int, run_dir: Path) -> None:
    """Start ``kafka.sh stop PORT`` in its own session, so it finishes after this process exits."""
    env = dict(os.environ, KAFKA_RUN_DIR=str(run_dir), PYTHON=sys.executable)
    subprocess.Popen(  # noqa: S603  (our own script, fixed arguments)
        ["bash", str(script), "stop", str(port)],  # noqa: S607
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )


def second_terminal(bootstrap: str, topology: Topology, metrics_port: int, ingress_url: str) -> list[str]:
    """The lines that point a second terminal's ``pipeline`` commands at this ``up``."""
    lines = [f"export KAFKA_BOOTSTRAP_SERVERS={shlex.quote(bootstrap)}"]
    if topology.path is not None and Path(topology.path).resolve() != DEFAULT_TOPOLOGY.resolve():
        lines.append(f"export PIPELINE_TOPOLOGY={shlex.quote(str(Path(topology.path).resolve()))}")
    if metrics_port != DEFAULT_METRICS_PORT:
        lines.append(f"export PIPELINE_WORKERS=127.0.0.1:{metrics_port}")
    if ingress_url != DEFAULT_URL:
        lines.append(f"export PIPELINE_INGRESS_URL={shlex.quote(ingress_url)}")
    lines.append(f"pipeline tail {shlex.quote(topology.topics.commands)}    # the commands, as JSON lines")
    return lines


async def run_foreground(up: Up, *, err: TextIO = sys.stderr) -> int:
    """Start ``up`` and run it until a signal; return the exit status (0 after a clean stop)."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    state = {"signals": 0, "starting": True}

    def on_signal(signum: int) -> None:
        state["signals"] += 1
        name = signal.Signals(signum).name
        if state["signals"] > 1:
            broker = up.owned_broker
            if broker is not None:
                stop_detached(broker.script, broker.port, broker.run_dir)
            note = f"; the broker on port {broker.port} is being stopped" if broker is not None else ""
            err.write(f"\npipeline: {name} again: exiting now{note}\n")
            err.flush()
            os._exit(FORCED_EXIT)
        err.write(f"\npipeline: {name}: stopping (press Ctrl-C again to exit at once)\n")
        err.flush()
        if state["starting"] and main is not None:
            main.cancel()
        else:
            up.stop()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        try:
            await up.start()
        except (asyncio.CancelledError, Exception):
            if state["signals"] and main is not None:
                main.uncancel()  # the cancel was ours, on the signal: clean up normally
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(up.abandon())
            if state["signals"]:
                return FORCED_EXIT
            raise
        state["starting"] = False
        await up.run()
        return 0
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)

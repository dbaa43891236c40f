"""The ports ``pipeline up`` needs, checked before anything starts (the broker alone takes seconds)."""

from __future__ import annotations

import socket
from collections.abc import Iterable

from pipeline.errors import PipelineError
from pipeline.stack.local_broker import LocalBroker, controller_port


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


def refuse_busy_ports(broker: LocalBroker | None, *, ingress_port: int, metrics_port: int) -> None:
    """Raise, in one line, when a port ``up`` needs is taken or named twice; before anything starts.

    The ports are the ingress's and the worker's metrics port (0: any free one), and, when
    ``up`` starts the local ``broker``, its Kafka and controller ports, unless the broker
    kafka.sh started there earlier is running (``up`` uses it again).
    """
    wanted: list[tuple[int, str, str]] = []
    if broker is not None and not broker.running():
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

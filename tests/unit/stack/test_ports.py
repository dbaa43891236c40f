"""``pipeline up``'s port checks (pipeline/stack/ports.py): every port, before anything starts."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import PipelineError
from pipeline.stack.local_broker import LocalBroker
from pipeline.stack.ports import refuse_busy_ports


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def taken() -> Iterator[int]:
    """A port something listens on for the test's duration."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _broker(tmp_path: Path, port: int, controller: int, monkeypatch: pytest.MonkeyPatch) -> LocalBroker:
    monkeypatch.setenv("KAFKA_CONTROLLER_PORT", str(controller))
    return LocalBroker.here(port, {"KAFKA_RUN_DIR": str(tmp_path / "kafka")})


@pytest.mark.parametrize("which", ["ingress", "metrics"])
def test_up_refuses_a_busy_service_port_before_it_starts_the_broker(
    which: str,
    taken: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A taken --ingress-port or --metrics-port ends ``up`` in one line within a second, no broker started."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KAFKA_RUN_DIR", str(tmp_path / "kafka"))
    monkeypatch.setenv("KAFKA_CONTROLLER_PORT", str(_free_port()))
    monkeypatch.setattr(LocalBroker, "missing", lambda _self: [])  # Java and Maven or not: ports first
    ports = {"ingress": _free_port(), "metrics": _free_port(), which: taken}
    argv = ["up", "--kafka-port", str(_free_port())]
    argv += ["--ingress-port", str(ports["ingress"]), "--metrics-port", str(ports["metrics"])]
    started = time.monotonic()
    assert main(argv) == 1
    assert time.monotonic() - started < 1.0
    out, err = capsys.readouterr()
    assert err.count("\n") == 1, err
    assert f"{which} port {taken} on 127.0.0.1 is already in use" in err
    assert f"--{which}-port" in err
    assert "Starting the local Kafka broker" not in out
    assert not (tmp_path / "kafka").exists()


def test_a_busy_controller_port_does_not_suggest_bootstrap(
    taken: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's port taken: the hint names --kafka-port and KAFKA_CONTROLLER_PORT, never --bootstrap."""
    broker = _broker(tmp_path, _free_port(), taken, monkeypatch)
    with pytest.raises(PipelineError) as info:
        refuse_busy_ports(broker, ingress_port=0, metrics_port=0)
    message = str(info.value)
    assert message.startswith(
        f"controller port (KAFKA_CONTROLLER_PORT) {taken} on 127.0.0.1 is already in use"
    )
    assert "--bootstrap" not in message
    assert "--kafka-port" in message


def test_a_busy_kafka_port_suggests_using_it_with_bootstrap(
    taken: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Kafka port taken: the hint offers --bootstrap on that very port."""
    broker = _broker(tmp_path, taken, _free_port(), monkeypatch)
    with pytest.raises(PipelineError, match=f"--bootstrap 127.0.0.1:{taken}$"):
        refuse_busy_ports(broker, ingress_port=0, metrics_port=0)


def test_one_port_named_for_two_services_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same port for the ingress and the metrics (or the broker) is one line naming both."""
    port = _free_port()
    with pytest.raises(PipelineError, match=f"the ingress port and the metrics port are both {port}"):
        refuse_busy_ports(None, ingress_port=port, metrics_port=port)
    broker = _broker(tmp_path, port, _free_port(), monkeypatch)
    with pytest.raises(PipelineError, match=f"the Kafka port and the metrics port are both {port}"):
        refuse_busy_ports(broker, ingress_port=0, metrics_port=port)


def test_port_zero_and_free_ports_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Port 0 (the system picks) is never busy nor a clash; free ports pass."""
    broker = _broker(tmp_path, _free_port(), _free_port(), monkeypatch)
    refuse_busy_ports(broker, ingress_port=0, metrics_port=0)
    refuse_busy_ports(None, ingress_port=_free_port(), metrics_port=0)

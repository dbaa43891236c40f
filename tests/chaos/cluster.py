"""The moving parts of a chaos run: a private broker, worker processes, the producer and the lag monitor."""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from tests.chaos.workload import Item, Materializer

ROOT = Path(__file__).resolve().parents[2]
KAFKA_SH = ROOT / "deploy" / "kafka" / "kafka.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """A private single-node broker started with ``deploy/kafka/kafka.sh`` in its own run dir."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.port = free_port()
        self.controller_port = free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.started = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.run_dir / "kafka" / str(self.port) / "kafka.log"

    def _run(self, action: str, timeout: float) -> float:
        env = dict(
            os.environ,
            KAFKA_RUN_DIR=str(self.run_dir / "kafka"),
            KAFKA_CONTROLLER_PORT=str(self.controller_port),
        )
        began = time.monotonic()
        # its own session: a Ctrl-C in the terminal must not reach the broker before we stop it cleanly
        result = subprocess.run(
            ["bash", str(KAFKA_SH), action, str(self.port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"kafka.sh {action} {self.port} failed:\n{result.stderr[-3000:]}")
        return time.monotonic() - began

    def start(self) -> float:
        self.started = True
        return self._run("start", 180)

    def restart(self) -> float:
        return self._run("restart", 180)

    def stop(self) -> None:
        if not self.started:
            return
        try:
            self._run("stop", 60)
        except (RuntimeError, subprocess.TimeoutExpired):
            pid_file = self.run_dir / "kafka" / str(self.port) / "kafka.pid"
            if pid_file.exists():
                with contextlib.suppress(ValueError, ProcessLookupError):
                    os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        self.started = False


@dataclass
class WorkerProc:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    starts: int = 1
    stopped_at: float | None = None  # SIGSTOPped since (monotonic)


@dataclass
class Workers:
    """Worker processes of one group, each with its own state dir and log."""

    bootstrap: str
    topology: Path
    run_dir: Path
    group: str
    session_timeout_ms: int
    extra: list[str] = field(default_factory=list)
    procs: dict[str, WorkerProc] = field(default_factory=dict)
    exits: list[tuple[str, int, str]] = field(default_factory=list)  # (name, returncode, how it ended)

    def start(self, name: str) -> WorkerProc:
        log = self.run_dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pipeline",
                    "worker",
                    "--bootstrap",
                    self.bootstrap,
                    "--topology",
                    str(self.topology),
                    "--state-dir",
                    str(self.run_dir / "state" / name),
                    "--group",
                    self.group,
                    "--session-timeout-ms",
                    str(self.session_timeout_ms),
                    *self.extra,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                # aiokafka's own lines too: the run reads "Joined group" to see a zombie rejoin
                env=dict(os.environ, PIPELINE_LOG_LEVEL="INFO", PIPELINE_LIBRARY_LOG_LEVEL="INFO"),
                start_new_session=True,  # Ctrl-C reaches only us; we stop the workers ourselves
            )
        previous = self.procs.get(name)
        proc = WorkerProc(name, process, log, starts=previous.starts + 1 if previous else 1)
        self.procs[name] = proc
        return proc

    def running(self) -> list[WorkerProc]:
        return [p for p in self.procs.values() if p.process.poll() is None]

    def died(self) -> list[tuple[str, int]]:
        """Workers that exited on their own (not by our signal)."""
        return [(p.name, p.process.returncode) for p in self.procs.values() if p.process.poll() is not None]

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.process.send_signal(signal.SIGKILL)
        proc.process.wait()
        self.exits.append((name, proc.process.returncode, "SIGKILL"))

    def terminate(self, name: str, timeout: float = 60.0) -> int:
        proc = self.procs.pop(name)
        proc.process.send_signal(signal.SIGTERM)
        try:
            code = proc.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.process.kill()
            code = proc.process.wait()
            self.exits.append((name, code, f"SIGTERM ignored for {timeout:.0f}s; killed"))
            return code
        self.exits.append((name, code, "SIGTERM"))
        return code

    def stop_all(self, timeout: float = 60.0) -> list[tuple[str, int, float]]:
        """SIGTERM every worker (SIGCONT first, in case one is stopped); SIGKILL after ``timeout``.

        Returns ``(name, exit code, seconds to exit)``; the code is -9 when it had to be killed.
        """
        results = []
        live = [p for p in self.procs.values() if p.process.poll() is None]
        began = time.monotonic()
        for proc in live:
            proc.process.send_signal(signal.SIGCONT)
            proc.process.send_signal(signal.SIGTERM)
        for proc in live:
            try:
                proc.process.wait(timeout=max(1.0, began + timeout - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.process.kill()
                proc.process.wait()
                results.append((proc.name, -9, time.monotonic() - began))
                continue
            results.append((proc.name, proc.process.returncode, time.monotonic() - began))
        return results

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.process.poll() is None:
                proc.process.kill()
                proc.process.wait()


class InputProducer:
    """Produces the planned stream at a steady rate from a thread; delayed duplicates on request."""

    def __init__(
        self, bootstrap: str, topic: str, materializer: Materializer, stream: list[Item], rate: float
    ) -> None:
        self.topic = topic
        self.materializer = materializer
        self.stream = stream
        self.rate = rate
        self.config = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 10,
            "partitioner": "murmur2_random",  # the Java client's partitioner, as the contract asks
            "message.timeout.ms": 600_000,  # ride out broker restarts instead of failing
            "queue.buffering.max.messages": 200_000,
            "queue.buffering.max.kbytes": 512 * 1024,
            "reconnect.backoff.max.ms": 1_000,  # back within a second of the broker, not ten
            "error_cb": self._on_error,
        }
        self.producer = Producer(self.config)
        self.fatal = threading.Event()  # librdkafka's idempotent producer gave up: replace it
        self.replaced = 0
        self.extra: collections.deque[Item] = collections.deque()
        self.lock = threading.Lock()
        self.acked: set[int] = set()
        self.errors: list[str] = []
        self.sent = 0
        self.done = threading.Event()
        self.stop = threading.Event()
        self.high_event = -1  # highest event index whose first copy was produced
        self.finishing = threading.Event()
        self.thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def add(self, items: list[Item]) -> None:
        with self.lock:
            self.extra.extend(items)

    def _on_error(self, err: Any) -> None:
        if err.fatal():
            self.errors.append(f"fatal: {err}")
            self.fatal.set()

    def _replace_if_fatal(self) -> None:
        """After a fatal error (an idempotent producer that lost its sequence across a broker
        restart) nothing more is delivered: purge it (its records come back through their
        delivery reports, into ``extra``) and produce the rest with a new producer."""
        if not self.fatal.is_set():
            return
        self.producer.purge()
        self.producer.flush(5)  # serves the purged records' delivery reports
        self.producer = Producer(self.config)
        self.fatal.clear()
        self.replaced += 1

    def _on_delivery(self, item: Item, err: object, _msg: object) -> None:
        if err is None:
            self.acked.add(item.seq)
        else:
            self.errors.append(f"seq {item.seq}: {err}")
            with self.lock:
                self.extra.append(item)  # produce it again: the input must hold every planned record

    def _send(self, item: Item) -> None:
        key, value, headers, partition = self.materializer.record(item)
        # confluent_kafka's headers: a list of (name, str | bytes | None); a list is invariant, hence the copy
        wire_headers: list[tuple[str, str | bytes | None]] = list(headers)
        target = -1 if partition is None else partition  # -1: the producer's partitioner (produce's default)
        while True:
            try:
                self.producer.produce(
                    self.topic,
                    value,
                    key,
                    partition=target,
                    headers=wire_headers,
                    on_delivery=functools.partial(self._on_delivery, item),
                )
                break
            except BufferError:
                self.producer.poll(0.05)
        self.sent += 1

    def _run(self) -> None:
        began = time.monotonic()
        index = 0
        while not self.stop.is_set():
            due = min(len(self.stream), int((time.monotonic() - began) * self.rate) + 1)
            while index < due:
                item = self.stream[index]
                self._send(item)
                if item.copy == 0 and not item.malformed:
                    self.high_event = max(self.high_event, item.event)
                index += 1
            self._send_extra()
            self.producer.poll(0)
            self._replace_if_fatal()
            if index >= len(self.stream) and not self.extra and self.finishing.is_set():
                break
            time.sleep(0.02)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            self._replace_if_fatal()
            self._send_extra()  # failed deliveries, a replaced producer's purged records included
            if self.producer.flush(1) == 0 and not self.extra:
                break
        self.done.set()

    def _send_extra(self) -> None:
        while True:
            with self.lock:
                item = self.extra.popleft() if self.extra else None
            if item is None:
                return
            self._send(item)

    def start(self) -> None:
        self.thread.start()

    def finish(self, timeout: float) -> bool:
        """Produce what is left and flush; True when everything was acked."""
        self.finishing.set()
        return self.done.wait(timeout)


@dataclass
class Sample:
    at: float  # monotonic
    committed: dict[int, int]
    ends: dict[int, int]


class Monitor:
    """Samples the group's committed offsets and the input's end offsets four times a second."""

    def __init__(self, bootstrap: str, topic: str, group: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,  # only OffsetFetch: it never subscribes, so it never joins the group
                "enable.auto.commit": False,
                "socket.timeout.ms": 3000,
            }
        )
        self.samples: list[Sample] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="monitor", daemon=True)

    def sample(self) -> Sample | None:
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        try:
            committed = {tp.partition: tp.offset for tp in self.consumer.committed(tps, timeout=3)}
            ends = {
                p: self.consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=3, cached=False
                )[1]
                for p in range(self.partitions)
            }
        except KafkaException:
            return None
        committed = {p: max(o, 0) for p, o in committed.items()}
        return Sample(time.monotonic(), committed, ends)

    def _run(self) -> None:
        while not self.stop.is_set():
            s = self.sample()
            if s is not None:
                with self.lock:
                    self.samples.append(s)
            self.stop.wait(0.25)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.consumer.close()

    def latest(self) -> Sample | None:
        with self.lock:
            return self.samples[-1] if self.samples else None

    def since(self, at: float) -> list[Sample]:
        with self.lock:
            return [s for s in self.samples if s.at >= at]

    def lag(self) -> int | None:
        s = self.latest()
        return None if s is None else sum(max(0, s.ends[p] - s.committed[p]) for p in s.ends)

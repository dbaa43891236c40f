"""Contender processes: started with their logs, read from /proc, stopped (and killed at exit); free ports; the worker's flags and metrics."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from bench.lib.report import BenchError, pid_cpu_seconds, say, stat_cpu_seconds

ROOT = Path(__file__).resolve().parents[2]


PASSTHROUGH = Path(__file__).resolve().parents[1] / "passthrough.py"


_LIVE: list[subprocess.Popen[bytes]] = []


#: HotSpot's JIT compiler threads, by their name in /proc (cut at 15 characters)
JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")


@atexit.register
def _kill_leftovers() -> None:
    for process in _LIVE:
        if process.poll() is None:
            process.kill()


class Proc:
    """A contender's process, with /proc readings."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.started = time.monotonic()
        self.popen = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=dict(os.environ, PIPELINE_LOG_LEVEL="INFO", PYTHONUNBUFFERED="1", **(env or {})),
            start_new_session=True,  # Ctrl-C reaches the bench only, which stops this in order
        )
        _LIVE.append(self.popen)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def cpu_seconds(self) -> float:
        """utime + stime of the process (all its threads)."""
        return pid_cpu_seconds(self.pid)

    def jit_cpu_seconds(self) -> float:
        """utime + stime of the JVM's JIT compiler threads so far (0 for a process without them)."""
        total = 0.0
        with contextlib.suppress(OSError):  # the process is gone
            for task in Path(f"/proc/{self.pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError):  # the thread is gone
                    if (task / "comm").read_text().startswith(JIT_THREADS):
                        total += stat_cpu_seconds(task / "stat")
        return total

    def sockets(self) -> int:
        """Open socket descriptors of the process (TCP and Unix), counted in /proc/<pid>/fd."""
        count = 0
        with contextlib.suppress(OSError):  # the process is gone: nothing open
            for fd in Path(f"/proc/{self.pid}/fd").iterdir():
                with contextlib.suppress(OSError):  # closed since the listing
                    if str(fd.readlink()).startswith("socket:"):
                        count += 1
        return count

    def status_kib(self, field_name: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
        return 0

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def check(self) -> None:
        if not self.alive():
            raise BenchError(f"{self.name} exited with {self.popen.returncode}; log tail:\n{self.log_tail()}")

    async def stop(self, timeout: float = 30.0) -> int | None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if self.alive():
                say(f"  {self.name} did not stop within {timeout:.0f}s of SIGTERM; killing it")
                self.popen.kill()
                self.popen.wait()
        self._log.close()
        return self.popen.returncode


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_pair() -> int:
    """A port that is free, and so is the next one (a supervisor's children take base + i)."""
    for _ in range(50):
        port = free_port()
        if port < 65535:
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise BenchError("no two consecutive free ports")


def scrape_transactions(port: int) -> dict[str, float]:
    """The worker's own transaction metrics (commit time and records per transaction) from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for name in (
        "pipeline_transaction_commit_seconds_sum",
        "pipeline_transaction_commit_seconds_count",
        "pipeline_batch_records_sum",
        "pipeline_batch_records_count",
    ):
        found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        if found:
            values[name] = float(found.group(1))
    return values


def worker_bounds(commit_interval_ms: int | None, max_batch: int | None) -> list[str]:
    """The worker's ``--commit-interval-ms``/``--max-batch`` when given; else it runs with its own defaults."""
    bounds: list[str] = []
    if commit_interval_ms is not None:
        bounds += ["--commit-interval-ms", str(commit_interval_ms)]
    if max_batch is not None:
        bounds += ["--max-batch", str(max_batch)]
    return bounds

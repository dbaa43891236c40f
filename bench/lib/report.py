"""What a bench prints and measures around its contenders: progress lines, the machine, /proc readings, tables."""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import statistics
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLK_TCK = os.sysconf("SC_CLK_TCK")


STARTED = time.monotonic()


class BenchError(Exception):
    """A phase failed (a contender died, a phase timed out)."""


def say(message: str) -> None:
    """A progress line, with the time since the start."""
    print(f"[{time.monotonic() - STARTED:7.1f}s] {message}", flush=True)


def machine_info() -> dict[str, str]:
    """What the numbers were measured on."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = "unknown"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    kafka_version = "unknown"
    with contextlib.suppress(OSError):
        found = re.search(
            r"<kafka\.version>([^<]+)</kafka\.version>", (ROOT / "deploy/kafka/pom.xml").read_text()
        )
        if found:
            kafka_version = found.group(1)
    versions = {}
    for name in ("aiokafka", "rocksdict", "orjson"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "?"
    digest = hashlib.sha256()
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "ram": ram,
        "python": platform.python_version(),
        "kafka": kafka_version,
        "libraries": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "kernel": platform.release(),
        "pipeline sources": f"sha256 {digest.hexdigest()[:12]} (pipeline/**/*.py)",
    }


def machine_busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    total = sum(fields)
    return total - fields[3] - fields[4], total


def find_broker_pid(bootstrap: str) -> int | None:
    """The local Kafka broker serving ``bootstrap``'s port, if it runs on this machine."""
    port = bootstrap.split(",", maxsplit=1)[0].rsplit(":", 1)[-1]
    candidates = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "kafka.Kafka" in cmdline:
                candidates.append((f"/{port}/" in cmdline, int(entry.name)))
    candidates.sort(reverse=True)
    return candidates[0][1] if candidates and (candidates[0][0] or len(candidates) == 1) else None


def pid_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads)."""
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def stat_cpu_seconds(stat: Path) -> float:
    """utime + stime from a /proc ``stat`` file: a process's (``/proc/<pid>/stat``) or a thread's (``task/<tid>/stat``)."""
    raw = stat.read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def loadavg() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def percentile(sorted_values: list[float], pct: float) -> float:
    if not sorted_values:
        return float("nan")
    if len(sorted_values) == 1:
        return sorted_values[0]
    return statistics.quantiles(sorted_values, n=100, method="inclusive")[int(pct) - 1]


def print_markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A Markdown table: the first column left-aligned, the figures right-aligned."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        print("| " + " | ".join(cells) + " |")


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def log_findings(path: Path, limit: int = 8) -> list[str]:
    """WARNING/ERROR lines and tracebacks of a contender's log."""
    if not path.exists():
        return []
    lines = path.read_text(errors="replace").splitlines()
    return [line for line in lines if re.search(r" (WARNING|ERROR|CRITICAL) |Traceback", line)][:limit]

"""The wheel built from these sources, installed into a fresh virtualenv: helpers for the tests that run it.

The wheel is built from a copy of the sources and installed without its
dependencies into a virtualenv made with ``--without-pip``; the dependencies
come from this checkout's ``.venv`` through a ``.pth`` line, behind an import
guard that refuses every module whose distribution is not in the closure of
the wheel's own ``Requires-Dist`` (extras excluded). So ``pipeline`` is
imported from the wheel, and a command that needed an undeclared package (an
extra such as psycopg or faust, a dev tool) would fail here. Set
``PIPELINE_WHEEL_TEST_FROM_PYPI=1`` to install the dependencies from the
package index instead (slower, needs the network). The ``venv`` fixture
(``tests/integration/conftest.py``) builds it once per test session.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import orjson
from aiokafka.admin import AIOKafkaAdminClient

from pipeline.providers.signing import sign

ROOT = Path(__file__).resolve().parents[2]
# present in every fresh virtualenv of Python 3.11 (ensurepip), so never refused
_ALWAYS = {"pip", "setuptools", "pkg_resources", "_distutils_hack"}
SECRET_ENV = "WHEEL_TEST_STRIPE_SECRET"
OWN_DISTRIBUTION = "webhook-pipeline"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement(line: str) -> str | None:
    """The distribution a Requires-Dist line names, or None if only an extra asks for it."""
    requirement, _, marker = line.partition(";")
    if "extra" in marker:
        return None
    match = re.match(r"\s*([A-Za-z0-9._-]+)", requirement)
    return _normal(match[1]) if match else None


def dependency_closure(requires: list[str]) -> set[str]:
    """Every distribution installed here that ``requires`` (Requires-Dist lines) pulls in, transitively."""
    seen: set[str] = set()
    stack = [name for name in map(_requirement, requires) if name]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            stack += [n for n in map(_requirement, importlib.metadata.requires(name) or []) if n]
    return seen


def refused_modules(allowed: set[str]) -> list[str]:
    """Top-level modules installed here whose distributions are all outside ``allowed``.

    The project's own (``pipeline``) comes from the wheel.
    """
    refused = []
    for module, dists in importlib.metadata.packages_distributions().items():
        if module in _ALWAYS or not module.isidentifier():
            continue
        names = {_normal(d) for d in dists}
        if OWN_DISTRIBUTION in names:
            continue
        if not names & allowed:
            refused.append(module)
    return sorted(refused)


@dataclass(frozen=True)
class Venv:
    """A fresh virtualenv with the wheel installed."""

    root: Path
    wheel: Path

    @property
    def bin(self) -> Path:
        """Its scripts."""
        return self.root / "bin"


def run(
    argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=180, cwd=cwd, env=env)
    assert result.returncode == 0, f"{argv} failed:\n{result.stdout}\n{result.stderr}"
    return result


def build_wheel(work: Path) -> Path:
    source = work / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "pipeline", source / "pipeline", ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(work / "dist")])
    (wheel,) = (work / "dist").glob("webhook_pipeline-*.whl")
    return wheel


def install_with_guard(root: Path, wheel: Path) -> None:
    run([sys.executable, "-m", "venv", "--without-pip", str(root)])
    python = root / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)])
    site = Path(
        run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    )
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    requires = [line.split(":", 1)[1] for line in text.splitlines() if line.startswith("Requires-Dist:")]
    refused = refused_modules(dependency_closure(requires))
    assert "psycopg" in refused, "the guard must refuse an extra's module"
    (site / "_wheel_test_guard.py").write_text(
        "import sys\n"
        f"REFUSED = frozenset({refused!r})\n"
        "class Guard:  # every finder behind it: a refused module is absent, also to find_spec probes\n"
        "    def __init__(self, inner):\n"
        "        self.inner = inner\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] in REFUSED:\n"
        "            return None\n"
        "        return self.inner.find_spec(name, path, target)\n"
        "    def __getattr__(self, name):\n"
        "        return getattr(self.inner, name)\n"
        "sys.meta_path[:] = [Guard(finder) for finder in sys.meta_path]\n",
        encoding="utf-8",
    )
    (site / "_wheel_test_deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\nimport _wheel_test_guard\n", encoding="utf-8"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def environment(venv: Venv, path: str | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIPELINE_", "KAFKA_", "PYTHON", "VIRTUAL_ENV"))
    }
    env["PATH"] = path if path is not None else f"{venv.bin}{os.pathsep}{os.environ.get('PATH', '')}"
    env[SECRET_ENV] = "whsec_wheel_test_secret"
    env["PIPELINE_LOG_LEVEL"] = "WARNING"
    env["PYTHONUNBUFFERED"] = "1"  # up's lines arrive as printed
    return env


def wait_http(url: str, process: subprocess.Popen[str], timeout: float = 30.0) -> int:
    """Poll ``url`` until it answers; return the status."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"exited with {process.returncode}: {process.communicate()}"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {timeout}s")


def wait_for_line(process: subprocess.Popen[str], text: str, timeout: float = 60.0) -> None:
    """Read ``process``'s stdout (in a thread, so a silent process cannot hang the test) until a line has ``text``."""
    assert process.stdout is not None
    wait_for_match(process, process.stdout, re.escape(text), timeout)


def wait_for_match(
    process: subprocess.Popen[str], stream: IO[str], pattern: str, timeout: float = 60.0
) -> re.Match[str]:
    """Read ``stream`` of ``process`` (in a thread) until what it printed matches ``pattern``; the match."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    seen, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            seen += lines.get(timeout=0.5)
            match = re.search(pattern, seen)
            if match is not None:
                return match
        if process.poll() is not None and lines.empty():
            raise AssertionError(f"ended ({process.returncode}) before printing {pattern!r}: {seen}")
    raise AssertionError(f"{pattern!r} not printed within {timeout}s: {seen}")


def stop(process: subprocess.Popen[str], timeout: float = 30.0) -> tuple[int, str]:
    """SIGTERM ``process``; return its exit status and stderr."""
    process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
        raise AssertionError(f"did not stop within {timeout}s on SIGTERM:\n{err}") from None
    return process.returncode, err


@contextlib.contextmanager
def running(argv: list[str], cwd: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


async def delete_topics(bootstrap: str, prefix: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if t.startswith(prefix)]
        if names:
            await admin.delete_topics(names)
    finally:
        await admin.close()


def signed_post(url: str, event_id: str) -> int:
    body = orjson.dumps({"id": event_id, "object": "event", "type": "checkout.session.completed"})
    headers = sign("stripe", body, "whsec_wheel_test_secret", timestamp=time.time(), msg_id=event_id)
    request = urllib.request.Request(url, data=body, headers={**headers, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


def installed_wheel(work: Path) -> Venv:
    """The wheel built from these sources into ``work``, installed in a fresh virtualenv there."""
    wheel = build_wheel(work)
    root = work / "venv"
    if os.environ.get("PIPELINE_WHEEL_TEST_FROM_PYPI") == "1":
        run([sys.executable, "-m", "venv", str(root)])
        run([str(root / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)])
    else:
        install_with_guard(root, wheel)
    return Venv(root, wheel)

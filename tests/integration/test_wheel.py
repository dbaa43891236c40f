"""The wheel, installed into a fresh virtualenv, runs the operator's commands from an empty directory.

The wheel is built from a copy of the sources and installed without its
dependencies into a virtualenv made with ``--without-pip``; the dependencies
come from this checkout's ``.venv`` through a ``.pth`` line, behind an import
guard that refuses every module whose distribution is not in the closure of
the wheel's own ``Requires-Dist`` (extras excluded). So ``pipeline`` is
imported from the wheel, and a command that needed an undeclared package (an
extra such as psycopg or faust, a dev tool) would fail here. Set
``PIPELINE_WHEEL_TEST_FROM_PYPI=1`` to install the dependencies from the
package index instead (slower, needs the network).
"""

from __future__ import annotations

import asyncio
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from pipeline.native import COMPILED
from pipeline.providers.signing import sign

pytestmark = [pytest.mark.broker, pytest.mark.slow]

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

    The project's own (``pipeline`` and its compiled modules' shared library) come from the wheel.
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


def _run(
    argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=180, cwd=cwd, env=env)
    assert result.returncode == 0, f"{argv} failed:\n{result.stdout}\n{result.stderr}"
    return result


def _build_wheel(work: Path) -> Path:
    source = work / "src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    # the sources only: the wheel compiles its own hot modules (not the checkout's editable build)
    shutil.copytree(
        ROOT / "pipeline", source / "pipeline", ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    _run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(work / "dist")])
    (wheel,) = (work / "dist").glob("webhook_pipeline-*.whl")
    return wheel


def _install_with_guard(root: Path, wheel: Path) -> None:
    _run([sys.executable, "-m", "venv", "--without-pip", str(root)])
    python = root / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)])
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
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


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The wheel built from these sources, installed in a fresh virtualenv."""
    work = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(work)
    root = work / "venv"
    if os.environ.get("PIPELINE_WHEEL_TEST_FROM_PYPI") == "1":
        _run([sys.executable, "-m", "venv", str(root)])
        _run([str(root / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)])
    else:
        _install_with_guard(root, wheel)
    return Venv(root, wheel)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _environment(venv: Venv, path: str | None = None) -> dict[str, str]:
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


def _wait_http(url: str, process: subprocess.Popen[str], timeout: float = 30.0) -> int:
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


def _wait_for_line(process: subprocess.Popen[str], text: str, timeout: float = 60.0) -> None:
    """Read ``process``'s stdout (in a thread, so a silent process cannot hang the test) until a line has ``text``."""
    assert process.stdout is not None
    stdout = process.stdout
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
    seen, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            seen += lines.get(timeout=0.5)
            if text in seen:
                return
        if process.poll() is not None and lines.empty():
            raise AssertionError(f"ended ({process.returncode}) before printing {text!r}: {seen}")
    raise AssertionError(f"{text!r} not printed within {timeout}s: {seen}")


def _stop(process: subprocess.Popen[str], timeout: float = 30.0) -> tuple[int, str]:
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
def _running(argv: list[str], cwd: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


async def _delete_topics(bootstrap: str, prefix: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if t.startswith(prefix)]
        if names:
            await admin.delete_topics(names)
    finally:
        await admin.close()


def _signed_post(url: str, event_id: str) -> int:
    body = orjson.dumps({"id": event_id, "object": "event", "type": "checkout.session.completed"})
    headers = sign("stripe", body, "whsec_wheel_test_secret", timestamp=time.time(), msg_id=event_id)
    request = urllib.request.Request(url, data=body, headers={**headers, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


def test_the_wheel_runs_init_topics_worker_ingress_and_up_from_an_empty_directory(
    venv: Venv, bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """From an empty directory the installed wheel inits, creates topics, dedupes a webhook end to end, and runs up."""
    here = tmp_path / "empty"
    here.mkdir()
    env = _environment(venv)
    pipeline = str(venv.bin / "pipeline")
    app = unique("wheel")

    where = _run(
        [str(venv.bin / "python"), "-c", "import pipeline; print(pipeline.__file__)"], cwd=here, env=env
    )
    assert Path(where.stdout.strip()).is_relative_to(venv.root)
    assert _run([pipeline, "--version"], cwd=here, env=env).stdout.strip() == "pipeline 0.1.0"
    built = _run(
        [str(venv.bin / "python"), "-c", "from pipeline import native; print(native.describe())"],
        cwd=here,
        env=env,
    )
    assert built.stdout.strip() == f"hot modules compiled (mypyc): {len(COMPILED)} of {len(COMPILED)}"

    _run([pipeline, "init", ".", "--app", app], cwd=here, env=env)
    topology_file = here / "topologies" / "default.toml"
    assert (here / ".env.example").is_file()
    # one partition, and the stripe source's secret in a variable this test sets
    text = topology_file.read_text(encoding="utf-8").replace("partitions = 6", "partitions = 1")
    text = text.replace('["STRIPE_WEBHOOK_SECRET", "STRIPE_WEBHOOK_SECRET_PREVIOUS"]', f'["{SECRET_ENV}"]')
    topology_file.write_text(text, encoding="utf-8")
    try:
        created = _run([pipeline, "topics", "create", "--bootstrap", bootstrap], cwd=here, env=env)
        assert f"{app}.raw" in created.stdout

        metrics, port = _free_port(), _free_port()
        worker_argv = [pipeline, "worker", "--bootstrap", bootstrap, "--group", unique("group")]
        worker_argv += ["--state-dir", "state", "--metrics-port", str(metrics)]
        ingress_argv = [
            pipeline,
            "--log-level",
            "INFO",
            "ingress",
            "--bootstrap",
            bootstrap,
            "--port",
            str(port),
        ]
        with _running(worker_argv, here, env) as worker, _running(ingress_argv, here, env) as ingress:
            _wait_http(f"http://127.0.0.1:{metrics}/healthz", worker)
            assert _wait_http(f"http://127.0.0.1:{port}/healthz", ingress) == 200
            event_id = f"evt_{unique('wheel')}"
            assert _signed_post(f"http://127.0.0.1:{port}/webhooks/stripe", event_id) in {200, 202}
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline:
                tail = _run([pipeline, "tail", f"{app}.events", "--bootstrap", bootstrap], cwd=here, env=env)
                if event_id in tail.stdout:
                    break
            else:
                raise AssertionError(f"no command for {event_id} on {app}.events")
            code, err = _stop(ingress)
            assert code == 0, err
            assert "event loop uvloop" in err  # the installed ingress runs on uvloop, its default
            code, err = _stop(worker)
            assert code == 0, err

        assert _run([pipeline, "up", "--help"], cwd=here, env=env).returncode == 0
        up_argv = [pipeline, "up", "--bootstrap", bootstrap, "--state-dir", "up-state"]
        console = f"http://127.0.0.1:{_free_port()}"
        up_argv += ["--ingress-port", str(_free_port()), "--metrics-port", str(_free_port())]
        up_argv += ["--console-port", console.rsplit(":", 1)[1]]
        with _running(up_argv, here, env) as up:
            _wait_for_line(up, f"Console       {console}/")
            # the installed console renders its packaged templates and serves its packaged script and style
            assert _wait_http(f"{console}/", up) == 200
            for asset in ("console.js", "console.css"):
                assert _wait_http(f"{console}/static/{asset}", up) == 200
            with urllib.request.urlopen(f"{console}/keys/stripe%3A{event_id}", timeout=30) as page:
                assert "Processed: first seen" in page.read().decode()
            code, err = _stop(up)
            assert code == 0, err
    finally:
        asyncio.run(_delete_topics(bootstrap, app))


def test_the_installed_up_names_what_is_missing_for_a_local_broker(venv: Venv, tmp_path: Path) -> None:
    """Without Java on PATH, the installed ``pipeline up`` fails in one line naming Java and --bootstrap."""
    env = _environment(venv, path=str(venv.bin))
    result = subprocess.run(
        [str(venv.bin / "pipeline"), "up", "--kafka-port", str(_free_port())],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Java 17+ (java)" in result.stderr
    assert "--bootstrap" in result.stderr
    assert not (tmp_path / ".kafka").exists()

"""The wheel, installed into a fresh virtualenv, runs the operator's commands from an empty directory.

How the wheel is built and installed, and the guard that keeps undeclared
packages out: ``tests/integration/wheel.py``. A newcomer's mistakes on the
same install: ``tests/integration/test_wheel_mistakes.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.wheel import (
    SECRET_ENV,
    Venv,
    delete_topics,
    environment,
    free_port,
    run,
    running,
    signed_post,
    stop,
    wait_for_line,
    wait_http,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_the_wheel_runs_init_topics_worker_ingress_and_up_from_an_empty_directory(
    venv: Venv, bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """From an empty directory the installed wheel inits, creates topics, dedupes a webhook end to end, and runs up."""
    here = tmp_path / "empty"
    here.mkdir()
    env = environment(venv)
    pipeline = str(venv.bin / "pipeline")
    app = unique("wheel")

    where = run(
        [str(venv.bin / "python"), "-c", "import pipeline; print(pipeline.__file__)"], cwd=here, env=env
    )
    assert Path(where.stdout.strip()).is_relative_to(venv.root)
    assert run([pipeline, "--version"], cwd=here, env=env).stdout.strip() == "pipeline 0.1.0"

    run([pipeline, "init", ".", "--app", app], cwd=here, env=env)
    topology_file = here / "topologies" / "default.toml"
    assert (here / ".env.example").is_file()
    # one partition, and the stripe source's secret in a variable this test sets
    text = topology_file.read_text(encoding="utf-8").replace("partitions = 6", "partitions = 1")
    text = text.replace('["STRIPE_WEBHOOK_SECRET", "STRIPE_WEBHOOK_SECRET_PREVIOUS"]', f'["{SECRET_ENV}"]')
    topology_file.write_text(text, encoding="utf-8")
    try:
        created = run([pipeline, "topics", "create", "--bootstrap", bootstrap], cwd=here, env=env)
        assert f"{app}.raw" in created.stdout

        metrics, port = free_port(), free_port()
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
        with running(worker_argv, here, env) as worker, running(ingress_argv, here, env) as ingress:
            assert wait_http(f"http://127.0.0.1:{metrics}/readyz", worker) in {
                200,
                503,
            }  # served, or restoring
            assert wait_http(f"http://127.0.0.1:{port}/healthz", ingress) == 200
            event_id = f"evt_{unique('wheel')}"
            assert signed_post(f"http://127.0.0.1:{port}/webhooks/stripe", event_id) in {200, 202}
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline:
                tail = run([pipeline, "tail", f"{app}.events", "--bootstrap", bootstrap], cwd=here, env=env)
                if event_id in tail.stdout:
                    break
            else:
                raise AssertionError(f"no command for {event_id} on {app}.events")
            code, err = stop(ingress)
            assert code == 0, err
            assert "event loop uvloop" in err  # the installed ingress runs on uvloop, its default
            code, err = stop(worker)
            assert code == 0, err

        assert run([pipeline, "up", "--help"], cwd=here, env=env).returncode == 0
        up_argv = [pipeline, "up", "--bootstrap", bootstrap, "--state-dir", "up-state"]
        console = f"http://127.0.0.1:{free_port()}"
        up_argv += ["--ingress-port", str(free_port()), "--metrics-port", str(free_port())]
        up_argv += ["--console-port", console.rsplit(":", 1)[1]]
        with running(up_argv, here, env) as up:
            wait_for_line(up, f"Console       {console}/")
            # the installed console renders its packaged templates and serves its packaged script and style
            assert wait_http(f"{console}/", up) == 200
            for asset in ("console.js", "console.css"):
                assert wait_http(f"{console}/static/{asset}", up) == 200
            with urllib.request.urlopen(f"{console}/keys/stripe%3A{event_id}", timeout=30) as page:
                assert "Processed: first seen" in page.read().decode()
            code, err = stop(up)
            assert code == 0, err
    finally:
        asyncio.run(delete_topics(bootstrap, app))


def test_the_installed_up_names_what_is_missing_for_a_local_broker(venv: Venv, tmp_path: Path) -> None:
    """Without Java on PATH, the installed ``pipeline up`` fails in one line naming Java and --bootstrap."""
    env = environment(venv, path=str(venv.bin))
    result = subprocess.run(
        [str(venv.bin / "pipeline"), "up", "--kafka-port", str(free_port())],
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

"""The local Kafka broker ``pipeline up`` starts: the packaged ``kafka.sh``, run for one port.

The script is ``pipeline/ops/kafka/kafka.sh`` in the wheel (the checkout's
``deploy/kafka/kafka.sh``). It needs bash, Java 17+ and, the first time (to download
the Kafka jars from Maven Central), Maven. Its data and log are in ``./.kafka/<port>/``
unless ``KAFKA_RUN_DIR`` says otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline import resources
from pipeline.errors import ConfigError


def controller_port(port: int, environ: dict[str, str] | os._Environ[str] | None = None) -> int:
    """The controller port kafka.sh uses with broker port ``port``."""
    env = os.environ if environ is None else environ
    text = env.get("KAFKA_CONTROLLER_PORT", "")
    return int(text) if text.isdigit() else port + 1


@dataclass(frozen=True)
class LocalBroker:
    """The packaged broker script, run for one port with its data under ``run_dir``."""

    script: Path
    port: int
    run_dir: Path
    cache_dir: Path

    @classmethod
    def here(cls, port: int, environ: Mapping[str, str] | None = None) -> LocalBroker:
        """The broker of ``port``: data in ``$KAFKA_RUN_DIR`` or ``./.kafka``, jars in kafka.sh's cache."""
        env = os.environ if environ is None else environ
        cache = env.get("KAFKA_CACHE_DIR") or str(
            Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "webhook-pipeline"
        )
        return cls(
            script=resources.kafka_dir() / "kafka.sh",
            port=port,
            run_dir=Path(env.get("KAFKA_RUN_DIR") or Path.cwd() / ".kafka").resolve(),
            cache_dir=Path(cache),
        )

    @property
    def log_file(self) -> Path:
        """The broker's log."""
        return self.run_dir / str(self.port) / "kafka.log"

    def jars_cached(self) -> bool:
        """Whether kafka.sh has downloaded this Kafka version's jars already."""
        pom = self.script.with_name("pom.xml").read_text(encoding="utf-8")
        version = re.search(r"<kafka.version>(.*)</kafka.version>", pom)
        return version is not None and (self.cache_dir / f"kafka-{version[1]}" / "lib" / ".complete").exists()

    def missing(self) -> list[str]:
        """What this machine lacks to run the broker, as install hints (empty: nothing)."""
        if not self.script.is_file():
            return [f"the broker script {self.script} (reinstall webhook-pipeline)"]
        needs = [("bash", "bash"), ("java", "Java 17+ (java)")]
        if not self.jars_cached():
            needs.append(("mvn", "Maven (mvn, to download the Kafka jars once)"))
        return [what for command, what in needs if shutil.which(command) is None]

    def check(self) -> None:
        """Raise :class:`ConfigError` naming everything missing, in one line."""
        missing = self.missing()
        if missing:
            raise ConfigError(
                f"pipeline up needs {' and '.join(missing)} on PATH to start a local Kafka broker;"
                " install it, or give --bootstrap HOST:PORT of a running Kafka"
            )

    async def run(self, action: str) -> int:
        """Run ``kafka.sh ACTION PORT``; return its exit status."""
        env = dict(os.environ, KAFKA_RUN_DIR=str(self.run_dir), PYTHON=sys.executable)
        process = await asyncio.create_subprocess_exec(
            "bash", str(self.script), action, str(self.port), stdin=subprocess.DEVNULL, env=env
        )
        try:
            return await process.wait()
        except asyncio.CancelledError:  # interrupted: end the script too (its broker is stopped after)
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            await asyncio.shield(process.wait())
            raise

    def running(self) -> bool:
        """Whether a broker kafka.sh started for this port and run directory is alive (its pid file)."""
        pid_file = self.run_dir / str(self.port) / "kafka.pid"
        try:
            pid = int(pid_file.read_text(encoding="utf-8").strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return False
        return True

    def stop_detached(self) -> None:
        """Start ``kafka.sh stop PORT`` in its own session, so it finishes after this process exits."""
        env = dict(os.environ, KAFKA_RUN_DIR=str(self.run_dir), PYTHON=sys.executable)
        subprocess.Popen(  # noqa: S603  (our own script, fixed arguments)
            ["bash", str(self.script), "stop", str(self.port)],  # noqa: S607
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

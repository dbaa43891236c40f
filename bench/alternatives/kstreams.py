"""The Kafka Streams contender: build the Java app in ``kstreams/`` with Maven, and its command line.

The app (``kstreams/src``, see ``DedupeApp.java``) dedupes the bench's input with
``processing.guarantee=exactly_once_v2``, one stream thread and a persistent RocksDB
window store whose retention is the TTL. :func:`build` runs Maven once per change
of its sources: offline first (``mvn -o``, the jars cached in ``~/.m2``), online
if that fails. It leaves ``target/kstreams-dedupe.jar`` and the runtime classpath
in ``target/classpath.txt``; ``target/`` is never committed.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from pathlib import Path

from bench.lib.report import BenchError, say

APP = Path(__file__).resolve().parent / "kstreams"
JAR = APP / "target" / "kstreams-dedupe.jar"
CLASSPATH = APP / "target" / "classpath.txt"
MAIN = "dev.webhooks.bench.kstreams.DedupeApp"


def _sources() -> list[Path]:
    return [APP / "pom.xml", *(p for p in (APP / "src").rglob("*") if p.is_file())]


def _built() -> bool:
    if not (JAR.exists() and CLASSPATH.exists()):
        return False
    built_at = min(JAR.stat().st_mtime, CLASSPATH.stat().st_mtime)
    return all(p.stat().st_mtime <= built_at for p in _sources())


def build() -> str:
    """Build the app unless it is up to date; return the java classpath (the jar, then its dependencies)."""
    if not _built():
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BenchError("kstreams: mvn is not installed (apt-get install -y maven)")
        goals = [
            "-q",
            "-B",
            "-f",
            str(APP / "pom.xml"),
            "package",
            "dependency:build-classpath",
            f"-Dmdep.outputFile={CLASSPATH}",
        ]
        for offline in (True, False):
            say(f"  kstreams: building {APP.name}/ with Maven ({'offline' if offline else 'online'})")
            done = subprocess.run(
                [mvn, *(["-o"] if offline else []), *goals],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            if done.returncode == 0:
                break
        else:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise BenchError(f"kstreams: the Maven build failed:\n{tail}")
    return f"{JAR}:{CLASSPATH.read_text().strip()}"


def argv(
    classpath: str, *, bootstrap: str, input_topic: str, output: str, group: str, state: Path, commit_ms: int
) -> list[str]:
    """The JVM's command line: ``java`` itself is the process, so /proc readings are the JVM's."""
    java = shutil.which("java")
    if java is None:
        raise BenchError("kstreams: java is not installed (apt-get install -y openjdk-17-jdk-headless)")
    return [
        java,
        "-cp",
        classpath,
        MAIN,
        "--bootstrap",
        bootstrap,
        "--input",
        input_topic,
        "--output",
        output,
        "--group",
        group,
        "--state-dir",
        str(state),
        "--commit-interval-ms",
        str(commit_ms),
    ]


def versions() -> str:
    """Kafka Streams' version (the pom's) and the JVM's."""
    found = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", (APP / "pom.xml").read_text())
    java = "java ?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30, check=False)
        lines = out.stderr.strip().splitlines()
        if lines:
            java = lines[0]
    return f"kafka-streams {found.group(1) if found else '?'} on {java}"

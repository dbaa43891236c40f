"""The files shipped inside the package: the topologies and the local broker script.

The wheel carries ``pipeline/topologies/*.toml`` (and their reference,
``README.md``) and ``pipeline/ops/kafka/``
(``kafka.sh``, ``probe.py``, ``pom.xml``, ``log4j2.properties``), so an
installed ``pipeline`` works from any directory. In the checkout,
``deploy/kafka/`` links to ``pipeline/ops/kafka/`` and ``topologies/`` to
``pipeline/topologies/``: each file has one copy.

A topology option that names no existing file falls back to the packaged
topology of the same name: ``default``, ``default.toml`` and
``topologies/default.toml`` all mean ``pipeline/topologies/default.toml``
when there is no such file here.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.errors import TopologyError

log = logging.getLogger(__name__)

KAFKA_FILES = ("kafka.sh", "probe.py", "pom.xml", "log4j2.properties")


def package_dir() -> Path:
    """The installed ``pipeline`` package's directory."""
    return Path(__file__).resolve().parent


def topologies_dir() -> Path:
    """Where the packaged topologies are."""
    return package_dir() / "topologies"


def kafka_dir() -> Path:
    """Where the packaged local broker script and its files are."""
    return package_dir() / "ops" / "kafka"


def topology_reference() -> Path:
    """The topology reference (the checkout's ``topologies/README.md``) as the package carries it."""
    return topologies_dir() / "README.md"


def packaged_topologies() -> dict[str, Path]:
    """The packaged topologies by name (the file name without ``.toml``)."""
    return {path.stem: path for path in sorted(topologies_dir().glob("*.toml"))}


def _packaged_name(path: Path) -> str | None:
    """The packaged topology ``path`` may mean: ``NAME``, ``NAME.toml`` or ``topologies/NAME.toml``."""
    if path.is_absolute() or path.suffix not in {"", ".toml"}:
        return None
    if len(path.parts) == 1 or (len(path.parts) == 2 and path.parts[0] == "topologies"):
        return path.stem
    return None


def resolve_topology(text: str) -> Path:
    """The topology file a ``--topology`` value means.

    An existing file wins; otherwise a bare name or a ``topologies/NAME.toml``
    path means the packaged topology of that name. A bare name (no suffix)
    that is neither raises :class:`TopologyError` listing the packaged names;
    any other missing path is returned as it is, for ``topology.load`` to
    report.
    """
    path = Path(text)
    if path.exists():
        return path
    name = _packaged_name(path)
    packaged = packaged_topologies()
    if name is not None and name in packaged:
        log.info("topology %s: no such file here, using the packaged %s", text, packaged[name])
        return packaged[name]
    if path.suffix == "" and len(path.parts) == 1:
        names = ", ".join(packaged) or "none"
        raise TopologyError(
            [f"{text}: no such file, and no packaged topology of that name (packaged: {names})"]
        )
    return path

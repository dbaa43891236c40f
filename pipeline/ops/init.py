"""``pipeline init [DIR]``: a starter topology and an environment template in a directory.

Writes ``DIR/topologies/default.toml`` (the packaged default topology, its app
and topic names optionally renamed with ``--app``) and ``DIR/.env.example``
(every variable the worker, the ingress and the topology read, secrets
empty). ``topologies/default.toml`` is the default ``--topology``, so every
command run in ``DIR`` uses the written file. Existing files are kept unless
``force`` is given.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from pipeline import topology
from pipeline.errors import ConfigError, PipelineError
from pipeline.options import WORKER_OPTIONS
from pipeline.resources import packaged_topologies, topology_reference
from pipeline.topology import DEFAULT_TOPOLOGY, Topology
from pipeline.worker.settings import WORKER_DEFAULTS

DEFAULT_APP = "webhooks"
ENV_TEMPLATE = Path(".env.example")
_ENV_FIELDS = ("bootstrap", "topology", "state_dir", "group", "metrics_port")
# the app's own names in the packaged default topology: `name = "webhooks"`, "webhooks.raw", "webhooks-seen-changelog"
_APP_NAMES = re.compile(r'(?m)^(name|input|commands|audit|dlq|changelog)(\s*=\s*")webhooks([.-][^"]*)?"')


@dataclass(frozen=True)
class Written:
    """What ``init`` wrote."""

    topology: Path
    env: Path
    topo: Topology


def starter_topology(app: str = DEFAULT_APP) -> str:
    """The packaged default topology's text, its app and topic names starting with ``app``."""
    source = packaged_topologies().get("default")
    if source is None:
        raise PipelineError("the packaged default topology is missing: reinstall webhook-pipeline")
    text = source.read_text(encoding="utf-8")
    renamed = _APP_NAMES.sub(lambda m: f'{m[1]}{m[2]}{app}{m[3] or ""}"', text)
    return (
        "# Written by `pipeline init`: the packaged default topology"
        + (f' with the app named "{app}"' if app != DEFAULT_APP else "")
        + f".\n# Every key is described in the topology reference installed with it:\n#   {topology_reference()}\n"
        + renamed
    )


def _check_starter(text: str, app: str) -> Topology:
    topo = topology.parse(tomllib.loads(text), origin=f"pipeline init --app {app}")
    names = (topo.topics.input, topo.topics.commands, topo.topics.audit, topo.topics.dlq)
    if topo.app != app or not all(name.startswith(app) for name in names):
        raise PipelineError(f"the starter topology could not be renamed to app {app!r} (a bug)")
    return topo


def env_template(topo: Topology, topology_path: Path) -> str:
    """The ``.env.example`` text: the main settings with their defaults, and each secret variable empty."""
    options = {option.field: option for option in WORKER_OPTIONS}
    lines = [
        "# The pipeline's environment (written by `pipeline init`).",
        "# Copy it to .env, fill in the secrets and load it before a command:",
        "#   set -a; . ./.env; set +a",
        "# Never commit .env. `pipeline worker --help` and `pipeline ingress --help` list every",
        "# other variable (PIPELINE_*, PIPELINE_INGRESS_*).",
        "",
    ]
    for name in _ENV_FIELDS:
        option = options[name]
        value = topology_path if name == "topology" else WORKER_DEFAULTS.get(name, option.default)
        lines.append(f"# {option.env}=  (default: none)" if value is None else f"{option.env}={value}")
    lines += [
        "PIPELINE_LOG_LEVEL=INFO",
        "",
        "# Signing secrets, one variable per name in the topology's `secrets` (the second is for",
        "# rotation). A source whose variables are all empty refuses every request with 401.",
    ]
    for source in topo.sources.values():
        lines += [f"# source {source.name} ({source.provider})"]
        lines += [f"{name}=" for name in source.secret_env]
    return "\n".join(lines) + "\n"


def init(directory: Path, *, app: str = DEFAULT_APP, force: bool = False) -> Written:
    """Write the starter topology and ``.env.example`` into ``directory`` (created if missing)."""
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{directory}: not a directory")
    text = starter_topology(app)
    topo = _check_starter(text, app)
    topology_file = directory / DEFAULT_TOPOLOGY
    env_file = directory / ENV_TEMPLATE
    existing = [path for path in (topology_file, env_file) if path.exists()]
    if existing and not force:
        raise ConfigError(
            f"{', '.join(map(str, existing))} already exist{'s' if len(existing) == 1 else ''}"
            " (--force overwrites)"
        )
    try:
        topology_file.parent.mkdir(parents=True, exist_ok=True)
        topology_file.write_text(text, encoding="utf-8")
        env_file.write_text(env_template(topo, DEFAULT_TOPOLOGY), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write into {directory}: {exc.strerror or exc}") from None
    return Written(topology=topology_file, env=env_file, topo=topo)


def summary(written: Written) -> list[str]:
    """What ``pipeline init`` prints: the files and the next steps."""
    topics = written.topo.topics
    names = ", ".join((topics.input, topics.commands, topics.audit, topics.dlq, topics.changelog))
    return [
        f"wrote {written.topology} (app {written.topo.app}: topics {names})",
        f"wrote {written.env}",
        "next: cp .env.example .env; fill in the secrets; set -a; . ./.env; set +a",
        "      pipeline topics create; then pipeline worker and pipeline ingress",
        "      (or pipeline up, which starts a local Kafka too: needs Java 17 and Maven)",
    ]

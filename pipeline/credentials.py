"""Webhook secrets: read from the variables a source names, checked against its provider.

A secret its provider cannot use (a Standard Webhooks secret that is not
``whsec_<base64>``, a pasted newline, an API key where the signing secret
belongs) is a configuration error when the topology loads and again when the
ingress or a worker reads its secrets, so neither starts with it. Errors name
the variable and the source, never the value.

An unset or empty variable is not an error by itself: a rotation list names
optional variables (``..._PREVIOUS``), and the ingress answers 401 for a source
with no secret at all. A worker that verifies a source itself
(``verify = "worker"``) would dead-letter every record of it, so
:func:`require_secrets` refuses to start it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pipeline import topology
from pipeline.errors import ConfigError, TopologyError
from pipeline.topology import Source, Topology, Verify


def load_checked(path: str | os.PathLike[str], environ: Mapping[str, str]) -> Topology:
    """:func:`pipeline.topology.load`, then each secret variable set in ``environ`` must hold a value its
    provider can use (an unset one is not an error here); TopologyError naming the file otherwise."""
    topo = topology.load(path)
    problems = secret_problems(topo, environ)
    if problems:
        raise TopologyError([f"{Path(path)}: {problem}" for problem in problems])
    return topo


def source_secrets(source: Source, environ: Mapping[str, str] | None = None) -> list[str]:
    """The set secrets of ``source``, in rotation order; ConfigError when one is unusable."""
    env = os.environ if environ is None else environ
    problems = _problems(source, env)
    if problems:
        raise ConfigError("; ".join(problems))
    return [env[name] for name in source.secret_env if env.get(name)]


def secret_problems(topology: Topology, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every set secret variable of ``topology`` whose value its provider cannot use, said why."""
    env = os.environ if environ is None else environ
    return [problem for source in topology.sources.values() for problem in _problems(source, env)]


def require_secrets(
    topology: Topology, verified_at: Verify, environ: Mapping[str, str] | None = None
) -> None:
    """Raise ConfigError unless every source verified at ``verified_at`` has a usable secret."""
    env = os.environ if environ is None else environ
    problems = secret_problems(topology, env)
    for source in topology.sources.values():
        if source.verify is verified_at and not any(env.get(name) for name in source.secret_env):
            names = " or ".join(source.secret_env) or "a secret variable"
            problems.append(
                f"source {source.name!r} is verified in the {verified_at.value} but {names} is not set"
                " (or empty): set it, or set verify = 'none' in the topology"
            )
    if problems:
        raise ConfigError("; ".join(problems))


def _problems(source: Source, env: Mapping[str, str]) -> list[str]:
    from pipeline import providers  # noqa: PLC0415  (the presets load only when secrets are read)

    preset = providers.build(source.provider, **source.options)
    found = []
    for name in source.secret_env:
        value = env.get(name)
        if not value:
            continue
        problem = preset.secret_problem(value)
        if problem is not None:
            found.append(f"{name} (secret of source {source.name!r}, provider {source.provider}) {problem}")
    return found

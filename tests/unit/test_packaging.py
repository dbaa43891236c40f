"""Packaging: the package data, the dependencies, lazy optional imports, ``pipeline init`` and ``up``'s checks."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from pipeline import downstream, resources, topology
from pipeline.cli import main
from pipeline.errors import ConfigError, MissingExtraError, TopologyError
from pipeline.ops.init import init
from pipeline.stack.local_broker import LocalBroker
from pipeline.topology import DEFAULT_TOPOLOGY

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No topology or Kafka setting leaks in from the environment that runs the tests."""
    for name in list(os.environ):
        if name.startswith(("PIPELINE_", "KAFKA_")):
            monkeypatch.delenv(name)


def _requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match is not None, requirement
    return match[0].lower()


# -- package data ---------------------------------------------------------------------------------


def test_the_checkouts_topologies_are_the_packaged_ones() -> None:
    """topologies/ is a link to pipeline/topologies/: one copy of each topology and of their reference."""
    link = ROOT / "topologies"
    assert link.is_symlink()
    assert link.resolve() == resources.topologies_dir()
    assert "default" in resources.packaged_topologies()
    assert resources.topology_reference().is_file()


def test_packaged_broker_files_are_deploy_kafka_byte_for_byte() -> None:
    """pipeline/ops/kafka/ carries deploy/kafka/'s script, probe, pom and log config unchanged, scripts executable."""
    for name in resources.KAFKA_FILES:
        packaged, repo = resources.kafka_dir() / name, ROOT / "deploy" / "kafka" / name
        assert packaged.read_bytes() == repo.read_bytes(), f"{packaged} differs from {repo}"
    for script in (resources.kafka_dir() / "kafka.sh", ROOT / "deploy" / "kafka" / "kafka.sh"):
        assert os.access(script, os.X_OK), f"{script} is not executable"


def test_pyproject_ships_every_packaged_file() -> None:
    """Each packaged topology, broker file and console template, script and style sheet matches a package-data pattern."""
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["pipeline"]
    shipped = [*resources.packaged_topologies().values(), resources.topology_reference()]
    shipped += [resources.kafka_dir() / name for name in resources.KAFKA_FILES]
    console = resources.package_dir() / "console"
    shipped += [*(console / "templates").iterdir(), *(console / "static").iterdir()]
    for path in shipped:
        relative = path.relative_to(resources.package_dir()).as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), relative


# -- dependencies ---------------------------------------------------------------------------------


def test_core_dependencies_have_upper_bounds_and_no_extras_in_them() -> None:
    """Every core pin has an upper bound; faust-streaming and psycopg are extras, not core dependencies."""
    core = PROJECT["dependencies"]
    for requirement in core:
        assert "<" in requirement, f"{requirement} has no upper bound"
    names = {_requirement_name(r) for r in core}
    assert names.isdisjoint({"faust-streaming", "psycopg"})
    extras = PROJECT["optional-dependencies"]
    assert [_requirement_name(r) for r in extras["postgres"]] == ["psycopg"]
    assert [_requirement_name(r) for r in extras["faust"]] == ["faust-streaming"]
    assert extras["downstream"] == ["webhook-pipeline[postgres]"]
    assert "webhook-pipeline[postgres,faust]" in extras["dev"]


def test_no_pipeline_module_needs_an_extra_to_import() -> None:
    """With faust, mode, psycopg and the dev tools unimportable, every pipeline module still imports."""
    blocked = ["faust", "mode", "psycopg", "psycopg_binary", "stripe", "standardwebhooks", "slack_sdk"]
    blocked += ["yaml", "confluent_kafka", "quixstreams", "redis"]
    code = (
        "import sys, pkgutil, importlib\n"
        f"sys.modules.update(dict.fromkeys({blocked!r}))\n"
        "import pipeline\n"
        "for module in pkgutil.walk_packages(pipeline.__path__, 'pipeline.'):\n"
        "    if module.name != 'pipeline.__main__':\n"
        "        importlib.import_module(module.name)\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_downstream_without_psycopg_names_the_extra_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without psycopg, the PostgreSQL helpers raise one line naming the postgres extra; the rest works."""
    monkeypatch.setitem(sys.modules, "psycopg", None)
    command = downstream.Command("handle", "stripe:evt_1", "stripe:evt_1", "stripe", None, 1, {})
    assert downstream.Command.from_record(None, command.to_json()) == command
    with pytest.raises(MissingExtraError) as info:
        downstream.ensure_schema(object(), service="orders")  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    assert "pip install 'webhook-pipeline[postgres]'" in message
    assert isinstance(info.value, ImportError)


@pytest.mark.parametrize(
    ("example", "missing", "extra"),
    [
        ("postgres_orders.py", "psycopg", "postgres"),
        ("faust_consumer.py", "faust", "faust,postgres"),
        ("faust_consumer.py", "psycopg", "faust,postgres"),
    ],
)
def test_an_example_without_its_extra_says_so_in_one_line(example: str, missing: str, extra: str) -> None:
    """An example run without its extra's package ends in one line naming the pip install, exit 1."""
    code = (
        f"import runpy, sys; sys.modules[{missing!r}] = None; sys.argv = ['x', '--help']; "
        f"runpy.run_path({str(ROOT / 'examples' / example)!r}, run_name='__main__')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False, timeout=60
    )
    assert result.returncode == 1, result.stdout
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"needs {missing}: pip install 'webhook-pipeline[{extra}]'" in result.stderr


# -- topology resolution --------------------------------------------------------------------------


def test_an_existing_topology_file_wins_over_the_packaged_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topologies/default.toml in the working directory is used, not the packaged one."""
    monkeypatch.chdir(tmp_path)
    init(tmp_path, app="local-app")
    resolved = resources.resolve_topology(str(DEFAULT_TOPOLOGY))
    assert resolved == DEFAULT_TOPOLOGY
    assert topology.load(resolved).app == "local-app"


@pytest.mark.parametrize("text", ["default", "default.toml", "topologies/default.toml"])
def test_a_missing_default_or_bare_name_means_the_packaged_topology(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From an empty directory, the default path and the bare name resolve to pipeline/topologies/default.toml."""
    monkeypatch.chdir(tmp_path)
    resolved = resources.resolve_topology(text)
    assert resolved == resources.topologies_dir() / "default.toml"
    assert topology.load(resolved).topics.input == "webhooks.raw"


def test_an_unknown_bare_name_lists_the_packaged_topologies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bare name that is neither a file nor packaged fails naming the packaged topologies."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TopologyError, match=r"nosuch: .*packaged: default, github, stripe-fulfilment"):
        resources.resolve_topology("nosuch")
    missing = tmp_path / "elsewhere" / "t.toml"
    assert resources.resolve_topology(str(missing)) == missing  # left for topology.load to report


def test_topics_create_from_an_empty_directory_uses_the_packaged_topology(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pipeline topics create`` with no --topology, run outside the checkout, creates the default topics."""
    monkeypatch.chdir(tmp_path)
    asked: list[str] = []

    async def fake_ensure_topics(bootstrap: str, specs: list[Any], timeout: float = 10.0) -> list[Any]:
        asked.extend(spec.name for spec in specs)
        return []

    monkeypatch.setattr("pipeline.kafka.admin.ensure_topics", fake_ensure_topics)
    assert main(["topics", "create", "--bootstrap", "127.0.0.1:1"]) == 0
    assert "webhooks.raw" in asked
    assert "file not found" not in capsys.readouterr().err


# -- pipeline init --------------------------------------------------------------------------------


def test_init_writes_a_loadable_topology_and_an_env_template(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pipeline init DIR --app NAME`` writes topologies/default.toml with NAME's topics and .env.example."""
    assert main(["init", str(tmp_path / "new"), "--app", "orders"]) == 0
    topo = topology.load(tmp_path / "new" / "topologies" / "default.toml")
    assert topo.app == "orders"
    topics = topo.topics
    assert (topics.input, topics.commands, topics.audit, topics.dlq, topics.changelog) == (
        "orders.raw",
        "orders.events",
        "orders.deliveries",
        "orders.dlq",
        "orders-seen-changelog",
    )
    env = (tmp_path / "new" / ".env.example").read_text(encoding="utf-8")
    assert "KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092\n" in env
    assert "PIPELINE_TOPOLOGY=topologies/default.toml\n" in env
    for source in topo.sources.values():
        for name in source.secret_env:
            assert f"\n{name}=\n" in env
    assert "wrote" in capsys.readouterr().out
    header = (tmp_path / "new" / "topologies" / "default.toml").read_text(encoding="utf-8")[:400]
    cited = re.search(r"^#\s+(/\S*README\.md)$", header, re.MULTILINE)
    assert cited is not None, header
    assert Path(cited[1]).is_file()


def test_init_keeps_existing_files_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A second ``init`` fails with one line and changes nothing; ``--force`` overwrites."""
    assert main(["init", str(tmp_path)]) == 0
    written = tmp_path / "topologies" / "default.toml"
    written.write_text("# mine\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["init", str(tmp_path), "--app", "other"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "already exist" in err
    assert "--force" in err
    assert written.read_text(encoding="utf-8") == "# mine\n"
    assert main(["init", str(tmp_path), "--app", "other", "--force"]) == 0
    assert topology.load(written).app == "other"


def test_init_rejects_an_invalid_app_name(tmp_path: Path) -> None:
    """An app name the topology rejects fails before anything is written."""
    with pytest.raises(ConfigError, match=r"app\.name"):
        init(tmp_path, app="Not Valid")
    assert list(tmp_path.iterdir()) == []


# -- pipeline up's checks -------------------------------------------------------------------------


def test_up_without_java_fails_in_one_line_naming_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With nothing on PATH and no cached jars, ``up`` names bash, Java and Maven in one line and exits 1."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setenv("KAFKA_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["up", "--kafka-port", "1", "--ingress-port", "0", "--metrics-port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "Java 17+ (java)" in err
    assert "Maven (mvn" in err
    assert "--bootstrap" in err
    assert not (tmp_path / ".kafka").exists()


def test_up_needs_no_maven_once_the_jars_are_cached(tmp_path: Path) -> None:
    """Maven is only needed while kafka.sh's cache has no jars for the pom's Kafka version."""
    pom = (resources.kafka_dir() / "pom.xml").read_text(encoding="utf-8")
    version = re.search(r"<kafka.version>(.*)</kafka.version>", pom)
    assert version is not None
    environ = {"KAFKA_CACHE_DIR": str(tmp_path), "KAFKA_RUN_DIR": str(tmp_path / "run")}
    broker = LocalBroker.here(9092, environ)
    assert not broker.jars_cached()
    lib = tmp_path / f"kafka-{version[1]}" / "lib"
    lib.mkdir(parents=True)
    (lib / ".complete").touch()
    assert broker.jars_cached()
    assert broker.log_file == tmp_path / "run" / "9092" / "kafka.log"

"""The deployment files stay valid and agree with the code."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from pipeline import topology
from pipeline.cli import build_parser
from pipeline.ingress.metrics import IngressMetrics
from pipeline.state.decision import Outcome
from pipeline.worker.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "pipeline.json"
K8S = ROOT / "deploy" / "k8s"
DEFAULT_TOPOLOGY = ROOT / "topologies" / "default.toml"
IMAGE_WORKDIR = "/app"  # the Dockerfile's WORKDIR, where it copies topologies/
#: Labels Prometheus adds to every scraped series, plus the histogram bucket label.
SCRAPE_LABELS = frozenset({"instance", "job", "le"})
_METRIC = re.compile(r"\bpipeline_[a-z0-9_]+\b")


# -- helpers ------------------------------------------------------------------------------------
def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _compose() -> dict[str, Any]:
    data = _load_yaml(COMPOSE)
    assert isinstance(data, dict)
    return data


def _service(name: str) -> dict[str, Any]:
    services = _compose()["services"]
    assert name in services, f"docker-compose.yml has no {name!r} service"
    return dict(services[name])


def _k8s_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def _k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in [*_k8s_files(), K8S / "templates" / "secret.yaml"]:
        docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return docs


def _k8s(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in _k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name} in deploy/k8s, found {len(found)}"
    return found[0]


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            word, _, rest = stripped.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in _dockerfile_instructions():
        if word == "ENV":
            for token in shlex.split(rest):
                name, _, value = token.partition("=")
                env[name] = value
    return env


def _parse(argv: list[str], env: Mapping[str, Any], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """Parse ``argv`` (after ``pipeline``) with the real parser, in exactly the environment ``env``."""
    for name in list(os.environ):
        if name.startswith("PIPELINE_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    try:
        return build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"`pipeline {shlex.join(argv)}` is not a valid pipeline command line")


def _compose_args(name: str, monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    service = _service(name)
    command = service["command"]
    assert command[0] == "pipeline", f"{name}: runs {command[0]!r}, not the pipeline CLI"
    return _parse(command[1:], _image_env() | dict(service.get("environment") or {}), monkeypatch)


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def _k8s_env(container: dict[str, Any]) -> dict[str, str]:
    """The environment of a k8s container: image ENV, then envFrom ConfigMaps/Secrets, then env."""
    env = _image_env()
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env |= _k8s("ConfigMap", source["configMapRef"]["name"])["data"]
        if "secretRef" in source:
            secret = _k8s("Secret", source["secretRef"]["name"])
            env |= secret.get("stringData", {}) | secret.get("data", {})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[item["name"]] = "pipeline-worker-0"  # the downward API gives the pod name
    return env


def _k8s_args(workload: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    container = _container(workload)
    command = container.get("command") or container["args"]
    assert command[0] == "pipeline"
    return _parse(command[1:], _k8s_env(container), monkeypatch)


def _port(container: dict[str, Any], port: int | str) -> int:
    """Resolve a named container port."""
    if isinstance(port, int):
        return port
    for item in container["ports"]:
        if item["name"] == port:
            return int(item["containerPort"])
    pytest.fail(f"container {container['name']} has no port named {port!r}")


PROCESS_PREFIXES = ("process_", "python_")  # prometheus_client's process, platform and GC collectors


def _metric_labels() -> dict[str, frozenset[str]]:
    """Every sample name the code's registries can expose, with its label names."""
    names: dict[str, frozenset[str]] = {}
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("", "_count", "_sum", "_created"),
    }
    worker = WorkerMetrics.create()
    for field in dataclasses.fields(worker):
        metric = getattr(worker, field.name)
        if not isinstance(metric, MetricWrapperBase):
            continue
        labels = frozenset(metric._labelnames)
        assert metric._type is not None  # each metric class names its type
        for suffix in suffixes[metric._type]:
            extra = {"le"} if suffix == "_bucket" else set()
            names[metric._name + suffix] = labels | extra
    # the ingress counts in its own collector: one request shows every sample it exposes
    ingress = IngressMetrics.create()
    ingress.request("stripe", 202, 0.01)
    ingress.body(100)
    for metrics in (worker, ingress):
        # and the registry agrees (no metric outside the dataclass fields but the process collectors)
        for family in metrics.registry.collect():
            if family.name.startswith(PROCESS_PREFIXES) or metrics is ingress:
                for sample in family.samples:
                    names[sample.name] = frozenset(sample.labels)
                continue
            assert any(name.startswith(family.name) for name in names), family.name
    return names


def _dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _targets() -> list[tuple[str, dict[str, Any]]]:
    """(panel title, target) for every query in the dashboard."""
    return [
        (panel.get("title", ""), target)
        for panel in _panels(_dashboard()["panels"])
        for target in panel.get("targets", [])
    ]


def _topology() -> topology.Topology:
    return topology.load(DEFAULT_TOPOLOGY)


# -- the compose file ---------------------------------------------------------------------------
def test_docker_compose_file_is_valid() -> None:
    """docker-compose validates the compose file (no engine needed)."""
    if shutil.which("docker-compose") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("docker-compose is missing: scripts/bootstrap installs it")
        pytest.skip("docker-compose is not installed")
    result = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_compose_runs_the_kafka_version_the_broker_script_pins() -> None:
    """The compose file's apache/kafka image tag is the version deploy/kafka/pom.xml fetches."""
    pom = (ROOT / "deploy" / "kafka" / "pom.xml").read_text()
    pinned = re.search(r"<kafka.version>(.+?)</kafka.version>", pom)
    assert pinned is not None
    compose = (ROOT / "docker-compose.yml").read_text()
    assert f"image: apache/kafka:{pinned.group(1)}" in compose


def test_every_deployment_file_parses() -> None:
    """Every YAML file (multi-document aware) and the dashboard JSON parse."""
    yamls = [COMPOSE, PROMETHEUS, *GRAFANA.rglob("*.yml"), *GRAFANA.rglob("*.yaml"), *K8S.glob("*.yaml")]
    assert len(yamls) >= 10
    for path in yamls:
        docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        assert docs, f"{path} is empty"
        assert all(isinstance(doc, dict) for doc in docs), path
    assert _dashboard()["panels"]
    assert "name" not in _compose(), "docker-compose 1.29 rejects a top-level name"


def test_compose_commands_are_real_subcommands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pipeline service runs a real `pipeline` subcommand the parser accepts."""
    expected = {"topics": ("topics", "create"), "ingress": ("ingress", None), "worker": ("worker", None)}
    for name, (command, action) in expected.items():
        args = _compose_args(name, monkeypatch)
        assert args.command == command, name
        assert getattr(args, "topics_command", None) == action, name
        assert args.bootstrap == "kafka:19092", f"{name}: must use the broker's in-network listener"
    assert "PLAINTEXT://kafka:19092" in _service("kafka")["environment"]["KAFKA_ADVERTISED_LISTENERS"]


def test_compose_topology_is_the_one_shipped_in_the_image(monkeypatch: pytest.MonkeyPatch) -> None:
    """The topology path the services use is the repository file the Dockerfile copies, and it loads."""
    instructions = _dockerfile_instructions()
    assert ("WORKDIR", IMAGE_WORKDIR) in instructions
    assert ("COPY", "pipeline/topologies ./topologies") in instructions
    for name in ("topics", "ingress", "worker"):
        path = Path(_compose_args(name, monkeypatch).topology)
        if path.is_absolute():
            path = path.relative_to(IMAGE_WORKDIR)
        assert ROOT / path == DEFAULT_TOPOLOGY, name
    topo = topology.load(DEFAULT_TOPOLOGY)
    assert topo.topics.input
    assert topo.sources


def test_compose_ports_match_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ingress's published port and the worker's exposed port are the ports the CLI listens on."""
    ingress = _compose_args("ingress", monkeypatch)
    assert ingress.host == "0.0.0.0", "the ingress must listen on every interface in a container"
    published = [str(p).split(":") for p in _service("ingress")["ports"]]
    assert [str(ingress.port)] == [p[-1] for p in published], published
    worker = _compose_args("worker", monkeypatch)
    assert worker.metrics_port is not None, "the worker must serve /metrics for Prometheus and inspect"
    assert [str(p) for p in _service("worker")["expose"]] == [str(worker.metrics_port)]
    for name, port, path in (
        ("ingress", ingress.port, "/readyz"),
        ("worker", worker.metrics_port, "/readyz"),
    ):
        check = " ".join(_service(name)["healthcheck"]["test"])
        assert f"127.0.0.1:{port}{path}" in check, name


def test_compose_worker_scales_with_its_own_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker has no fixed container name or host port, and each replica an anonymous state volume."""
    worker = _service("worker")
    assert "container_name" not in worker
    for port in worker.get("ports", []):
        assert ":" not in str(port), f"a fixed host port stops `--scale worker=N`: {port}"
    state_dir = _compose_args("worker", monkeypatch).state_dir
    assert worker["volumes"] == [state_dir], "one anonymous volume per replica, at the state dir"
    assert ("VOLUME", f'["{state_dir}"]') in _dockerfile_instructions()
    assert int(re.sub(r"\D", "", worker["stop_grace_period"])) >= 30


def test_dockerfile_runs_as_non_root_and_exposes_the_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    """The image is python:3.11-slim, runs as a non-root user and exposes the CLI's ports."""
    instructions = _dockerfile_instructions()
    assert ("FROM", "python:3.11-slim") in instructions
    users = [rest for word, rest in instructions if word == "USER"]
    assert users
    assert users[-1].split(":")[0] not in {"root", "0"}
    exposed = {int(p) for word, rest in instructions if word == "EXPOSE" for p in rest.split()}
    env = _image_env()
    assert _parse(["ingress"], env, monkeypatch).port in exposed
    assert _parse(["worker"], env, monkeypatch).metrics_port in exposed


def test_webhook_secrets_match_the_topology() -> None:
    """The compose ingress and the k8s Secret carry exactly the secret variables the topology names."""
    names = {name for source in _topology().sources.values() for name in source.secret_env}
    assert names
    env = _service("ingress")["environment"]
    assert names <= set(env)
    secret = _k8s("Secret", "pipeline-webhook-secrets")
    assert set(secret["stringData"]) == names
    assert all(value == "" for value in secret["stringData"].values()), "template: no guessable secret"


# -- Prometheus and Grafana ---------------------------------------------------------------------
def test_dashboard_metrics_exist_in_the_code() -> None:
    """Every pipeline_* name in the dashboard's queries and the Prometheus config is a sample the code exposes."""
    known = _metric_labels()
    used = {name for _, target in _targets() for name in _METRIC.findall(target["expr"])}
    used |= set(_METRIC.findall(PROMETHEUS.read_text()))
    assert used, "the dashboard queries no pipeline metric"
    assert used <= set(known), f"not exposed by the code: {sorted(used - set(known))}"


def test_dashboard_labels_exist_on_their_metrics() -> None:
    """Grouping, selector and legend labels in each query are labels of the metrics it reads."""
    known = _metric_labels()
    outcomes = {o.value for o in Outcome}
    for title, target in _targets():
        expr = target["expr"]
        labels = set(SCRAPE_LABELS)
        for name in _METRIC.findall(expr):
            labels |= known.get(name, frozenset())
        grouped: set[str] = set()
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            grouped |= {label.strip() for label in group.split(",") if label.strip()}
        for selector in re.findall(r"\{([^}]*)\}", expr):
            for label, value in re.findall(r'(\w+)\s*(?:=~|!=|!~|=)\s*"([^"]*)"', selector):
                assert label in labels, f"{title}: {label!r} is no label of {expr}"
                if label == "outcome":
                    assert value in outcomes, f"{title}: no outcome {value!r}"
        assert grouped <= labels, f"{title}: {sorted(grouped - labels)} not labels of {expr}"
        legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
        assert legend <= grouped | SCRAPE_LABELS, f"{title}: legend {legend} not grouped by"


def test_dashboard_has_the_operational_panels() -> None:
    """The dashboard shows throughput, duplicates, lag, commit latency, DLQ and the ingress."""
    by_title = {title: [t["expr"] for t in targets] for title, targets in _panel_targets().items()}
    wanted = {
        "Throughput by outcome": ["by (outcome)", "rate(pipeline_events_total"],
        "Duplicate rate": ['pipeline_events_total{outcome="duplicate"}', "/"],
        "Consumer lag": ["pipeline_consumer_lag"],
        "Transaction commit latency": [
            "histogram_quantile(0.5,",
            "histogram_quantile(0.99,",
            "pipeline_transaction_commit_seconds_bucket",
        ],
        "DLQ records by reason": ["by (reason)", "pipeline_dlq_records_total"],
        "Ingress requests by status": ["by (status)", "pipeline_ingress_requests_total"],
        "Ingress latency": ["histogram_quantile(0.99,", "pipeline_ingress_request_seconds_bucket"],
    }
    for title, fragments in wanted.items():
        assert title in by_title, f"no panel {title!r}"
        joined = " ".join(by_title[title])
        for fragment in fragments:
            assert fragment in joined, f"{title}: {fragment!r} not in {joined}"


def _panel_targets() -> dict[str, list[dict[str, Any]]]:
    return {p["title"]: p["targets"] for p in _panels(_dashboard()["panels"]) if p.get("targets")}


def test_dashboard_uses_the_provisioned_datasource() -> None:
    """Every panel and query points at the datasource uid Grafana provisioning creates."""
    datasources = _load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    uids = {ds["uid"] for ds in datasources if ds["type"] == "prometheus"}
    assert len(uids) == 1
    for panel in _panels(_dashboard()["panels"]):
        for item in [panel, *panel.get("targets", [])]:
            if "datasource" in item:
                assert item["datasource"]["uid"] in uids, panel.get("title")
    (url,) = [ds["url"] for ds in datasources]
    host, port = url.removeprefix("http://").split(":")
    assert host in _compose()["services"]
    assert f"{port}:{port}" in _service(host)["ports"]


def test_grafana_provisioning_paths_match_the_compose_mounts() -> None:
    """Grafana finds the provisioning and the dashboard where docker-compose mounts them."""
    mounts = {}
    for volume in _service("grafana")["volumes"]:
        source, target = volume.split(":")[:2]
        mounts[source.removeprefix("./")] = target
    assert mounts["deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    dashboards = mounts["deploy/grafana/dashboards"]
    providers = _load_yaml(GRAFANA / "provisioning" / "dashboards" / "pipeline.yml")["providers"]
    assert [p["options"]["path"] for p in providers] == [dashboards]
    home = _service("grafana")["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{dashboards}/{DASHBOARD.name}"
    prometheus = _service("prometheus")["volumes"][0].split(":")
    assert ROOT / prometheus[0] == PROMETHEUS
    assert f"--config.file={prometheus[1]}" in _service("prometheus")["command"]


def test_prometheus_scrapes_the_ingress_and_every_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prometheus scrapes the ingress and all worker replicas (DNS discovery) on the CLI's ports."""
    jobs = {job["job_name"]: job for job in _load_yaml(PROMETHEUS)["scrape_configs"]}
    ingress = _compose_args("ingress", monkeypatch)
    worker = _compose_args("worker", monkeypatch)
    ingress_job = next(j for j in jobs.values() if "ingress" in j["job_name"])
    targets = [t for sc in ingress_job["static_configs"] for t in sc["targets"]]
    assert targets == [f"ingress:{ingress.port}"]
    worker_job = next(j for j in jobs.values() if "worker" in j["job_name"])
    (sd,) = worker_job["dns_sd_configs"]
    assert sd["type"] == "A"
    assert sd["port"] == worker.metrics_port
    assert sd["names"] == ["worker"], "the compose service name resolves to every replica"
    for job in (ingress_job, worker_job):
        assert job.get("metrics_path", "/metrics") == "/metrics"


# -- Kubernetes ---------------------------------------------------------------------------------
def test_kustomization_lists_every_manifest() -> None:
    """kustomization.yaml lists exactly the manifests in deploy/k8s, all in one namespace."""
    kustomization = _load_yaml(K8S / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(p.name for p in _k8s_files())
    (namespace,) = [d for d in _k8s_docs() if d["kind"] == "Namespace"]
    assert kustomization["namespace"] == namespace["metadata"]["name"]
    for doc in _k8s_docs():
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
        assert "namespace" not in doc["metadata"], "kustomization.yaml sets the namespace"


def test_k8s_commands_are_real_subcommands(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker, ingress and topics Job run real `pipeline` subcommands with a loadable topology."""
    workloads = {
        "worker": _k8s("StatefulSet", "pipeline-worker"),
        "ingress": _k8s("Deployment", "pipeline-ingress"),
        "topics": _k8s("Job", "pipeline-topics"),
    }
    for command, workload in workloads.items():
        args = _k8s_args(workload, monkeypatch)
        assert args.command == command
        if command == "topics":
            assert args.topics_command == "create"
            assert workload["spec"]["template"]["spec"]["restartPolicy"] in {"OnFailure", "Never"}
        # the topology path is the ConfigMap mounted in the pod
        container = _container(workload)
        path = Path(args.topology)
        mounts = {Path(m["mountPath"]): m["name"] for m in container["volumeMounts"]}
        assert path.parent in mounts, f"{command}: {path} is not on a mounted volume"
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        config_map = _k8s("ConfigMap", volumes[mounts[path.parent]]["configMap"]["name"])
        assert path.name in config_map["data"]


def test_k8s_topology_config_map_is_the_default_topology() -> None:
    """The topology ConfigMap is topologies/default.toml, byte for byte, and it validates."""
    text = _k8s("ConfigMap", "pipeline-topology")["data"]["default.toml"]
    assert text == DEFAULT_TOPOLOGY.read_text()
    parsed = topology.parse(tomllib.loads(text))
    assert parsed.topics == _topology().topics


def test_statefulset_keeps_worker_state_on_a_volume_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker StatefulSet mounts a volumeClaimTemplate at PIPELINE_STATE_DIR, is live on /healthz, ready on /readyz."""
    sts = _k8s("StatefulSet", "pipeline-worker")
    args = _k8s_args(sts, monkeypatch)
    container = _container(sts)
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts.get(args.state_dir) in claims, f"{args.state_dir} is not on a volumeClaimTemplate"
    assert _k8s_env(container)["PIPELINE_STATE_DIR"] == args.state_dir
    assert args.metrics_port is not None
    assert [p["containerPort"] for p in container["ports"]] == [args.metrics_port]
    for probe, path in (
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
        ("startupProbe", "/healthz"),
    ):
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert _port(container, get["port"]) == args.metrics_port, probe
    pod = sts["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(args.metrics_port)
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 30, "time to commit open transactions"
    assert sts["spec"]["replicas"] <= _topology().topics.partitions, "more workers than partitions idle"
    assert pod["spec"]["securityContext"]["fsGroup"] == pod["spec"]["securityContext"]["runAsUser"]


def test_the_statefulset_keeps_one_standby_of_each_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Kubernetes workers run with one standby replica (the default elsewhere is none), on more than one pod."""
    sts = _k8s("StatefulSet", "pipeline-worker")
    assert _k8s_args(sts, monkeypatch).standby_replicas == 1
    assert _parse(["worker"], {}, monkeypatch).standby_replicas == 0
    assert sts["spec"]["replicas"] >= 2, "a standby needs a second pod"


def test_the_worker_http_server_listens_where_it_is_probed_and_scraped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In Kubernetes and Compose the worker's HTTP server listens on every address; the default is loopback."""
    assert _parse(["worker"], {}, monkeypatch).http_host == "127.0.0.1"
    assert _k8s_args(_k8s("StatefulSet", "pipeline-worker"), monkeypatch).http_host == "0.0.0.0"
    assert _compose_args("worker", monkeypatch).http_host == "0.0.0.0"


def test_headless_service_selects_the_worker_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker Service is headless, governs the StatefulSet and selects its pods on the metrics port."""
    sts = _k8s("StatefulSet", "pipeline-worker")
    service = _k8s("Service", sts["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    port = _k8s_args(sts, monkeypatch).metrics_port
    (service_port,) = service["spec"]["ports"]
    assert service_port["port"] == port
    assert _port(_container(sts), service_port["targetPort"]) == port


def test_inspect_workers_name_every_worker_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """PIPELINE_WORKERS lists <sts>-<n>.<headless service>:<metrics port> for every replica."""
    sts = _k8s("StatefulSet", "pipeline-worker")
    name, service = sts["metadata"]["name"], sts["spec"]["serviceName"]
    port = _k8s_args(sts, monkeypatch).metrics_port
    expected = [f"{name}-{n}.{service}:{port}" for n in range(sts["spec"]["replicas"])]
    settings = _k8s("ConfigMap", "pipeline-settings")["data"]
    args = _parse(["inspect", "stripe:evt_1"], settings, monkeypatch)
    assert args.workers.split(",") == expected


def test_ingress_deployment_probes_and_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ingress listens where its Service and probes point: /readyz for readiness, /healthz for liveness."""
    deployment = _k8s("Deployment", "pipeline-ingress")
    args = _k8s_args(deployment, monkeypatch)
    assert args.host == "0.0.0.0"
    container = _container(deployment)
    assert [p["containerPort"] for p in container["ports"]] == [args.port]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe"):
        assert _port(container, container[probe]["httpGet"]["port"]) == args.port
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(args.port)
    service = _k8s("Service", "pipeline-ingress")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert [_port(container, p["targetPort"]) for p in service["spec"]["ports"]] == [args.port]


def test_k8s_containers_have_resources_and_run_as_non_root() -> None:
    """Every k8s container has CPU and memory requests and limits, and every pod runs as non-root."""
    workloads = [d for d in _k8s_docs() if d["kind"] in {"StatefulSet", "Deployment", "Job"}]
    assert len(workloads) == 3
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            resources = container["resources"]
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources[kind]), (workload["metadata"]["name"], kind)


def test_the_secret_template_is_not_applied_with_the_kustomization() -> None:
    """kubectl apply -k never applies the empty Secret template over a Secret created out of band."""
    kustomization = _load_yaml(K8S / "kustomization.yaml")
    assert not any("secret" in resource for resource in kustomization["resources"])
    assert (K8S / "templates" / "secret.yaml").exists()


def test_compose_kafka_keeps_its_data_on_the_volume() -> None:
    """The broker writes its logs where the compose volume is mounted, so a restart keeps the data."""
    kafka = _service("kafka")
    mounts = {volume.split(":", 1)[1] for volume in kafka["volumes"]}
    assert kafka["environment"]["KAFKA_LOG_DIRS"] in mounts


def test_worker_and_ingress_export_process_cpu_memory_and_gc() -> None:
    """Both registries carry the process (CPU, memory) and Python GC collectors, for the dashboard and alerts."""
    for metrics in (WorkerMetrics.create(), IngressMetrics.create()):
        families = {family.name for family in metrics.registry.collect()}
        assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_gc_collections"} <= families

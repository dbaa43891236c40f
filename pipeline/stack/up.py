"""``pipeline up``: the whole pipeline on one machine, local Kafka included.

Starts the local broker with the packaged ``pipeline/ops/kafka/kafka.sh``
(the checkout's ``deploy/kafka/kafka.sh``) when no bootstrap server is given,
creates the topics, runs the ingress and a worker in this process, and prints
where everything is. Ctrl-C (or SIGTERM) stops the services and the broker it
started. The broker needs bash, Java 17+ and, the first time (to download the
Kafka jars from Maven Central), Maven; a missing one is named in one line
before anything starts. Its data and log are in ``./.kafka/<port>/`` unless
``KAFKA_RUN_DIR`` says otherwise.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import secrets
import shlex
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline import topology
from pipeline.console.server import Console
from pipeline.console.settings import TOKENS_ENV, ConsoleSettings, parse_tokens
from pipeline.credentials import source_secrets
from pipeline.errors import PipelineError
from pipeline.ingress.server import Ingress, IngressSettings
from pipeline.kafka.admin import ensure_topics, topic_specs
from pipeline.ops.sign import DEFAULT_URL, curl_note
from pipeline.providers.signing import sign
from pipeline.service import Service
from pipeline.stack.local_broker import LocalBroker
from pipeline.stack.ports import free_port, refuse_busy_ports
from pipeline.topology import DEFAULT_TOPOLOGY, Topology, Verify
from pipeline.worker.loop import Worker
from pipeline.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

DEFAULT_METRICS_PORT = 9100  # pipeline inspect's default --workers port

#: Loggers that write a line per request or per record: quiet while the demo's display runs.
DEMO_NOISE = (
    "pipeline.ingress.server",  # the ingress app's logger: "accepted webhook ..." per request
    "pipeline.ingress.app",
    "pipeline.worker.effect_stage",
    "pipeline.worker.event_stage",
)


@contextlib.contextmanager
def quiet(names: tuple[str, ...], level: int = logging.ERROR) -> Iterator[None]:
    """Raise the level of the loggers ``names`` for the duration of the block."""
    loggers = [logging.getLogger(name) for name in names]
    before = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(level, logger.getEffectiveLevel()))
    try:
        yield
    finally:
        for logger, old in zip(loggers, before, strict=True):
            logger.setLevel(old)


@dataclass(frozen=True)
class UpSettings:
    """What ``pipeline up`` starts."""

    topology: Path
    state_dir: Path
    bootstrap: str | None = None  # None: start the local broker
    kafka_port: int = 9092
    ingress_port: int = 8080
    metrics_port: int = 9100
    console_port: int = 8090  # negative: no console
    group: str = ""  # empty: the topology's app name
    demo: bool = False
    demo_events: int = 120


@dataclass
class Up:
    """Runs the broker (maybe), topics, worker and ingress until stopped."""

    settings: UpSettings
    out: Callable[[str], None] = print
    _services: list[Service] = field(default_factory=list)
    _started_broker: bool = False
    _worker: Worker | None = None
    _ingress: Ingress | None = None
    _topology: Topology | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def bootstrap(self) -> str:
        """Where Kafka is."""
        return self.settings.bootstrap or f"127.0.0.1:{self.settings.kafka_port}"

    async def start(self) -> None:
        """Start everything, in dependency order."""
        topo = topology.load(self.settings.topology)
        broker = LocalBroker.here(self.settings.kafka_port) if self.settings.bootstrap is None else None
        if broker is not None:
            broker.check()
        # every port before anything starts: the broker alone takes seconds
        refuse_busy_ports(
            broker, ingress_port=self.settings.ingress_port, metrics_port=self.settings.metrics_port
        )
        if self.settings.metrics_port == 0:  # printed below, and in the second terminal's lines
            self.settings = replace(self.settings, metrics_port=free_port())
        if broker is not None:
            await self._start_broker()
        self.out(f"Kafka         {self.bootstrap}")
        results = await ensure_topics(self.bootstrap, topic_specs(topo))
        for result in results:
            self.out(f"  topic {result.action:8} {result.name} ({result.partitions} partitions)")
        generated = dev_secrets(topo, os.environ)
        worker = Worker(
            WorkerSettings(
                bootstrap=self.bootstrap,
                topology=self.settings.topology,
                state_dir=self.settings.state_dir,
                group=self.settings.group,
                metrics_port=self.settings.metrics_port,
            ),
            topo,
        )
        ingress = Ingress(
            IngressSettings(
                bootstrap=self.bootstrap, topology=self.settings.topology, port=self.settings.ingress_port
            ),
            topo,
        )
        self._services = [worker, ingress]
        console = self._console(topo)
        if console is not None:
            self._services.append(console)
        for service in self._services:
            await service.start()
        base = f"http://127.0.0.1:{ingress.port}"
        self.out(f"Worker        group {worker.settings.group}, state in {self.settings.state_dir}")
        self.out(f"  metrics     http://127.0.0.1:{self.settings.metrics_port}/metrics")
        self.out(f"Ingress       {base}  (metrics {base}/metrics, health {base}/healthz, {base}/readyz)")
        for name in sorted(topo.sources):
            self.out(f"  webhook URL {base}/webhooks/{name}")
        if console is not None:
            self.out(f"Console       {console.url}  (find an event, the DLQ and its redrive, partitions)")
        self.out("Try it (a signed Stripe test event):")
        self.out("  " + sample_curl(topo, base))
        self.out("  " + curl_note(topo, os.environ))
        self.out("In a second terminal:")
        for line in second_terminal(self.bootstrap, topo, self.settings.metrics_port, base):
            self.out("  " + line)
        if generated:
            self.out(
                "Dev secrets   generated for unset variables (this process only): "
                + ", ".join(sorted(generated))
            )
        self._worker, self._ingress, self._topology = worker, ingress, topo
        self.out("Stop with Ctrl-C.")

    def _console(self, topo: Topology) -> Console | None:
        """The operator console on loopback, reading this worker; None with a negative console port."""
        if self.settings.console_port < 0:
            return None
        settings = ConsoleSettings(
            bootstrap=self.bootstrap,
            topology=self.settings.topology,
            port=self.settings.console_port,
            workers=(f"127.0.0.1:{self.settings.metrics_port}",),
            group=self.settings.group,
            users=parse_tokens(os.environ.get(TOKENS_ENV)),
        )
        return Console(settings, topo)

    async def run(self) -> None:
        """Run the services until one ends or :meth:`stop` is called."""
        tasks = [asyncio.create_task(service.run()) for service in self._services]
        if self.settings.demo:
            tasks.append(asyncio.create_task(self._demo()))
        stopper = asyncio.create_task(self._stopping.wait())
        failure: BaseException | None = None
        try:
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            failures = [t.exception() for t in done if t is not stopper and not t.cancelled()]
            failure = next((f for f in failures if f is not None), None)
        finally:
            for service in self._services:
                service.stop()
            await asyncio.gather(*tasks, return_exceptions=True)
            stopper.cancel()
            if self._started_broker:
                await self._stop_broker()
        if isinstance(failure, PipelineError):
            raise failure
        if failure is not None:
            log.debug("up: a task failed", exc_info=failure)
            raise PipelineError(f"pipeline up stopped: {type(failure).__name__}: {failure}") from failure

    async def _demo(self) -> None:
        from pipeline.ops.demo import run_demo  # noqa: PLC0415

        await asyncio.sleep(2.0)  # let the worker join its group
        self.out("Demo: sending signed webhooks with retries, a redelivery and forgeries ...")
        self.out("  (per-request log lines are hidden while the demo runs)")
        if self._worker is None or self._ingress is None or self._topology is None:
            return
        with quiet(DEMO_NOISE):
            ok = await run_demo(
                self._topology,
                f"http://127.0.0.1:{self._ingress.port}",
                self.bootstrap,
                events=self.settings.demo_events,
            )
        if not ok:
            raise PipelineError("the demo failed: the worker's counts did not match (see the summary above)")
        self.out("Demo done; the pipeline keeps running. Stop with Ctrl-C.")
        await self._stopping.wait()

    def stop(self) -> None:
        """Ask everything to stop."""
        self._stopping.set()

    @property
    def owned_broker(self) -> LocalBroker | None:
        """The local broker this ``up`` started (or is starting), which it stops; None otherwise."""
        return LocalBroker.here(self.settings.kafka_port) if self._started_broker else None

    async def abandon(self) -> None:
        """After a failed or interrupted start: stop what already runs, the broker last."""
        for service in self._services:
            service.stop()
        if self._started_broker:
            await self._stop_broker()

    async def _start_broker(self) -> None:
        broker = LocalBroker.here(self.settings.kafka_port)
        self.out(f"Starting the local Kafka broker on 127.0.0.1:{self.settings.kafka_port} ...")
        self._started_broker = True  # from here on, stopping it is ours (an interrupted start too)
        if await broker.run("start") != 0:
            raise PipelineError(f"the local broker did not start (its log: {broker.log_file})")
        self._started_broker = True

    async def _stop_broker(self) -> None:
        self.out("Stopping the local Kafka broker ...")
        await LocalBroker.here(self.settings.kafka_port).run("stop")


def dev_secrets(topo: Topology, environ: os._Environ[str] | dict[str, str]) -> list[str]:
    """Set a random development secret for each unset secret variable; return their names.

    Only for ``pipeline up`` on one machine: the values never leave this
    process and are never printed.
    """
    generated = []
    for source in topo.sources.values():
        if source.verify is Verify.NONE or not source.secret_env:
            continue
        name = source.secret_env[0]
        if not environ.get(name):
            # standard base64: a Standard Webhooks source decodes it, every other scheme takes it as is
            environ[name] = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode("ascii")
            generated.append(name)
    return generated


def sample_curl(topo: Topology, base: str, environ: Mapping[str, str] | None = None) -> str:
    """A ``curl`` command that posts a correctly signed test event to the first signed source.

    It carries a signature, never the secret itself.
    """
    env = os.environ if environ is None else environ
    for source in topo.sources.values():
        secret_values = source_secrets(source, env)
        if source.verify is Verify.NONE or not secret_values:
            continue
        event_id = f"evt_demo_{secrets.token_hex(6)}"
        body = (
            f'{{"id": "{event_id}", "object": "event", "type": "checkout.session.completed", '
            f'"data": {{"object": {{"id": "cs_test_1", "payment_intent": "pi_test_1"}}}}}}'
        ).encode()
        headers = sign(source.provider, body, secret_values[0], timestamp=time.time(), msg_id=event_id)
        parts = ["curl", "-sS", "-X", "POST", f"{base}/webhooks/{source.name}"]
        for name, value in headers.items():
            parts += ["-H", f"{name}: {value}"]
        parts += ["-H", "Content-Type: application/json", "--data-binary", body.decode()]
        return shlex.join(parts)
    return f"curl -sS -X POST {base}/webhooks/<source> --data-binary @event.json"


def second_terminal(bootstrap: str, topo: Topology, metrics_port: int, ingress_url: str) -> list[str]:
    """The lines that point a second terminal's ``pipeline`` commands at this ``up``."""
    lines = [f"export KAFKA_BOOTSTRAP_SERVERS={shlex.quote(bootstrap)}"]
    if topo.path is not None and Path(topo.path).resolve() != DEFAULT_TOPOLOGY.resolve():
        lines.append(f"export PIPELINE_TOPOLOGY={shlex.quote(str(Path(topo.path).resolve()))}")
    if metrics_port != DEFAULT_METRICS_PORT:
        lines.append(f"export PIPELINE_WORKERS=127.0.0.1:{metrics_port}")
    if ingress_url != DEFAULT_URL:
        lines.append(f"export PIPELINE_INGRESS_URL={shlex.quote(ingress_url)}")
    lines.append(f"pipeline tail {shlex.quote(topo.topics.commands)}    # the commands, as JSON lines")
    return lines

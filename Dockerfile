# The pipeline's image: one image for `pipeline worker`, `pipeline ingress` and
# `pipeline topics create` (docker-compose.yml and deploy/k8s/ pick the command).
#
#   docker build -t webhook-pipeline .
#   docker run --rm webhook-pipeline pipeline --help

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Only what the package needs (the build context also holds .venv, .kafka, .state).
COPY pyproject.toml README.md /tmp/src/
COPY pipeline /tmp/src/pipeline
COPY pipeline/topologies ./topologies
RUN pip install /tmp/src \
    && rm -rf /tmp/src \
    && groupadd --system --gid 10001 pipeline \
    && useradd --system --uid 10001 --gid pipeline --home-dir /app --no-create-home pipeline \
    && mkdir -p /var/lib/pipeline/state \
    && chown -R pipeline:pipeline /var/lib/pipeline

# Defaults the CLI reads from the environment (flags still override them):
# - the topology shipped in the image (mount another and point PIPELINE_TOPOLOGY at it);
# - the worker's RocksDB state dir, a volume (it must outlive the container: a restarted
#   worker then replays only the changelog tail instead of rebuilding every store);
# - the worker's HTTP port (/metrics, /healthz, /partitions, /keys/{key}); the CLI's own
#   default is "off", and the ingress binds 127.0.0.1 by default, unreachable in a container.
ENV PIPELINE_TOPOLOGY=/app/topologies/default.toml \
    PIPELINE_STATE_DIR=/var/lib/pipeline/state \
    PIPELINE_METRICS_PORT=9100 \
    PIPELINE_INGRESS_HOST=0.0.0.0 \
    PIPELINE_INGRESS_PORT=8080

USER 10001:10001
VOLUME ["/var/lib/pipeline/state"]
# 8080: ingress (webhooks, /healthz, /readyz, /metrics); 9100: worker (/metrics, /healthz, inspect).
EXPOSE 8080 9100

# No HEALTHCHECK here: the port and path depend on the command (worker 9100/healthz,
# ingress 8080/readyz); docker-compose.yml and the k8s probes define them per service.
# The CLI handles SIGTERM itself (the worker commits its open transactions, the ingress
# drains), so the exec-form command runs as PID 1 without a shell in between.
CMD ["pipeline", "--help"]

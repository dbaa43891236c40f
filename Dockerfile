# The pipeline's image: `pipeline worker`, `pipeline ingress`, `pipeline topics create`.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY pipeline ./pipeline
COPY topologies ./topologies
RUN pip install --no-cache-dir .
ENTRYPOINT []
CMD ["pipeline", "--help"]

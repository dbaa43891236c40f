"""The topology every bench's worker runs: unique topic names and one Stripe source."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def write_topology(
    path: Path, app: str, partitions: int, *, secret_env: str | None = None, changelog: str | None = None
) -> Path:
    """A topology with unique topic names and one Stripe source (``changelog``: an existing changelog topic).

    Without ``secret_env`` the source is trusted (``verify = "none"``: the benches produce
    straight to the input topic); with it, the ingress verifies its signatures with the
    secret in that variable (``bench/ingress_bench.py``).
    """
    check = f'secrets = ["{secret_env}"]' if secret_env else 'verify = "none"'
    path.write_text(
        f"""
[app]
name = "{app}"
[topics]
input = "{app}.raw"
commands = "{app}.events"
audit = "{app}.deliveries"
dlq = "{app}.dlq"
changelog = "{changelog or f"{app}-seen-changelog"}"
partitions = {partitions}
[sources.stripe]
provider = "stripe"
{check}
ttl = "7d"
""",
        encoding="utf-8",
    )
    return path

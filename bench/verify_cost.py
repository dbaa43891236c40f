"""What the ingress's provider work costs per request, apart from the ingress: verify, key, check.

    .venv/bin/python bench/verify_cost.py               # 20,000 of bench/worker_bench.py's bodies
    .venv/bin/python bench/verify_cost.py --events 5000 --repeat 3
    .venv/bin/python bench/verify_cost.py --provider github   # another signature scheme

Per request the ingress verifies the signature, reads the event id and checks that the
body is a JSON object (``pipeline/ingress/app.py``), all in ``pipeline/providers/``. This
runs exactly those calls over the worker bench's Stripe-like bodies (1-2 KB), each signed
with ``pipeline.providers.signing`` as ``--provider`` (Stripe by default: the ingress bench's)
signs it, with the headers as the ingress
hands them over (a case-insensitive multidict), best of ``--repeat`` runs. Printed: µs
of CPU per request. Compare with the ingress's whole CPU per request
(``bench/ingress_bench.py``; both in ``docs/benchmarks.md``). No broker.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from multidict import CIMultiDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench.lib
from bench.lib.workload import make_stream
from pipeline import providers
from pipeline.providers.signing import sign

SECRET = "whsec_bench"
SECRETS = {
    "standard-webhooks": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
}  # a base64 key, as that scheme takes


def requests(provider: str, events: int, seed: int, now: float) -> list[tuple[CIMultiDict[str], bytes]]:
    """Signed requests (headers, body), one per distinct body of the workload."""
    stream = make_stream(random.Random(seed), events, 0.0, min_size=1000, max_size=2000)
    signed = []
    for body in stream.bodies[:events]:
        headers = CIMultiDict(sign(provider, body, SECRETS.get(provider, SECRET), timestamp=now))
        headers["Content-Type"] = "application/json"
        signed.append((headers, body))
    return signed


def run(provider: str, signed: list[tuple[CIMultiDict[str], bytes]], now: float) -> float:
    """CPU seconds for the ingress's provider calls on every request."""
    preset = providers.get(provider)
    secrets = [SECRETS.get(provider, SECRET)]
    check = providers.check_body
    started = time.process_time()
    for headers, body in signed:
        preset.verify(headers, body, secrets, now=now)
        if not preset.idempotency_key(headers, body).strip():
            raise SystemExit("a request without its event id")
        check(body, provider)
    return time.process_time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", default="stripe", choices=["stripe", "github", "standard-webhooks"])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=20241130)
    parser.add_argument("--repeat", type=int, default=5, help="runs; the best is reported")
    args = parser.parse_args()
    now = time.time()
    signed = requests(args.provider, args.events, args.seed, now)
    best = min(run(args.provider, signed, now) for _ in range(args.repeat))
    print(
        f"{args.provider}: {len(signed):,} requests, best of {args.repeat}: "
        f"{best / len(signed) * 1e6:.2f} µs CPU per request"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

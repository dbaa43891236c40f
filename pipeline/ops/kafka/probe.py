"""Wait until a Kafka broker answers a Metadata request listing a broker.

Standard library only, so the broker script needs no virtualenv. Exits 0 once
a client could bootstrap from HOST:PORT, 1 after the timeout.

    python3 probe.py 127.0.0.1:9092 60
"""

from __future__ import annotations

import socket
import struct
import sys
import time

METADATA_API_KEY = 3
METADATA_VERSION = 4  # Kafka 4 removed v0-v3 (KIP-896)


def _request(correlation_id: int) -> bytes:
    client_id = b"pipeline-probe"
    header = struct.pack(">hhih", METADATA_API_KEY, METADATA_VERSION, correlation_id, len(client_id))
    # topics = null (all topics), allow_auto_topic_creation = false
    body = struct.pack(">i?", -1, False)
    payload = header + client_id + body
    return struct.pack(">i", len(payload)) + payload


def _read_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data


def brokers_listed(host: str, port: int) -> int:
    """Return how many brokers the Metadata response lists."""
    with socket.create_connection((host, port), timeout=3) as sock:
        sock.sendall(_request(1))
        (size,) = struct.unpack(">i", _read_exact(sock, 4))
        response = _read_exact(sock, size)
    # correlation_id int32, throttle_time_ms int32, brokers array length int32
    _correlation, _throttle, count = struct.unpack(">iii", response[:12])
    return int(count)


def main() -> int:
    host, _, port = sys.argv[1].rpartition(":")
    deadline = time.monotonic() + float(sys.argv[2] if len(sys.argv) > 2 else 60)
    while time.monotonic() < deadline:
        try:
            if brokers_listed(host, int(port)) > 0:
                return 0
        except (OSError, struct.error):
            pass
        time.sleep(0.25)
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""Wait until a Kafka broker answers a Metadata request listing a broker.

Standard library only, so the broker script needs no virtualenv. Exits 0 once
a client could bootstrap from HOST:PORT, 1 after the timeout. With
``--cluster-id ID`` only a broker of that cluster counts: one answering with
another cluster id makes it exit 2 at once (another broker holds the port).
``--free`` instead exits 0 when every HOST:PORT given can be bound, 1 naming
the first that cannot.

    python3 probe.py 127.0.0.1:9092 60 [--cluster-id ID]
    python3 probe.py --free 127.0.0.1:9092 127.0.0.1:9093
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


def _string(data: bytes, at: int) -> tuple[str | None, int]:
    """A nullable int16-length string at ``at``, and the offset after it."""
    (length,) = struct.unpack(">h", data[at : at + 2])
    if length < 0:
        return None, at + 2
    return data[at + 2 : at + 2 + length].decode("utf-8", "replace"), at + 2 + length


def metadata(host: str, port: int) -> tuple[int, str | None]:
    """Return how many brokers the Metadata response lists, and the cluster id."""
    with socket.create_connection((host, port), timeout=3) as sock:
        sock.sendall(_request(1))
        (size,) = struct.unpack(">i", _read_exact(sock, 4))
        response = _read_exact(sock, size)
    # correlation_id int32, throttle_time_ms int32, brokers array length int32
    _correlation, _throttle, count = struct.unpack(">iii", response[:12])
    at = 12
    for _ in range(count):  # node_id int32, host string, port int32, rack nullable string
        _host, at = _string(response, at + 4)
        _rack, at = _string(response, at + 4)
    cluster_id, _ = _string(response, at)
    return int(count), cluster_id


def brokers_listed(host: str, port: int) -> int:
    """Return how many brokers the Metadata response lists."""
    return metadata(host, port)[0]


def free(addresses: list[str]) -> int:
    """0 when every ``HOST:PORT`` can be bound now; 1, naming the first that cannot, otherwise."""
    for address in addresses:
        host, _, port = address.rpartition(":")
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the broker binds
            try:
                sock.bind((host, int(port)))
            except OSError:
                print(address)
                return 1
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--free"]:
        return free(sys.argv[2:])
    args = sys.argv[1:]
    expected = None
    if "--cluster-id" in args:
        at = args.index("--cluster-id")
        expected = args[at + 1]
        del args[at : at + 2]
    host, _, port = args[0].rpartition(":")
    deadline = time.monotonic() + float(args[1] if len(args) > 1 else 60)
    while time.monotonic() < deadline:
        try:
            count, cluster_id = metadata(host, int(port))
        except (OSError, struct.error):
            count, cluster_id = 0, None
        if count > 0 and expected is not None and cluster_id != expected:
            print(f"cluster id {cluster_id}, expected {expected}", file=sys.stderr)
            return 2
        if count > 0:
            return 0
        time.sleep(0.25)
    return 1


if __name__ == "__main__":
    sys.exit(main())

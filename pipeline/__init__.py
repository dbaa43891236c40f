"""Handle every webhook exactly once: Kafka + RocksDB dedupe with exactly-once effects."""

__version__ = "0.1.0"

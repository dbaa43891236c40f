"""The dedupe state: the pure decision, the RocksDB store, and the partition transaction that is its only writer."""

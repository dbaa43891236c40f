"""The dedupe worker: the consumer loop, the partition lifecycle, the two stages, restore and the HTTP endpoint."""

package dev.webhooks.bench.kstreams;

import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.state.WindowStoreIterator;

/**
 * Keeps the first copy of each key within the TTL, with the worker's rule: a copy is a duplicate
 * when the key was first seen less than the TTL before the copy's timestamp; otherwise it is a
 * first copy, claims the key at its own timestamp and forwards its command. Duplicates do not
 * extend the TTL (the worker's default, non-sliding expiry).
 *
 * <p>The seen-set is a window store keyed by (key, first-seen timestamp) whose retention is the
 * TTL: Kafka Streams drops its segments whole as stream time passes them, so expiry follows
 * stream time and costs nothing per record, like the worker's expiry buckets.
 */
final class Dedupe implements Processor<Bytes, byte[], Bytes, byte[]> {
  static final String STORE = "seen";

  private final long ttlMs;
  private ProcessorContext<Bytes, byte[]> context;
  private WindowStore<Bytes, Long> seen;

  Dedupe(long ttlMs) {
    this.ttlMs = ttlMs;
  }

  @Override
  public void init(ProcessorContext<Bytes, byte[]> context) {
    this.context = context;
    this.seen = context.getStateStore(STORE);
  }

  @Override
  public void process(Record<Bytes, byte[]> record) {
    long at = record.timestamp();
    try (WindowStoreIterator<Long> live = seen.fetch(record.key(), at - ttlMs + 1, Long.MAX_VALUE)) {
      if (live.hasNext()) {
        return;
      }
    }
    seen.put(record.key(), at, at);
    byte[] command = Command.of(record.key().get(), record.value(), record.headers());
    context.forward(record.withValue(command));
  }
}

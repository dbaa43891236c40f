package dev.webhooks.bench.kstreams;

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.Stores;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Kafka Streams contender of bench/alternatives: reads the input topic, keeps the first copy
 * of each idempotency key within the TTL (a {@link Dedupe} processor over a persistent RocksDB
 * window store) and writes its command to the output topic, exactly once (exactly_once_v2).
 *
 * <pre>
 * java -cp ... dev.webhooks.bench.kstreams.DedupeApp --bootstrap B --input T --output U \
 *     --group G --state-dir D --commit-interval-ms 100 [--ttl-ms 604800000]
 * </pre>
 *
 * <p>The group is the application id, so the bench reads its progress from the consumer group's
 * committed offsets like every other contender's. Runs until SIGTERM or SIGINT (a clean close);
 * exits 1 if the stream thread dies.
 */
public final class DedupeApp {
  private static final Logger LOG = LoggerFactory.getLogger(DedupeApp.class);
  private static final List<String> REQUIRED =
      List.of("bootstrap", "input", "output", "group", "state-dir", "commit-interval-ms");
  private static final long WEEK_MS = Duration.ofDays(7).toMillis(); // the bench worker's "ttl = 7d"

  private DedupeApp() {}

  public static void main(String[] args) throws InterruptedException {
    Map<String, String> opts = parse(args);
    long ttlMs = Long.parseLong(opts.getOrDefault("ttl-ms", Long.toString(WEEK_MS)));
    KafkaStreams streams = new KafkaStreams(topology(opts, ttlMs), config(opts));
    CountDownLatch finished = new CountDownLatch(1);
    AtomicBoolean failed = new AtomicBoolean();
    AtomicBoolean stopping = new AtomicBoolean();
    streams.setStateListener(
        (now, before) -> {
          LOG.info("state {} -> {}", before, now);
          if (now == KafkaStreams.State.ERROR) {
            failed.set(true);
            finished.countDown();
          } else if (now == KafkaStreams.State.NOT_RUNNING) {
            finished.countDown();
          }
        });
    streams.setUncaughtExceptionHandler(
        error -> {
          LOG.error("the stream thread failed", error);
          return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  stopping.set(true);
                  streams.close(Duration.ofSeconds(25));
                  finished.countDown();
                },
                "close-on-signal"));
    LOG.info(
        "kstreams dedupe started: {} -> {}, application id {}, TTL {} ms",
        opts.get("input"),
        opts.get("output"),
        opts.get("group"),
        ttlMs);
    streams.start();
    finished.await();
    if (failed.get() && !stopping.get()) {
      streams.close(Duration.ofSeconds(10));
      System.exit(1);
    }
  }

  static org.apache.kafka.streams.Topology topology(Map<String, String> opts, long ttlMs) {
    StreamsBuilder builder = new StreamsBuilder();
    // Retention = the TTL: segments older than stream time minus the TTL are dropped whole.
    builder.addStateStore(
        Stores.windowStoreBuilder(
            Stores.persistentWindowStore(
                Dedupe.STORE, Duration.ofMillis(ttlMs), Duration.ofMillis(ttlMs), false),
            Serdes.Bytes(),
            Serdes.Long()));
    builder.stream(opts.get("input"), Consumed.with(Serdes.Bytes(), Serdes.ByteArray()))
        .process(() -> new Dedupe(ttlMs), Dedupe.STORE)
        .to(opts.get("output"), Produced.with(Serdes.Bytes(), Serdes.ByteArray()));
    return builder.build();
  }

  static Properties config(Map<String, String> opts) {
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, opts.get("group"));
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, opts.get("bootstrap"));
    // one producer and one transaction per thread over all its tasks; consumers read_committed
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.parseLong(opts.get("commit-interval-ms")));
    props.put(StreamsConfig.STATE_DIR_CONFIG, opts.get("state-dir"));
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 10_000);
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 2_000);
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    return props;
  }

  static Map<String, String> parse(String[] args) {
    Map<String, String> opts = new HashMap<>();
    for (int i = 0; i < args.length; i += 2) {
      if (!args[i].startsWith("--") || i + 1 >= args.length) {
        throw new IllegalArgumentException("expected --name value pairs, got " + args[i]);
      }
      opts.put(args[i].substring(2), args[i + 1]);
    }
    for (String name : REQUIRED) {
      if (!opts.containsKey(name)) {
        throw new IllegalArgumentException("missing --" + name);
      }
    }
    return opts;
  }
}

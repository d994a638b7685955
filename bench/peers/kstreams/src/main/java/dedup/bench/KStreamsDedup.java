package dedup.bench;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.CharConversionException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Branched;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Named;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.api.RecordMetadata;
import org.apache.kafka.streams.state.StoreBuilder;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.TimestampedKeyValueStore;
import org.apache.kafka.streams.state.ValueAndTimestamp;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.state.WindowStoreIterator;

/**
 * The Kafka Streams peer of bench/worker_throughput.py: the dedup worker's job written the
 * way a JVM shop would write it. Exactly-once v2, one persistent RocksDB store keyed by the
 * message id (changelogged, as Kafka Streams stores are by default), first occurrence of an
 * id inside the window goes to the output topic with a {@code dedup.id} header, records
 * without a valid id go to the dead-letter topic with {@code dedup.reason} and friends.
 *
 * <pre>
 * java -jar kstreams-dedup.jar BOOTSTRAP INPUT OUTPUT DLQ RECORDS OUTPUTS STATE_DIR
 *      [--store window|kv] [--window-ms MS] [--id-source jsonField|header|key] [--id-field NAME]
 *      [--threads N] [--topology plain|repartition]
 * </pre>
 *
 * <p>It runs until the dedup step has processed RECORDS records (dead letters included) and
 * the application's committed offset on every partition the dedup step read is past the
 * last record it processed there (every input record processed and its transaction
 * committed: the same finish line as our worker's bench), checks that it forwarded OUTPUTS
 * records, closes, and prints one JSON line: seconds, steady_seconds (from the first record
 * processed), records, outputs, dead_letters, records_per_s, close_s, store, topology.
 *
 * <h2>Topologies</h2>
 *
 * <ul>
 *   <li>{@code plain} (default): the dedup step reads the input directly. Exact only when
 *       every occurrence of an id is on one input partition (producers keyed by the id).
 *   <li>{@code repartition}: how a Kafka Streams shop dedups input that is not keyed by the
 *       id: a first step re-keys each record by its message id (selectKey, as a processor
 *       so that records without an id go to the dead-letter topic), {@code repartition()}
 *       sends every record through an internal repartition topic partitioned by the id
 *       (Kafka's murmur2 partitioner, as many partitions as the input), and the dedup step
 *       reads it, taking the id from the key. Every record crosses the broker twice.
 * </ul>
 *
 * {@code --threads} is {@code num.stream.threads} (default 1).
 *
 * <h2>The store: a window store (default) or a timestamped key-value store</h2>
 *
 * The worker's window is on stream time (the newest input timestamp seen): an id is a
 * duplicate while an earlier sighting is less than the window old, and whole generations
 * of ids are dropped, oldest first, once older than the window.
 *
 * <ul>
 *   <li>{@code window} (default): {@code Stores.persistentWindowStore(retention = window,
 *       size = window)}, as in Confluent's Kafka Streams deduplication example. Its RocksDB
 *       is cut into time segments (retention / 2 each) and a segment is dropped whole once
 *       stream time has passed it: the same expiry as our worker's generations, with bounded
 *       disk and no punctuator. The price is the lookup: {@code fetch(id, t - window, t +
 *       window)} is a range scan over the live segments instead of a point get.
 *   <li>{@code kv}: {@code Stores.persistentTimestampedKeyValueStore}: a point get per record,
 *       expiry checked on read (an entry older than the window counts as absent and is
 *       overwritten), no punctuator. Cheaper lookups, but expired ids are never deleted, so
 *       the store only grows unless a punctuator scans it (the sequence-index design
 *       bench/store.py measures as its baseline). Here for comparison.
 * </ul>
 *
 * With the bench's 7-day window nothing expires in a run, so both only pay for the lookup
 * and the insert; the window store is the default because it is the one that keeps the
 * window's disk bound, as ours does.
 */
public final class KStreamsDedup {
  static final String ID_HEADER = "dedup.id";
  static final String DLQ_REASON = "dedup.reason";
  static final String DLQ_DETAIL = "dedup.detail";
  static final String DLQ_TOPIC = "dedup.origin.topic";
  static final String DLQ_PARTITION = "dedup.origin.partition";
  static final String DLQ_OFFSET = "dedup.origin.offset";
  static final int MAX_ID_BYTES = 512;
  static final String STORE = "dedup-ids";
  static final byte[] SEEN = {1};
  static final long TIMEOUT_MS = 900_000;

  static final AtomicLong OUTPUTS = new AtomicLong();
  /** Records the dedup step processed (re-processing after an abort counts again). */
  static final AtomicLong PROCESSED = new AtomicLong();
  /** Per partition the dedup step reads: the largest offset it processed. */
  static final Map<TopicPartition, AtomicLong> LAST_OFFSETS = new ConcurrentHashMap<>();
  static final AtomicLong DEAD_LETTERS = new AtomicLong();
  static final AtomicLong DEDUP_DEAD_LETTERS = new AtomicLong();
  /** System.nanoTime() when the first input record reached the processor (0: not yet). */
  static volatile long firstRecordNanos;

  /** A record without a valid id; {@code reason} is the worker's stable code (ids.py). */
  static final class InvalidRecord extends Exception {
    final String reason;

    InvalidRecord(String reason, String detail) {
      super(detail, null, false, false);
      this.reason = reason;
    }
  }

  /** The id rules of worker/dedup_worker/ids.py, for the sources the bench uses. */
  static final class IdRule {
    private static final ObjectMapper JSON =
        new ObjectMapper().enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS);
    final String source;
    final String field;
    final String[] path;

    IdRule(String source, String field) {
      this.source = source;
      this.field = field;
      this.path = field.split("\\.");
    }

    String extract(byte[] key, byte[] value, Headers headers) throws InvalidRecord {
      switch (source) {
        case "key":
          if (key == null) throw new InvalidRecord("missing_key", "record has no key");
          return checked(key, "key");
        case "header":
          Header last = headers.lastHeader(field);
          if (last == null) throw new InvalidRecord("missing_header", "no header " + field);
          if (last.value() == null)
            throw new InvalidRecord("null_header", "header " + field + " has a null value");
          return checked(last.value(), "header " + field);
        default:
          return fromJson(value);
      }
    }

    private String fromJson(byte[] value) throws InvalidRecord {
      if (value == null) throw new InvalidRecord("null_value", "record value is null (tombstone)");
      if (value.length == 0) throw new InvalidRecord("empty_value", "record value is empty");
      JsonNode node;
      try {
        node = JSON.readTree(value);
      } catch (CharConversionException e) {
        throw new InvalidRecord("not_utf8", "record value is not UTF-8");
      } catch (IOException e) {
        throw new InvalidRecord("not_json", String.valueOf(e.getMessage()));
      }
      if (node == null || !node.isObject())
        throw new InvalidRecord("not_object", "record value is not a JSON object");
      for (String name : path) {
        if (!node.isObject()) throw new InvalidRecord("missing_id", "no field " + field);
        node = node.get(name);
        if (node == null) throw new InvalidRecord("missing_id", "no field " + field);
      }
      String id;
      if (node.isTextual()) id = node.textValue();
      else if (node.isIntegralNumber()) id = node.bigIntegerValue().toString();
      else if (node.isNull()) throw new InvalidRecord("id_null", field + " is null");
      else if (node.isContainerNode())
        throw new InvalidRecord("id_not_scalar", field + " is not a scalar");
      else
        throw new InvalidRecord("id_bad_type", field + ": ids are strings or integers");
      if (id.isEmpty()) throw new InvalidRecord("id_empty", field + " is empty");
      if (id.getBytes(StandardCharsets.UTF_8).length > MAX_ID_BYTES)
        throw new InvalidRecord("id_too_long", field + " is over " + MAX_ID_BYTES + " bytes");
      return id;
    }

    private static String checked(byte[] raw, String where) throws InvalidRecord {
      if (raw.length == 0) throw new InvalidRecord("id_empty", where + " is empty");
      if (raw.length > MAX_ID_BYTES)
        throw new InvalidRecord("id_too_long", where + " is over " + MAX_ID_BYTES + " bytes");
      try {
        return StandardCharsets.UTF_8
            .newDecoder()
            .decode(java.nio.ByteBuffer.wrap(raw))
            .toString();
      } catch (java.nio.charset.CharacterCodingException e) {
        throw new InvalidRecord("not_utf8", where + " is not UTF-8");
      }
    }
  }

  /** The dedup step: one input record in, the output or the dead-letter sink forwarded to. */
  static final class Dedup implements Processor<byte[], byte[], byte[], byte[]> {
    private final IdRule rule;
    private final String storeKind;
    private final long windowMs;
    private final boolean namedSinks; // Topology "output" / "dead-letters"; else the DSL's child
    private ProcessorContext<byte[], byte[]> context;
    private WindowStore<String, byte[]> windowStore;
    private TimestampedKeyValueStore<String, byte[]> kvStore;
    private String lastTopic;
    private int lastPartition = -1;
    private AtomicLong lastOffset;

    Dedup(IdRule rule, String storeKind, long windowMs, boolean namedSinks) {
      this.rule = rule;
      this.storeKind = storeKind;
      this.windowMs = windowMs;
      this.namedSinks = namedSinks;
    }

    @Override
    public void init(ProcessorContext<byte[], byte[]> context) {
      this.context = context;
      if (storeKind.equals("window")) windowStore = context.getStateStore(STORE);
      else kvStore = context.getStateStore(STORE);
    }

    @Override
    public void process(Record<byte[], byte[]> record) {
      if (firstRecordNanos == 0) firstRecordNanos = System.nanoTime();
      progress();
      String id;
      try {
        id = rule.extract(record.key(), record.value(), record.headers());
      } catch (InvalidRecord bad) {
        deadLetter(record, bad);
        return;
      }
      long ts = record.timestamp();
      if (!firstInWindow(id, ts)) return;
      Headers headers = new RecordHeaders(record.headers().toArray());
      headers.add(ID_HEADER, id.getBytes(StandardCharsets.UTF_8));
      if (namedSinks) context.forward(record.withHeaders(headers), "output");
      else context.forward(record.withHeaders(headers));
      OUTPUTS.incrementAndGet();
    }

    /** Counts the record and remembers its offset, for the finish line (main). */
    private void progress() {
      PROCESSED.incrementAndGet();
      RecordMetadata at = context.recordMetadata().orElse(null);
      if (at == null) return;
      if (at.partition() != lastPartition || !at.topic().equals(lastTopic)) {
        lastTopic = at.topic();
        lastPartition = at.partition();
        lastOffset =
            LAST_OFFSETS.computeIfAbsent(
                new TopicPartition(lastTopic, lastPartition), tp -> new AtomicLong(-1));
      }
      lastOffset.accumulateAndGet(at.offset(), Math::max);
    }

    /** Whether {@code id} is new within the window at {@code ts}; records it if so. */
    private boolean firstInWindow(String id, long ts) {
      if (windowStore != null) {
        try (WindowStoreIterator<byte[]> seen =
            windowStore.fetch(id, Math.max(0, ts - windowMs), ts + windowMs)) {
          if (seen.hasNext()) return false;
        }
        windowStore.put(id, SEEN, ts);
        return true;
      }
      ValueAndTimestamp<byte[]> seen = kvStore.get(id);
      if (seen != null && Math.abs(ts - seen.timestamp()) < windowMs) return false;
      kvStore.put(id, ValueAndTimestamp.make(SEEN, ts));
      return true;
    }

    private void deadLetter(Record<byte[], byte[]> record, InvalidRecord bad) {
      Headers headers = new RecordHeaders(record.headers().toArray());
      headers.add(DLQ_REASON, bytes(bad.reason));
      headers.add(DLQ_DETAIL, bytes(bad.getMessage()));
      RecordMetadata origin = context.recordMetadata().orElse(null);
      if (origin != null) {
        headers.add(DLQ_TOPIC, bytes(origin.topic()));
        headers.add(DLQ_PARTITION, bytes(Integer.toString(origin.partition())));
        headers.add(DLQ_OFFSET, bytes(Long.toString(origin.offset())));
      }
      if (!namedSinks) throw new IllegalStateException("a re-keyed record without a valid id");
      context.forward(record.withHeaders(headers), "dead-letters");
      DEAD_LETTERS.incrementAndGet();
      DEDUP_DEAD_LETTERS.incrementAndGet();
    }

    private static byte[] bytes(String text) {
      return text.getBytes(StandardCharsets.UTF_8);
    }
  }

  /**
   * The re-keying step of the {@code repartition} topology: a record with a valid id is
   * forwarded keyed by the id's UTF-8 bytes (the selectKey), one without is forwarded with
   * a null key and the dead-letter headers (the topology sends those to the dead-letter
   * topic). The original key is replaced; in the bench's workload it is the id anyway.
   */
  static final class Rekey implements Processor<byte[], byte[], byte[], byte[]> {
    private final IdRule rule;
    private ProcessorContext<byte[], byte[]> context;

    Rekey(IdRule rule) {
      this.rule = rule;
    }

    @Override
    public void init(ProcessorContext<byte[], byte[]> context) {
      this.context = context;
    }

    @Override
    public void process(Record<byte[], byte[]> record) {
      String id;
      try {
        id = rule.extract(record.key(), record.value(), record.headers());
      } catch (InvalidRecord bad) {
        Headers headers = new RecordHeaders(record.headers().toArray());
        headers.add(DLQ_REASON, bad.reason.getBytes(StandardCharsets.UTF_8));
        headers.add(DLQ_DETAIL, String.valueOf(bad.getMessage()).getBytes(StandardCharsets.UTF_8));
        RecordMetadata origin = context.recordMetadata().orElse(null);
        if (origin != null) {
          headers.add(DLQ_TOPIC, origin.topic().getBytes(StandardCharsets.UTF_8));
          headers.add(DLQ_PARTITION, Integer.toString(origin.partition()).getBytes(StandardCharsets.UTF_8));
          headers.add(DLQ_OFFSET, Long.toString(origin.offset()).getBytes(StandardCharsets.UTF_8));
        }
        context.forward(record.<byte[]>withKey(null).withHeaders(headers));
        DEAD_LETTERS.incrementAndGet();
        return;
      }
      context.forward(record.withKey(id.getBytes(StandardCharsets.UTF_8)));
    }
  }

  static Topology plainTopology(
      String input, String output, String dlq, IdRule rule, String kind, long window) {
    Topology topology = new Topology();
    topology.addSource("input", input);
    topology.addProcessor("dedup", () -> new Dedup(rule, kind, window, true), "input");
    topology.addStateStore(store(kind, window), "dedup");
    topology.addSink("output", output, "dedup");
    topology.addSink("dead-letters", dlq, "dedup");
    return topology;
  }

  static Topology repartitionTopology(
      String input, String output, String dlq, IdRule rule, String kind, long window) {
    StreamsBuilder builder = new StreamsBuilder();
    builder.addStateStore(store(kind, window));
    KStream<byte[], byte[]> in =
        builder.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()));
    Map<String, KStream<byte[], byte[]>> branches =
        in.process(() -> new Rekey(rule), Named.as("rekey"))
            .split(Named.as("ids-"))
            .branch((key, value) -> key == null, Branched.as("invalid"))
            .defaultBranch(Branched.as("valid"));
    branches.get("ids-invalid").to(dlq, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
    IdRule byKey = new IdRule("key", rule.field);
    branches
        .get("ids-valid")
        .repartition(
            Repartitioned.<byte[], byte[]>as("by-id")
                .withKeySerde(Serdes.ByteArray())
                .withValueSerde(Serdes.ByteArray()))
        .process(() -> new Dedup(byKey, kind, window, false), Named.as("dedup"), STORE)
        .to(output, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
    return builder.build();
  }

  static StoreBuilder<?> store(String kind, long windowMs) {
    if (kind.equals("window")) {
      Duration window = Duration.ofMillis(windowMs);
      return Stores.windowStoreBuilder(
          Stores.persistentWindowStore(STORE, window, window, false),
          Serdes.String(),
          Serdes.ByteArray());
    }
    if (kind.equals("kv")) {
      return Stores.timestampedKeyValueStoreBuilder(
          Stores.persistentTimestampedKeyValueStore(STORE), Serdes.String(), Serdes.ByteArray());
    }
    throw new IllegalArgumentException("--store is window or kv, not " + kind);
  }

  /**
   * Whether every record is processed and committed: the dedup step has seen {@code records}
   * records (with the dead letters of the re-keying step), and on every partition it read,
   * the application's committed offset is past the last offset it processed.
   */
  static boolean finished(Map<TopicPartition, OffsetAndMetadata> committed, long records) {
    if (PROCESSED.get() + (DEAD_LETTERS.get() - deadLettersInDedup()) < records) return false;
    for (Map.Entry<TopicPartition, AtomicLong> last : LAST_OFFSETS.entrySet()) {
      OffsetAndMetadata at = committed.get(last.getKey());
      if (at == null || at.offset() <= last.getValue().get()) return false;
    }
    return true;
  }

  /** Dead letters the dedup step wrote (it counts them as processed already). */
  static long deadLettersInDedup() {
    return DEDUP_DEAD_LETTERS.get();
  }

  public static void main(String[] argv) throws Exception {
    if (argv.length < 7) {
      System.err.println(
          "usage: BOOTSTRAP INPUT OUTPUT DLQ RECORDS OUTPUTS STATE_DIR [--store window|kv]"
              + " [--window-ms MS] [--id-source jsonField|header|key] [--id-field NAME]"
              + " [--threads N] [--topology plain|repartition] [--application-id ID]");
      System.exit(2);
    }
    String bootstrap = argv[0], input = argv[1], output = argv[2], dlq = argv[3];
    long records = Long.parseLong(argv[4]), outputs = Long.parseLong(argv[5]);
    Path stateDir = Path.of(argv[6]);
    String storeKind = "window", idSource = "jsonField", idField = "messageId";
    String topologyKind = "plain";
    String appId = "kstreams-" + input;
    int threads = 1;
    long windowMs = 7L * 24 * 3600 * 1000;
    for (int i = 7; i + 1 < argv.length; i += 2) {
      switch (argv[i]) {
        case "--store" -> storeKind = argv[i + 1];
        case "--window-ms" -> windowMs = Long.parseLong(argv[i + 1]);
        case "--id-source" -> idSource = argv[i + 1];
        case "--id-field" -> idField = argv[i + 1];
        case "--threads" -> threads = Integer.parseInt(argv[i + 1]);
        case "--topology" -> topologyKind = argv[i + 1];
        case "--application-id" -> appId = argv[i + 1];
        default -> throw new IllegalArgumentException("unknown option " + argv[i]);
      }
    }
    IdRule rule = new IdRule(idSource, idField);
    final String kind = storeKind;
    final long window = windowMs;

    Topology topology =
        switch (topologyKind) {
          case "plain" -> plainTopology(input, output, dlq, rule, kind, window);
          case "repartition" -> repartitionTopology(input, output, dlq, rule, kind, window);
          default -> throw new IllegalArgumentException(
              "--topology is plain or repartition, not " + topologyKind);
        };

    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
    props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class);
    props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    // Everything else at Kafka Streams' defaults: commit.interval.ms 100 under exactly-once,
    // the changelog topic for the store, RocksDB's Kafka Streams configuration.

    AtomicReference<Throwable> failure = new AtomicReference<>();
    KafkaStreams streams = new KafkaStreams(topology, props);
    streams.setUncaughtExceptionHandler(
        e -> {
          failure.compareAndSet(null, e);
          return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
              .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    Properties adminProps = new Properties();
    adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);

    long started = System.nanoTime();
    double seconds;
    double steadySeconds;
    try (Admin admin = Admin.create(adminProps)) {
      streams.start();
      while (true) {
        if (failure.get() != null || streams.state() == KafkaStreams.State.ERROR) {
          throw new IllegalStateException("Kafka Streams failed", failure.get());
        }
        if (System.nanoTime() - started > TimeUnit.MILLISECONDS.toNanos(TIMEOUT_MS)) {
          throw new IllegalStateException(
              "did not commit " + records + " input records within " + TIMEOUT_MS + " ms");
        }
        Map<TopicPartition, OffsetAndMetadata> committed =
            admin.listConsumerGroupOffsets(appId).partitionsToOffsetAndMetadata().get();
        if (finished(committed, records)) break;
        Thread.sleep(20);
      }
      long committedAt = System.nanoTime();
      seconds = (committedAt - started) / 1e9;
      steadySeconds = (committedAt - firstRecordNanos) / 1e9;
    }
    long closing = System.nanoTime();
    streams.close(Duration.ofSeconds(60));
    double closeS = (System.nanoTime() - closing) / 1e9;
    long forwarded = OUTPUTS.get();
    System.err.printf(
        Locale.ROOT,
        "[kstreams] %d records in %.2f s: %,.0f records/s (steady %,.0f/s, startup %.2f s;"
            + " %d outputs, %d dead letters; close %.2f s)%n",
        records,
        seconds,
        records / seconds,
        records / steadySeconds,
        seconds - steadySeconds,
        forwarded,
        DEAD_LETTERS.get(),
        closeS);
    System.out.printf(
        Locale.ROOT,
        "{\"seconds\": %.4f, \"steady_seconds\": %.4f, \"records\": %d, \"outputs\": %d, \"dead_letters\": %d,"
            + " \"records_per_s\": %.1f, \"close_s\": %.3f, \"store\": \"%s\", \"topology\": \"%s\","
            + " \"threads\": %d}%n",
        seconds,
        steadySeconds,
        records,
        forwarded,
        DEAD_LETTERS.get(),
        records / seconds,
        closeS,
        storeKind,
        topologyKind,
        threads);
    if (forwarded != outputs) {
      System.err.printf(
          "[kstreams] forwarded %d outputs, expected %d (the bench checks the committed topic)%n",
          forwarded, outputs);
    }
    System.exit(0);
  }
}

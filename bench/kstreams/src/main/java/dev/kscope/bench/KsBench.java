package dev.kscope.bench;

import java.nio.file.Files;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;

/**
 * kscope's Kafka-scope workload on Kafka Streams with exactly_once_v2: every
 * input record becomes one output record (the same key and value), after an
 * optional blocking call (a sleep). It prints {"records":N,"seconds":S} on
 * stdout: N outputs visible to a read_committed reader after the first tenth
 * of the run's (its warm-up, which the kscope side's meter leaves out too), S
 * the time from the moment the reader saw that tenth to the last output
 * committed. A run too short to be seen at its tenth is timed from its first
 * input processed.
 *
 * <p>Arguments: brokers input output applicationId records threads sleepMs.
 */
public final class KsBench {
    public static void main(String[] args) throws Exception {
        String brokers = args[0], input = args[1], output = args[2], appId = args[3];
        long records = Long.parseLong(args[4]);
        int threads = Integer.parseInt(args[5]);
        long sleepMs = Long.parseLong(args[6]);

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
        p.put(StreamsConfig.STATE_DIR_CONFIG, Files.createTempDirectory("ks-bench").toString());
        p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class);
        p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // kscope's outputs go out uncompressed, as the backlog was written.
        p.put(StreamsConfig.producerPrefix("compression.type"), "none");

        AtomicLong firstNanos = new AtomicLong();
        StreamsBuilder b = new StreamsBuilder();
        b.<byte[], byte[]>stream(input).mapValues(v -> {
            firstNanos.compareAndSet(0, System.nanoTime());
            if (sleepMs > 0) {
                try {
                    Thread.sleep(sleepMs);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            return v;
        }).to(output);

        KafkaStreams streams = new KafkaStreams(b.build(), p);
        streams.start();
        long[] w = countCommitted(brokers, output, records);
        long end = System.nanoTime();
        streams.close(Duration.ofSeconds(30));
        long from = w[2] > 0 ? w[2] : firstNanos.get();
        long counted = w[2] > 0 ? w[0] - w[1] : w[0];
        System.out.printf("{\"records\":%d,\"seconds\":%.6f}%n", counted, (end - from) / 1e9);
    }

    /**
     * Reads output from the start as read_committed until it holds n records.
     * Returns the records seen, those seen when a tenth of n was first
     * reached, and when (System.nanoTime; 0 when the first poll already saw
     * them all).
     */
    private static long[] countCommitted(String brokers, String output, long n) {
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (PartitionInfo pi : consumer.partitionsFor(output, Duration.ofSeconds(30))) {
                tps.add(new TopicPartition(output, pi.partition()));
            }
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            long seen = 0, warmSeen = 0, warmAt = 0;
            while (seen < n) {
                ConsumerRecords<byte[], byte[]> recs = consumer.poll(Duration.ofMillis(50));
                seen += recs.count();
                if (warmAt == 0 && seen >= n / 10 && seen < n) {
                    warmAt = System.nanoTime();
                    warmSeen = seen;
                }
            }
            return new long[] {seen, warmSeen, warmAt};
        }
    }
}

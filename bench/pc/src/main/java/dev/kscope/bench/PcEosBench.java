package dev.kscope.bench;

import io.confluent.parallelconsumer.ParallelConsumerOptions;
import io.confluent.parallelconsumer.ParallelConsumerOptions.CommitMode;
import io.confluent.parallelconsumer.ParallelConsumerOptions.ProcessingOrder;
import io.confluent.parallelconsumer.ParallelStreamProcessor;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * kscope's Kafka-scope workload on Confluent Parallel Consumer in its
 * transactional mode (commitMode PERIODIC_TRANSACTIONAL_PRODUCER, KEY
 * ordering): every input record becomes one output record after a blocking
 * call (a sleep), produced in the transaction that commits the inputs'
 * offsets. It prints {"records":N,"seconds":S}: N outputs visible to a
 * read_committed reader after the first tenth of the run's (its warm-up,
 * which the kscope side's meter leaves out too), S the time from the moment
 * the reader saw that tenth to the last output committed. A run too short
 * to be seen at its tenth is timed from its first input handled.
 *
 * <p>Arguments: brokers input output group records concurrency sleepMillis.
 */
public final class PcEosBench {
  public static void main(String[] args) throws Exception {
    String brokers = args[0], input = args[1], output = args[2], group = args[3];
    long target = Long.parseLong(args[4]);
    int concurrency = Integer.parseInt(args[5]);
    long sleepMs = Long.parseLong(args[6]);

    Properties c = new Properties();
    c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, group + "-txn");
    p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "none");
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);

    ParallelConsumerOptions<byte[], byte[]> options =
        ParallelConsumerOptions.<byte[], byte[]>builder()
            .ordering(ProcessingOrder.KEY)
            .maxConcurrency(concurrency)
            .commitMode(CommitMode.PERIODIC_TRANSACTIONAL_PRODUCER)
            .consumer(new KafkaConsumer<>(c))
            .producer(new KafkaProducer<byte[], byte[]>(p))
            .build();
    ParallelStreamProcessor<byte[], byte[]> pc =
        ParallelStreamProcessor.createEosStreamProcessor(options);

    AtomicLong first = new AtomicLong();
    pc.subscribe(List.of(input));
    pc.pollAndProduce(
        ctx -> {
          first.compareAndSet(0, System.nanoTime());
          try {
            Thread.sleep(sleepMs);
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
          }
          var r = ctx.getSingleConsumerRecord();
          return new ProducerRecord<>(output, r.key(), r.value());
        });
    long[] w = countCommitted(brokers, output, target);
    long end = System.nanoTime();
    // Timed as the kscope side's meter times it: from the moment a tenth of
    // the outputs is committed (the warm-up left out) to the last.
    long from = w[2] > 0 ? w[2] : first.get();
    long counted = w[2] > 0 ? w[0] - w[1] : w[0];
    System.out.printf("{\"records\":%d,\"seconds\":%.6f}%n", counted, (end - from) / 1e9);
    System.out.flush();
    pc.closeDontDrainFirst();
    System.exit(0);
  }

  /**
   * Reads output from the start as read_committed until it holds n records.
   * Returns the records seen, those seen when a tenth of n was first
   * reached, and when (System.nanoTime; 0 when the first poll already saw
   * them all).
   */
  static long[] countCommitted(String brokers, String output, long n) {
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
      long deadline = System.nanoTime() + 5L * 60 * 1_000_000_000;
      while (seen < n) {
        if (System.nanoTime() > deadline) {
          System.err.println("pc-eos-bench: " + seen + " of " + n + " outputs committed in 5 minutes");
          System.exit(1);
        }
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

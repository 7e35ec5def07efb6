package dev.kscope.bench;

import io.confluent.parallelconsumer.ParallelConsumerOptions;
import io.confluent.parallelconsumer.ParallelConsumerOptions.CommitMode;
import io.confluent.parallelconsumer.ParallelConsumerOptions.ProcessingOrder;
import io.confluent.parallelconsumer.ParallelStreamProcessor;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Runs kscope's r4 workload on Confluent Parallel Consumer: KEY ordering,
 * a concurrency of 64, a 5 ms sleep per record. It times the run as kscope's
 * benchmark does, in its steady state: from the moment a tenth of the target
 * count of records is done to the moment the target count is, and prints one
 * JSON line with the records of that window: {"records":N,"seconds":S,"handler_ms":M}.
 *
 * <p>Arguments: brokers topic group records [concurrency] [sleepMillis].
 */
public final class PcBench {
  public static void main(String[] args) throws Exception {
    String brokers = args[0];
    String topic = args[1];
    String group = args[2];
    long target = Long.parseLong(args[3]);
    int concurrency = args.length > 4 ? Integer.parseInt(args[4]) : 64;
    long sleepMs = args.length > 5 ? Long.parseLong(args[5]) : 5;

    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p);

    ParallelConsumerOptions<byte[], byte[]> options =
        ParallelConsumerOptions.<byte[], byte[]>builder()
            .ordering(ProcessingOrder.KEY)
            .maxConcurrency(concurrency)
            .commitMode(CommitMode.PERIODIC_CONSUMER_ASYNCHRONOUS)
            .consumer(consumer)
            .build();
    ParallelStreamProcessor<byte[], byte[]> pc =
        ParallelStreamProcessor.createEosStreamProcessor(options);

    long warm = target / 10;
    AtomicLong warmAt = new AtomicLong();
    AtomicLong done = new AtomicLong();
    AtomicLong slept = new AtomicLong();
    CountDownLatch finished = new CountDownLatch(1);
    long[] end = new long[1];
    pc.subscribe(List.of(topic));
    pc.poll(
        ctx -> {
          long t0 = System.nanoTime();
          try {
            Thread.sleep(sleepMs);
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return;
          }
          slept.addAndGet(System.nanoTime() - t0);
          long n = done.incrementAndGet();
          if (n == warm) {
            warmAt.set(System.nanoTime());
          }
          if (n == target) {
            end[0] = System.nanoTime();
            finished.countDown();
          }
        });
    if (!finished.await(5, TimeUnit.MINUTES)) {
      System.err.println("pc-bench: " + done.get() + " of " + target + " records in 5 minutes");
      System.exit(1);
    }
    double seconds = (end[0] - warmAt.get()) / 1e9;
    double handlerMs = slept.get() / 1e6 / Math.max(1, done.get());
    System.out.printf(
        "{\"records\":%d,\"seconds\":%.4f,\"handler_ms\":%.3f}%n", target - warm, seconds, handlerMs);
    System.out.flush();
    pc.close();
    System.exit(0);
  }
}

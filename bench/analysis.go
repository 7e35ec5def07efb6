package main

import (
	"fmt"
	"runtime"

	"github.com/kscope-dev/kscope/internal/testenv"
)

// Why a target was missed, said with the run's own numbers, and what each
// scenario's contenders are.

// notes explain each scenario's contenders beyond their names.
var notes = map[string]string{
	"cpu_per_record": "The figures are r1's on Apache Kafka (the rows above): the same rounds, each contender's CPU (user and system, " +
		"`getrusage` of the bench process) over the run's window, the one its rate is timed over (start-up and stop left out), divided by the window's records. The broker is another process (a JVM), so the CPU is the consumer's own, " +
		"unlike r1 on kfake where the in-process broker's share dilutes the difference. The ratio is the median of the rounds' ratios. " +
		"The runner's own path, by its micro-benchmark `BenchmarkDispatchToDone -cpu 1` (no Kafka: a poll's records routed to their " +
		"key-shards, handed to the workers, run through the handler call, reported done, marked in the watermark), cost 133 to 156 ns a " +
		"record on the machine of 2026-11-29's runs, where the raw loop spent 300 to 450 ns of client work a record on Apache Kafka. A raw " +
		"loop that also hashes each record's key pays little for the key's first read, its misses overlapping; kscope's routing pass waited " +
		"for each key in turn until, since 2026-11-29, it asks the CPU for each key eight records ahead: routing a record went from 66 to 98 " +
		"ns to 33 to 44, and this ratio from 1.44 to 1.35 in rounds paired in one quick run, from 1.37 to 1.27 between the full runs of " +
		"record (bench/comparisons.md). The rest of the distance is the hand-off that per-key order across " +
		"parallel workers needs (a poll's records laid out by key-shard, queued, the workers woken, each record reported done to its " +
		"partition's watermark). Since 2026-11-29 the AtLeastOnce scope calls the handler directly when nothing wraps its call (no record " +
		"hooks, rate limits, breakers, admission rules or HandlerTimeout), which took this ratio from 1.53 to 1.37 in the full run. What " +
		"would move it further is a change of design, not of code: the per-poll block of records reused once all its records are given " +
		"back (a handler already may not keep a *Record, but every part of the runner that holds one, a delay topic's hold, a key's hold, " +
		"a transaction's records, would have to give it back first, and a record reused too early is a wrong effect), or handlers run on " +
		"the poll goroutine for a partition whose keys all fit one shard (no hand-off, but no parallelism either).",
	"r1_noop": "r1's target (0.9) is withdrawn: with the in-process broker and the runner on the same two cores, the ratio moved by 0.12 " +
		"between back-to-back runs of one build; `cpu_per_record` replaces it. Both consume with the same fetch settings (read_committed, 500 ms fetch max wait, franz-go's default fetch sizes). " +
		"The raw loop only counts the records of each poll; kscope routes each record to its key-shard worker, " +
		"tracks it in the partition's commit watermark, runs the handler and commits offsets every second.",
	"r3_db_vs_naive": "The naive loop: one consumer, one connection; per record `BEGIN`, the inbox row " +
		"(`INSERT … ON CONFLICT DO NOTHING`), the effect row, `COMMIT`, then a synchronous offset commit of that record. " +
		"kscope runs the DB scope with default options (16 shards, batches of up to 256 records of one shard per transaction) on a pool of 24 connections, " +
		"twice: with a queued handler (`dbscope.NewQueued`: the handler queues its insert and the batch's statements go in one pipelined round trip; " +
		"the ratio's numerator) and with a `tx.Exec` handler (one round trip per record; shown for comparison). " +
		"The naive loop runs fewer records per run (it is slow); its rate is steady after its first transaction.",
	"r3_db_vs_ceiling": "The ceiling writes the same rows with no Kafka and no handler round trips: each transaction holds " +
		"1,000 records, the inbox rows through the DB scope's own multi-row statement for a batch of first deliveries (`INSERT … SELECT unnest($2)`, " +
		"which the inbox's primary key checks as it inserts) " +
		"and the effect rows through the handler's statement, all sent as one pipelined batch; two connections (one per core) in parallel. " +
		"The kscope rows are those of r3 above.",
	"r3_batch_vs_ceiling": "The DB scope with a batch handler (`dbscope.NewBatch`) that writes its records' effect rows with one " +
		"`tx.CopyFrom`, in the transaction that inserts their inbox rows (the DB scope's `INSERT … SELECT unnest($2)`, which the inbox's " +
		"primary key checks: an id already there fails it, and the transaction is opened again with `ON CONFLICT DO NOTHING`). The ceiling writes the same inbox and effect rows with no Kafka and no deduplication: each transaction is a COPY of the " +
		"inbox rows and a COPY of the effect rows, as many records as the DB scope's batch, on 16 connections in parallel (as many as the DB scope's key-shards; with two, one per core, " +
		"the ceiling waits on its commits' WAL flushes and reaches a third of this rate).",
	"peer_watermill": "Watermill's Kafka subscriber (watermill-kafka v3, Sarama) with its default Sarama configuration " +
		"(oldest offset first); each message is handled in a goroutine of its own, as Watermill's router does, in one transaction " +
		"(inbox row, effect row) and then acknowledged. The subscriber sends a partition's next message only after the previous one's ack, " +
		"so at most one transaction per partition (8) is open at a time. The kscope rows are those of r3 above; the ratio uses the queued handler.",
	"r4_io_efficiency": "The handler sleeps 5 ms; 64 key-shards, 8 partitions, 10,000 keys. The ideal counts every shard busy all the time " +
		"with a handler that takes exactly 5 ms. Keys hash to shards unevenly, so near the end of a run the busiest shards still have " +
		"records while others are idle; that tail is inside the measured window.",
	"r5_txn_vs_alo": "Both runners use 16 shards and write one uncompressed output record per input to a fresh 8-partition topic. " +
		"The AtLeastOnce handler produces synchronously (it may return only once its output is acknowledged, or the " +
		"offset could be committed before the output exists). The Kafka scope produces inside a transaction that commits every 100 ms " +
		"(the default `CommitInterval`) together with the input offsets. It does not wait for each output's acknowledgment: outputs are " +
		"produced asynchronously and flushed once per transaction, which is why it outruns a correct at-least-once handler that must wait for each one.",
	"r5_dedupe_cost": "Both are the r5 Kafka-scope runner; with the guard each input's identity (here its coordinates: the inputs carry no " +
		"message id) is hashed (SHA-256, 16 bytes kept), looked up in its partition's state before the handler and, once it succeeded, " +
		"remembered there; each transaction writes one changelog record per partition and segment of 4,000 identities it remembered " +
		"(16 bytes each) and a tombstone per segment it forgets. The lookup was the largest part: a line of a partition's table of up to " +
		"100,000 identities (DefaultDedupeMaxIDs) that is not in the CPU's caches, about 300 ns of CPU each in the pipeline. Since " +
		"2026-11-29 the table reads one line a lookup and the scope reads the lines of a key-shard's whole batch before handling it, so " +
		"that their misses overlap: the guard's CPU a record (with it less without it) went from 800 to 880 ns to 360 to 480 in quick runs. " +
		"Both contenders warm up on runs of full size and run seven rounds; the ratio of one build still spreads by about 0.09 from run " +
		"to run, with the machine's other load. " +
		"bench/comparisons.md (\"r5_dedupe_cost\") has the profiles, what moved the ratio and what was tried.",
	"r5_dedupe_cost_apache": "The r5_dedupe_cost pair on Apache Kafka (the JVM broker is another process on the same two cores), same " +
		"inputs and options: what the guard costs a service whose broker is not in its own process. Reported beside the kfake row, " +
		"with no target of its own.",
	"peer_kstreams_eos_noop": "Both read the same 8-partition input from its start (200-byte values, 10,000 keys) and write one uncompressed " +
		"output per input to a fresh 8-partition topic, committing every 100 ms in Kafka transactions. Kafka Streams (bench/kstreams, " +
		"`org.apache.kafka:kafka-streams` " + testenv.ApacheKafkaVersion + ", the broker's version, pinned in bench/kstreams/pom.xml) runs `processing.guarantee=exactly_once_v2` with as many stream threads " +
		"as cores. Both are timed the same way: from the moment a tenth of the run's outputs is committed (the warm-up, a JVM's start and " +
		"its first rebalance included, left out; a read_committed reader of the output sees Kafka Streams' outputs) to the last. kscope's " +
		"Kafka scope (16 key-shards) is r5's contender.",
	"peer_kstreams_eos_io": "The same pipeline with a 2 ms blocking call (a sleep) per record. Kafka Streams parallelises by partition: " +
		"8 stream threads, one per partition, the most it can use, so at most 8 calls run at once (ideal about 3,800 records/s with 2.1 ms sleeps). " +
		"kscope parallelises by key within the partitions: 64 key-shards, 64 calls at once (ideal about 30,000 records/s); the ideal ratio is 8.",
	"peer_pc_eos": "Confluent Parallel Consumer 0.5.3.3 (bench/pc, PcEosBench) with `commitMode=PERIODIC_TRANSACTIONAL_PRODUCER`, " +
		"`ordering=KEY`, concurrency 64, producing one output per input with `pollAndProduce` after a 2 ms sleep, against kscope's Kafka scope " +
		"with 64 key-shards and the same call. Both read the same input from its start and are timed the same way: from the moment a tenth " +
		"of the run's outputs is committed (a read_committed reader of the output sees Parallel Consumer's) to the last, so that the " +
		"warm-up, which weighs more on a short run, is left out of both.",
	"share_vs_group": "Each contender is four member processes (AtLeastOnce runners, 8 key-shards each, a handler that sleeps 5 ms) of one new " +
		"group on a topic of 2 partitions, timed from the first record handled to the last. The consumer group can give the 2 partitions to 2 " +
		"of its 4 members only: the other two idle, so its ceiling is 2 × 8 handlers busy all the time (about 3,100 records/s with 5.1 ms sleeps). " +
		"The share group hands records of both partitions to all four members (ceiling about 6,200 records/s). What holds it below that: a member " +
		"polls again only once every record of its last poll is acknowledged (the client accepts what is left of a poll at the next one), so each " +
		"poll ends with a tail where some of its 8 key-shards are idle, and fetches only while it polls (no acquired record may wait in a buffer " +
		"while its lock runs out): a fetch round trip per poll. With 2 cores for 4 members and the broker, the machine is part of the figure.",
}

// analysis explains a missed target with the run's own numbers.
func analysis(s scenario, otherCores float64) string {
	cores := float64(runtime.NumCPU())
	last := s.figs[len(s.figs)-1]
	switch s.key {
	case "r3_db_vs_naive":
		return whyDBVsNaive(s, last, otherCores, cores)
	case "peer_parallel_consumer":
		if why, ok := whyParallelConsumer(s); ok {
			return why
		}
	case "r1_noop_apache":
		return whyR1Apache(s, cores)
	case "r1_noop":
		return whyR1(s, cores)
	case "r3_db_vs_ceiling":
		return whyDBVsCeiling(s, last, cores)
	case "r4_io_efficiency":
		return whyIOEfficiency(s)
	case "peer_watermill":
		return whyWatermill(s, last)
	}
	if s.noTarget {
		return "" // the note above says what each contender is
	}
	if s.profile.run != nil || s.profileText != "" {
		return "The profile below shows where the time goes."
	}
	return "See the runs above; this scenario has no analysis of its own."
}

// whyDBVsNaive explains r3_db_vs_naive, against the naive loop (last), by
// the CPU per record of each and the cores other processes took.
func whyDBVsNaive(s scenario, last figure, otherCores, cores float64) string {
	k, n := s.figs[0], last
	kb, kp := k.cpuPerRecord()
	nb, np := n.cpuPerRecord()
	kc, nc := (kb+kp)*k.median/1e6, (nb+np)*n.median/1e6
	return fmt.Sprintf("CPU per record, benchmark process + PostgreSQL: kscope %.0f µs, the naive loop %.0f µs (%.1f× more). "+
		"The naive loop is serial (one record, one transaction, one offset commit at a time) and kept %.2f cores busy; kscope spreads its "+
		"work over every core and kept %.2f busy, so it is the one that loses the CPU other processes took during this run "+
		"(%.2f cores on average). With all %d cores to itself, kscope's CPU per record bounds it at about %s records/s, "+
		"%.1f× the naive loop's %s.",
		kb+kp, nb+np, (nb+np)/(kb+kp), nc, kc, otherCores, int(cores), rate(cores*1e6/(kb+kp)), cores*1e6/(kb+kp)/n.median, rate(n.median))
}

// whyParallelConsumer explains peer_parallel_consumer by the time each
// runtime's 5 ms sleep took; ok is false when the handlers' times were not
// measured.
func whyParallelConsumer(s scenario) (why string, ok bool) {
	k, pc := s.figs[0], s.figs[1]
	kh, ph := k.handlerLatency(), pc.handlerLatency()
	if kh <= 0 || ph <= 0 {
		return "", false
	}
	ideal := 64 / ioDelay.Seconds()
	return fmt.Sprintf("Both runners keep 64 handlers busy, so neither passes 64 / the handler's time. That time is the runtime's, not the runner's: "+
		"kscope's `time.Sleep(5 * time.Millisecond)` took %.3f ms on average (Go's timers), Parallel Consumer's `Thread.sleep(5)` %.3f ms "+
		"(the JVM's), which bounds them at %s and %s records/s. Against its own bound kscope kept %.1f%% of its handlers busy and "+
		"Parallel Consumer %.1f%%: per handler slot the runners are at %.3f of each other, and the rest of the ratio is the two timers. "+
		"No runner passes the ideal of 64 / 5 ms = %s records/s, and Parallel Consumer reached %.3f of it, so the most any runner could "+
		"reach on this workload is %.3f× Parallel Consumer: the target of 1.2 cannot be met here, by kscope or any other runner.",
		kh.Seconds()*1000, ph.Seconds()*1000, rate(64/kh.Seconds()), rate(64/ph.Seconds()),
		100*k.median*kh.Seconds()/64, 100*pc.median*ph.Seconds()/64, (k.median*kh.Seconds())/(pc.median*ph.Seconds()),
		rate(ideal), pc.median/ideal, ideal/pc.median), true
}

// whyR1Apache explains r1_noop_apache by the consumer's own CPU per
// record, the broker being a process of its own.
func whyR1Apache(s scenario, cores float64) string {
	k, raw := s.figs[0], s.figs[1]
	kc, _ := k.cpuPerRecord()
	rc, _ := raw.cpuPerRecord()
	return fmt.Sprintf("The broker is a JVM process here, so the benchmark process's CPU is the consumer's alone: %.2f µs per record under kscope, "+
		"%.2f µs under the raw loop (%.2f and %.2f of the %d cores busy; the broker's CPU is not in these figures). "+
		"kscope's extra work per record is that of r1 on kfake (routing, the hand-off to a key-shard worker, the done report), "+
		"and on two cores shared with the broker it takes CPU the broker would use to serve the next fetch.",
		kc, rc, kc*k.median/1e6, rc*raw.median/1e6, int(cores))
}

// whyR1 explains r1_noop: kscope's CPU per record on top of the raw
// loop's, and where the distance between them is.
func whyR1(s scenario, cores float64) string {
	k, raw := s.figs[0], s.figs[1]
	kc, _ := k.cpuPerRecord()
	rc, _ := raw.cpuPerRecord()
	perRaw := 1e6 / raw.median
	return fmt.Sprintf("Per record the benchmark process (broker included) spent %.2f µs of CPU under kscope and %.2f µs under the raw loop: "+
		"kscope's own per-record work costs about %.2f µs of CPU. The raw loop takes %.3f µs of wall time per record, so the target "+
		"leaves kscope %.3f µs per record on top (1/0.9 − 1 of it). Neither contender kept the %d cores busy (kscope %.2f cores, the raw loop %.2f): "+
		"the pace is set by the in-process broker, which serves fetches from one goroutine on the same cores, and, for kscope, by the hand-off "+
		"of every record from the poll loop to a worker. Timed fetch by fetch (Before and after: \"r1: where the distance is, along a fetch's timeline\"), the whole distance is in the fetch chain: the broker's response to a fetch takes about 40%% longer while kscope's dispatch and workers run beside it, the decode keeps its pace, and the poll loop is back in time for the next response. What is left of a record's trip through the runner is per record only where it must be: "+
		"the key hash, its slot in a per-poll block, and on the worker the revocation check, the handler call and the done report; the watermark, "+
		"the shard queues, the in-flight accounting and the worker wake-ups are per poll or per batch of up to 64. Each key-shard's records of "+
		"a poll sit together in the poll's block, so a worker walks consecutive memory; the poll loop's first read of each record the client "+
		"decoded (its key, for the route) is a cache miss that a loop that only counts never pays. The poll loop alone, every polled record "+
		"counted done where it was polled, reached 0.925 (Before and after, below): the runner's shell costs about 0.07 of the ratio, the hand-off "+
		"and the workers' work the rest. The in-flight bound is the other part: the client fetches the next response only once the last one is "+
		"all taken, so the runner polls only while half its bound (100,000 records by default) is free, and a poll takes a whole response; "+
		"`make bench` measures the ratio against the bound (the table \"r1 against the in-flight bound\"). Against a broker across a "+
		"network, where a raw consumer waits on fetches rather than on its broker's CPU, the same per-record cost weighs less.",
		kc, rc, kc-rc, perRaw, perRaw*(1/0.9-1), int(cores), kc*k.median/1e6, rc*raw.median/1e6)
}

// whyDBVsCeiling explains r3_db_vs_ceiling, against the ceiling (last),
// by the CPU per record of each and the records per transaction.
func whyDBVsCeiling(s scenario, last figure, cores float64) string {
	k, c := s.figs[0], last
	kb, kp := k.cpuPerRecord()
	cb, cp := c.cpuPerRecord()
	r := k.recordsPerTxn()
	return fmt.Sprintf("CPU per record, benchmark process + PostgreSQL: kscope %.0f + %.0f = %.0f µs, the ceiling %.0f + %.0f = %.0f µs. "+
		"With %d cores shared by both, that bounds kscope at about %s records/s (measured %s) and the ceiling at about %s (measured %s): "+
		"the ratio is the ratio of CPU per record. kscope's transactions held %.1f records on average (the ceiling's 1,000), so `BEGIN`, `COMMIT` "+
		"and the WAL flush are paid %.0f× as often, and consuming from Kafka costs CPU the ceiling does not spend.",
		kb, kp, kb+kp, cb, cp, cb+cp, int(cores), rate(cores*1e6/(kb+kp)), rate(k.median), rate(cores*1e6/(cb+cp)), rate(c.median),
		r, 1000/max(r, 1))
}

// whyIOEfficiency explains r4_io_efficiency by the time the handler's
// 5 ms sleep really took, and the timer's ceiling measured beside it.
func whyIOEfficiency(s scenario) string {
	k := s.figs[0]
	h := k.handlerLatency()
	text := fmt.Sprintf("The ideal assumes a 5 ms sleep takes 5 ms. In this run it took %.2f ms on average inside kscope's handler: "+
		"Go's timers wake a sleeping goroutine late by the scheduler's latency, more so when 64 sleeps end at different moments "+
		"than when they end together, and more on a busy virtual machine. That alone caps the ratio at %.3f. Against the time its handler "+
		"really took, the runner kept %.1f%% of its 64 shards busy: the rest is the tail of a run, where the shards that drew the "+
		"most keys still have records while the others are done.",
		h.Seconds()*1000, ioDelay.Seconds()/h.Seconds(), 100*k.median*h.Seconds()/64)
	if len(s.figs) > 1 {
		c := s.figs[1]
		text += fmt.Sprintf(" The timer's ceiling measured beside it, with no Kafka and no runner, reached %.3f of the ideal; "+
			"kscope reached %.3f of that ceiling.", c.median/s.ideal, k.median/c.median)
	}
	return text
}

// whyWatermill explains peer_watermill by Watermill's CPU per message and
// PostgreSQL's ceiling (last) for these rows.
func whyWatermill(s scenario, last figure) string {
	k, w, c := s.figs[0], s.figs[2], last
	wb, wp := w.cpuPerRecord()
	return fmt.Sprintf("Watermill spends %.0f µs (benchmark process) + %.0f µs (PostgreSQL) of CPU per message: on this machine it is bound by CPU "+
		"more than by waiting for one WAL flush per message, which is what a 10× margin assumes. PostgreSQL's own ceiling for these rows (the last row) "+
		"is %.1f× Watermill here, and no consumer gets past it: 10× Watermill is %s records/s, %.0f%% of the ceiling's %s; kscope reaches %s. "+
		"What limits kscope here is what limits `r3_db_vs_ceiling`.",
		wb, wp, c.median/w.median, rate(10*w.median), 1000*w.median/c.median, rate(c.median), rate(k.median))
}

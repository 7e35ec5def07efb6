package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/txn"
)

// ioDelay is the I/O-bound handler's latency.
const ioDelay = 5 * time.Millisecond

// cfg is the consumer configuration every kscope contender starts from: a
// fresh group on the benchmark topic, defaults elsewhere.
func (b *bench) cfg(prefix string, shards int) consumer.Config {
	return consumer.Config{
		Brokers: b.k.Brokers,
		Group:   b.name(prefix),
		Topics:  []string{b.topic},
		Shards:  shards,
		Logger:  b.log,
		// Outputs and failure records uncompressed, as the backlog is.
		ClientOptions: []kgo.Opt{kgo.ProducerBatchCompression(kgo.NoCompression())},
	}
}

// rawClient is a plain franz-go group consumer with the fetch settings
// kscope's runner uses (read_committed, 500ms fetch max wait).
func (b *bench) rawClient(group string, opts ...kgo.Opt) (*kgo.Client, error) {
	return b.k.Client(append([]kgo.Opt{
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(b.topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(500 * time.Millisecond),
	}, opts...)...)
}

func fetchErr(fs kgo.Fetches) error {
	var errs []error
	fs.EachError(func(t string, p int32, err error) {
		errs = append(errs, fmt.Errorf("%s[%d]: %w", t, p, err))
	})
	return errors.Join(errs...)
}

// rawLoop is the r1 baseline: PollFetches and count, nothing else.
func (b *bench) rawLoop(ctx context.Context, n int) (result, error) {
	m := newMeter(n)
	cl, err := b.rawClient(b.name("raw"))
	if err != nil {
		return result{}, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	for m.n.Load() < m.target {
		fs := cl.PollFetches(ctx)
		if err := fetchErr(fs); err != nil {
			return result{}, err
		}
		fs.EachRecord(func(*kgo.Record) { m.add(1) })
	}
	return m.result(), nil
}

// kscopeNoop is r1's numerator: the AtLeastOnce runner, a no-op handler.
func (b *bench) kscopeNoop(ctx context.Context, n int) (result, error) {
	return b.kscopeNoopBound(0)(ctx, n)
}

// kscopeNoopBound is kscopeNoop with the given MaxInFlightRecords (0: the
// default).
func (b *bench) kscopeNoopBound(bound int) func(ctx context.Context, n int) (result, error) {
	return func(ctx context.Context, n int) (result, error) { return b.noop(ctx, n, bound) }
}

func (b *bench) noop(ctx context.Context, n, bound int) (result, error) {
	m := newMeter(n)
	cfg := b.cfg("noop", 0)
	cfg.MaxInFlightRecords = bound
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
		m.start()
		return nil
	}))
	if err != nil {
		return result{}, err
	}
	err = untilDone(ctx, m, r.Run, func() int64 { return r.Stats().Done })
	return m.result(), err
}

// timerCeiling is r4's reference, measured beside kscope: 64 goroutines,
// no Kafka, each sleeping ioDelay per record in a loop, their starts spread
// over one ioDelay as busy key-shards' are. It is what the 5 ms handler
// allows on this machine with no consumer at all: the timer's overshoot
// on each sleep is in it, the runner's cost is not.
func timerCeiling(shards int) func(ctx context.Context, n int) (result, error) {
	return func(ctx context.Context, n int) (result, error) {
		m := newMeter(n)
		var slept, calls atomic.Int64
		var wg sync.WaitGroup
		for i := range shards {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(i) * ioDelay / time.Duration(shards))
				m.start()
				for {
					select {
					case <-m.done:
						return
					case <-ctx.Done():
						return
					default:
					}
					t0 := time.Now()
					time.Sleep(ioDelay)
					slept.Add(int64(time.Since(t0)))
					calls.Add(1)
					m.add(1)
				}
			}()
		}
		wg.Wait()
		res := m.result()
		if c := calls.Load(); c > 0 {
			res.handler = time.Duration(slept.Load() / c)
		}
		return res, ctx.Err()
	}
}

// kscopeIO is r4's numerator: the AtLeastOnce runner with a handler that
// waits ioDelay, on the given number of key-shards.
func (b *bench) kscopeIO(shards int) func(ctx context.Context, n int) (result, error) {
	return func(ctx context.Context, n int) (result, error) {
		m := newMeter(n)
		var slept, calls atomic.Int64
		r, err := consumer.New(b.cfg("io", shards), consumer.HandlerFunc(func(context.Context, *consumer.Record) error {
			m.start()
			t0 := time.Now()
			time.Sleep(ioDelay)
			slept.Add(int64(time.Since(t0)))
			calls.Add(1)
			m.add(1)
			return nil
		}))
		if err != nil {
			return result{}, err
		}
		// Counted as the handler returns, as the timer's ceiling and the
		// Parallel Consumer harness count: no ticker of the harness wakes
		// between the sleepers.
		rctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- r.Run(rctx) }()
		err = waitMeter(ctx, m, errc)
		cancel()
		if err == nil {
			err = <-errc
		}
		res := m.result()
		if c := calls.Load(); c > 0 {
			res.handler = time.Duration(slept.Load() / c)
		}
		return res, err
	}
}

// kscopeDB is the DB scope with default settings (BatchSize 0 selects the
// default) and a handler that inserts one effect row.
func (b *bench) kscopeDB(batch int) func(ctx context.Context, n int) (result, error) {
	return func(ctx context.Context, n int) (result, error) {
		m := newMeter(n)
		r, err := dbscope.New(b.cfg("db", 0), dbscope.Options{Pool: b.pool, BatchSize: batch},
			dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, rec *consumer.Record) error {
				m.start()
				_, err := tx.Exec(ctx, sqlEffect, src(rec.Topic, rec.Partition, rec.Offset), rec.Key, rec.Value)
				return err
			}))
		if err != nil {
			return result{}, err
		}
		return runDB(ctx, m, r)
	}
}

// runDB runs a DB-scope runner until the meter's records are done.
func runDB(ctx context.Context, m *meter, r *dbscope.Runner) (result, error) {
	err := untilDone(ctx, m, r.Run, func() int64 { return r.Stats().Done })
	res := m.result()
	// Transactions over the whole run: a close estimate of the measured
	// window's, which holds nearly all of them.
	res.txns = r.Stats().DB.Transactions
	return res, err
}

// kscopeDBQueued is the DB scope with default settings and a queued
// handler (dbscope.NewQueued) that queues the same one-row insert: the
// statements of a batch go to PostgreSQL in one round trip.
func (b *bench) kscopeDBQueued(batch int) func(ctx context.Context, n int) (result, error) {
	return func(ctx context.Context, n int) (result, error) {
		m := newMeter(n)
		r, err := dbscope.NewQueued(b.cfg("dbq", 0), dbscope.Options{Pool: b.pool, BatchSize: batch},
			dbscope.QueueFunc(func(_ context.Context, q *dbscope.Queue, rec *consumer.Record) error {
				m.start()
				q.Exec(sqlEffect, src(rec.Topic, rec.Partition, rec.Offset), rec.Key, rec.Value)
				return nil
			}))
		if err != nil {
			return result{}, err
		}
		return runDB(ctx, m, r)
	}
}

// naiveDB is r3's first baseline: one transaction per record (inbox row,
// effect row), then a synchronous offset commit of that record.
func (b *bench) naiveDB(ctx context.Context, n int) (result, error) {
	m := newMeter(n)
	group := b.name("naive")
	cl, err := b.rawClient(group, kgo.DisableAutoCommit())
	if err != nil {
		return result{}, err
	}
	defer cl.Close()
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return result{}, err
	}
	defer conn.Release()
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	for m.n.Load() < m.target {
		fs := cl.PollFetches(ctx)
		if err := fetchErr(fs); err != nil {
			return result{}, err
		}
		for it := fs.RecordIter(); !it.Done() && m.n.Load() < m.target; {
			rec := it.Next()
			m.start()
			id := src(rec.Topic, rec.Partition, rec.Offset)
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, sqlNaiveInbox, group, id); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, sqlEffect, id, rec.Key, rec.Value)
				return err
			})
			if err != nil {
				return result{}, err
			}
			if err := cl.CommitRecords(ctx, rec); err != nil {
				return result{}, err
			}
			m.add(1)
		}
	}
	res := m.result()
	res.txns = int64(n)
	return res, nil
}

// Ceiling settings: records per transaction and connections in parallel.
const (
	ceilingBatch = 1000
	ceilingConns = 2
)

// ceilingDB is r3's second baseline: the same inbox and effect rows, no
// Kafka, written ceilingBatch records per transaction over ceilingConns
// connections. Each transaction is one pipelined round trip: the inbox rows
// with the DB scope's own multi-row statement (the one for a batch of first
// deliveries), then the effect rows with the handler's statement, one per
// record.
func (b *bench) ceilingDB(ctx context.Context, n int) (result, error) {
	m := newMeter(n)
	consumerName := b.name("ceiling")
	value := make([]byte, valueSize)
	// The DB scope's statement for a batch of first deliveries: a plain
	// insert, which the inbox's primary key checks (dbscope's inboxInsert).
	inbox := `INSERT INTO kscope_inbox (consumer, message_id) SELECT $1, unnest($2::text[])`
	var wg sync.WaitGroup
	errc := make(chan error, ceilingConns)
	m.start()
	for c := range ceilingConns {
		wg.Go(func() {
			for first := c * ceilingBatch; first < n; first += ceilingConns * ceilingBatch {
				last := min(first+ceilingBatch, n)
				ids := make([]string, 0, last-first)
				batch := &pgx.Batch{}
				for i := first; i < last; i++ {
					ids = append(ids, src(b.topic, int32(i%partitions), int64(i/partitions)))
				}
				batch.Queue(inbox, consumerName, ids)
				for i, id := range ids {
					batch.Queue(sqlEffect, id, keyOf(first+i), value)
				}
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					return tx.SendBatch(ctx, batch).Close()
				})
				if err != nil {
					errc <- err
					return
				}
				m.add(int64(len(ids)))
			}
		})
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return result{}, err
	}
	res := m.result()
	res.txns = int64((n + ceilingBatch - 1) / ceilingBatch)
	return res, nil
}

// watermillDB is the peer: Watermill's Kafka subscriber (Sarama), each
// message handled in its own goroutine as Watermill's router does, in one
// transaction (inbox row, effect row), then acknowledged. The subscriber
// sends a partition's next message only after the previous one's ack.
func (b *bench) watermillDB(ctx context.Context, n int) (result, error) {
	m := newMeter(n)
	group := b.name("watermill")
	sc := wmkafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
		Brokers:               b.k.Brokers,
		Unmarshaler:           wmkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         group,
	}, watermill.NopLogger{})
	if err != nil {
		return result{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, b.topic)
	if err != nil {
		sub.Close()
		return result{}, err
	}
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		for msg := range msgs {
			wg.Go(func() {
				m.start()
				p, _ := wmkafka.MessagePartitionFromCtx(msg.Context())
				o, _ := wmkafka.MessagePartitionOffsetFromCtx(msg.Context())
				key, _ := wmkafka.MessageKeyFromCtx(msg.Context())
				id := src(b.topic, p, o)
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, sqlNaiveInbox, group, id); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, sqlEffect, id, key, []byte(msg.Payload))
					return err
				})
				if err != nil {
					msg.Nack()
					if ctx.Err() == nil {
						select {
						case errc <- err:
						default:
						}
					}
					return
				}
				msg.Ack()
				m.add(1)
			})
		}
	}()
	err = waitMeter(ctx, m, errc)
	cancel()
	cerr := sub.Close() // closes msgs
	<-loopDone
	wg.Wait()
	if err != nil {
		return result{}, err
	}
	_ = cerr // closing after cancel reports the canceled session; the run is done
	res := m.result()
	res.txns = int64(n)
	return res, nil
}

// outputTopic creates a fresh output topic for r5.
func (b *bench) outputTopic(ctx context.Context, prefix string) (string, error) {
	t := b.name(prefix)
	return t, b.k.CreateTopic(ctx, t, partitions)
}

// aloProduce is r5's denominator: AtLeastOnce, the handler producing its
// output synchronously (an at-least-once handler returns only once its
// output is acknowledged).
func (b *bench) aloProduce(ctx context.Context, n int) (result, error) {
	out, err := b.outputTopic(ctx, "bench.out.alo")
	if err != nil {
		return result{}, err
	}
	prod, err := b.k.Client(kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		return result{}, err
	}
	defer prod.Close()
	m := newMeter(n)
	r, err := consumer.New(b.cfg("alo-produce", 0), consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		m.start()
		return prod.ProduceSync(ctx, &kgo.Record{Topic: out, Key: rec.Key, Value: rec.Value}).FirstErr()
	}))
	if err != nil {
		return result{}, err
	}
	err = untilDone(ctx, m, r.Run, func() int64 { return r.Stats().Done })
	return m.result(), err
}

// txnEmit is r5's numerator: the Kafka scope with default options, one
// output per input.
func (b *bench) txnEmit(ctx context.Context, n int) (result, error) {
	return b.txnEmitWith(nil)(ctx, n)
}

// txnEmitWith is txnEmit with the idempotency guard's options (nil: off),
// r5_dedupe_cost's two contenders.
func (b *bench) txnEmitWith(dedupe *txn.DedupeOptions) func(ctx context.Context, n int) (result, error) {
	return func(ctx context.Context, n int) (result, error) { return b.txnRun(ctx, n, dedupe) }
}

func (b *bench) txnRun(ctx context.Context, n int, dedupe *txn.DedupeOptions) (result, error) {
	out, err := b.outputTopic(ctx, "bench.out.txn")
	if err != nil {
		return result{}, err
	}
	m := newMeter(n)
	cfg := b.cfg("txn", 0)
	r, err := txn.New(cfg, txn.Options{TransactionalID: cfg.Group, Dedupe: dedupe}, txn.HandlerFunc(func(_ context.Context, rec *consumer.Record, e txn.Emitter) error {
		m.start()
		e.Emit(&kgo.Record{Topic: out, Key: rec.Key, Value: rec.Value})
		return nil
	}))
	if err != nil {
		return result{}, err
	}
	err = untilDone(ctx, m, r.Run, func() int64 { return r.Stats().Kafka.Records })
	return m.result(), err
}

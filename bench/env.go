package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// Shape of the benchmark topic, the same for every scenario and contender.
const (
	partitions = 8
	keys       = 10_000
	valueSize  = 200
	keySize    = 9 // "k-" and seven digits: see keyOf
)

// bench holds the backends and settings of one benchmark run.
type bench struct {
	k    *testenv.Kafka
	pg   *testenv.Postgres // nil when the run needs no database
	pool *pgxpool.Pool
	runs int

	topic string
	seq   atomic.Int64
	log   *slog.Logger // the consumers' logs: discarded
	out   io.Writer    // progress
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.out, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// name returns a fresh name (consumer group, transactional id, topic).
func (b *bench) name(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, b.seq.Add(1))
}

func keyOf(i int) []byte { return fmt.Appendf(nil, "k-%07d", i%keys) }

// produceBacklog writes n records to a new topic: keys spread over the key
// space, valueSize-byte values, no compression.
func (b *bench) produceBacklog(ctx context.Context, topic string, n int) error {
	if err := b.k.CreateTopic(ctx, topic, partitions); err != nil {
		return fmt.Errorf("creating %s: %w", topic, err)
	}
	return b.produceTo(ctx, topic, n)
}

// produceTo writes n records of the backlog's kind to topic, which exists.
func (b *bench) produceTo(ctx context.Context, topic string, n int) error {
	cl, err := b.k.Client(
		kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProducerBatchMaxBytes(1<<20),
		kgo.MaxBufferedRecords(200_000),
		kgo.ProducerLinger(5*time.Millisecond),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	value := make([]byte, valueSize)
	for i := range value {
		value[i] = byte('a' + rng.IntN(26))
	}
	var (
		firstErr error
		errMu    sync.Mutex
	)
	for i := range n {
		rec := &kgo.Record{Topic: topic, Key: keyOf(rng.IntN(keys)), Value: value}
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				errMu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				errMu.Unlock()
			}
		})
		if i%200_000 == 199_999 {
			b.logf("produced %d of %d records", i+1, n)
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	errMu.Lock()
	defer errMu.Unlock()
	return firstErr
}

// effectsDDL is the handler's table: one row per record, for every
// contender of the DB scenarios.
const effectsDDL = `CREATE TABLE IF NOT EXISTS bench_effects (
    id  bigserial PRIMARY KEY,
    src text  NOT NULL,
    k   bytea,
    v   bytea
)`

const (
	sqlEffect     = `INSERT INTO bench_effects (src, k, v) VALUES ($1, $2, $3)`
	sqlNaiveInbox = `INSERT INTO kscope_inbox (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`
)

// setupDB creates kscope's tables and the effects table.
func (b *bench) setupDB(ctx context.Context) error {
	if err := dbscope.Migrate(ctx, b.pool, ""); err != nil {
		return err
	}
	_, err := b.pool.Exec(ctx, effectsDDL)
	return err
}

// resetDB empties the inbox and effects tables and checkpoints, so that
// every run starts from the same database state.
func (b *bench) resetDB(ctx context.Context) error {
	_, err := b.pool.Exec(ctx, `TRUNCATE kscope_inbox, bench_effects`)
	if err != nil {
		return err
	}
	// A checkpoint needs privileges an external server may not grant: best
	// effort.
	_, _ = b.pool.Exec(ctx, `CHECKPOINT`)
	return nil
}

// src is a record's identity as the DB scope computes it by default.
func src(topic string, p int32, o int64) string {
	return fmt.Sprintf("%s/%d/%d", topic, p, o)
}

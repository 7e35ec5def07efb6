package main

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
)

// copyBatch is the records per transaction of r3_batch_vs_ceiling's two
// contenders: the DB scope's default BatchSize (the most its transactions
// take) and the COPY ceiling's transaction size.
const copyBatch = dbscope.DefaultBatchSize

// copyConns is the COPY ceiling's connections in parallel: as many as the
// DB scope's key-shards (consumer.DefaultShards), each with a transaction
// open at a time. With two, one per core, the ceiling waited on its
// commits' WAL flushes and reached a third of the rate it reaches with 4,
// 8 or 16 (which agreed within a run's noise).
const copyConns = consumer.DefaultShards

// r3Batch: the DB scope with a batch handler that writes its effect rows
// with one COPY, against PostgreSQL taking the same inbox and effect rows
// with COPY, transactions of the same size.
func (b *bench) r3Batch(ctx context.Context, p plan, rep *report) error {
	bh := contender{fmt.Sprintf("kscope DB scope, batch handler writing with CopyFrom (16 shards, batch %d)", copyBatch), p.db, b.kscopeDBBatch(copyBatch), b.resetDB}
	figs, err := b.measure(ctx, "r3 batch handler", bh,
		contender{fmt.Sprintf("PostgreSQL ceiling: COPY of the inbox and effect rows, %d records per transaction, %d connections, no Kafka", copyBatch, copyConns), p.ceiling, b.copyCeiling(copyBatch), b.resetDB})
	if err != nil {
		return err
	}
	rep.add(scenario{key: "r3_batch_vs_ceiling", title: "r3: DB scope's batch handler against PostgreSQL's COPY ceiling", figs: figs,
		pair: pairOf(figs[0], figs[1]), target: 0.9, atLeast: true, profile: bh, cpu: true})
	return nil
}

// kscopeDBBatch is the DB scope with a batch handler (dbscope.NewBatch)
// that copies the effect rows of its records into the table with one COPY.
func (b *bench) kscopeDBBatch(batch int) func(ctx context.Context, n int) (result, error) {
	return func(ctx context.Context, n int) (result, error) {
		m := newMeter(n)
		r, err := dbscope.NewBatch(b.cfg("dbb", 0), dbscope.Options{Pool: b.pool, BatchSize: batch},
			dbscope.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, recs []*consumer.Record) error {
				m.start()
				_, err := tx.CopyFrom(ctx, effectsTable, effectsCols, pgx.CopyFromSlice(len(recs), func(i int) ([]any, error) {
					rec := recs[i]
					return []any{src(rec.Topic, rec.Partition, rec.Offset), rec.Key, rec.Value}, nil
				}))
				return err
			}))
		if err != nil {
			return result{}, err
		}
		return runDB(ctx, m, r)
	}
}

var (
	effectsTable = pgx.Identifier{"bench_effects"}
	effectsCols  = []string{"src", "k", "v"}
	inboxTable   = pgx.Identifier{"kscope_inbox"}
	inboxCols    = []string{"consumer", "message_id"}
)

// copyCeiling is r3_batch_vs_ceiling's baseline: the same inbox and effect
// rows, no Kafka, no deduplication, each transaction (txSize records) one
// COPY of the inbox rows and one of the effect rows, over copyConns
// connections.
func (b *bench) copyCeiling(txSize int) func(ctx context.Context, n int) (result, error) {
	return func(ctx context.Context, n int) (result, error) {
		m := newMeter(n)
		consumerName := b.name("copy-ceiling")
		value := make([]byte, valueSize)
		var wg sync.WaitGroup
		errc := make(chan error, copyConns)
		m.start()
		for c := range copyConns {
			wg.Go(func() {
				for first := c * txSize; first < n; first += copyConns * txSize {
					last := min(first+txSize, n)
					inbox := make([][]any, 0, last-first)
					effects := make([][]any, 0, last-first)
					for i := first; i < last; i++ {
						id := src(b.topic, int32(i%partitions), int64(i/partitions))
						inbox = append(inbox, []any{consumerName, id})
						effects = append(effects, []any{id, keyOf(i), value})
					}
					err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
						if _, err := tx.CopyFrom(ctx, inboxTable, inboxCols, pgx.CopyFromRows(inbox)); err != nil {
							return err
						}
						_, err := tx.CopyFrom(ctx, effectsTable, effectsCols, pgx.CopyFromRows(effects))
						return err
					})
					if err != nil {
						errc <- err
						return
					}
					m.add(int64(len(inbox)))
				}
			})
		}
		wg.Wait()
		close(errc)
		if err := <-errc; err != nil {
			return result{}, err
		}
		res := m.result()
		res.txns = int64((n + txSize - 1) / txSize)
		return res, nil
	}
}

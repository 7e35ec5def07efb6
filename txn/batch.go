package txn

import (
	"context"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/batchcall"
)

// BatchEmitter collects a batch handler's output records, each tied to
// the input record it is an output of. A record's outputs are produced,
// inside the transaction its input offset commits in, only if that record
// succeeded (see [BatchHandler]).
type BatchEmitter interface {
	// Emit adds out to the outputs of recs[i], i being the index of the
	// input record in the slice the handler was given.
	Emit(i int, out *kgo.Record)
}

// BatchHandler transforms the ready records of one key-shard together,
// in the Kafka scope: up to 64 records of one partition that were queued
// when its worker took them, in offset order (records of several keys;
// per-key order holds). Its error says what became of each record:
//
//   - nil: every record succeeded, and each one's outputs join the open
//     transaction with its input offset;
//   - consumer.FailedAt(i, err): the records before i succeeded (their
//     outputs join the transaction), record i failed with err and is
//     routed by the failure policy on its own (a retry in place, which
//     calls the handler with record i alone; a retry topic or the
//     dead-letter topic, whose record joins the transaction; a skip), and
//     the records after i are handled again, in later calls, after record
//     i's outcome (the outputs the call emitted for them are dropped);
//   - any other error, or a panic: no record is known to have succeeded
//     and no output is kept. The batch is isolated: each of its records
//     is handled again alone (the handler is called with a one-record
//     slice), so each gets an outcome of its own.
//
// Records that the admission rules turn away (consumer.Config.Keep,
// MaxAge) are not passed to it. With Options.Versions, the handler is
// called with one record at a time: each record's version is checked, and
// its key's last version advanced, before the next record of the key runs.
type BatchHandler interface {
	HandleBatch(ctx context.Context, recs []*consumer.Record, out BatchEmitter) error
}

// BatchHandlerFunc adapts a function to [BatchHandler].
type BatchHandlerFunc func(ctx context.Context, recs []*consumer.Record, out BatchEmitter) error

// HandleBatch calls f(ctx, recs, out).
func (f BatchHandlerFunc) HandleBatch(ctx context.Context, recs []*consumer.Record, out BatchEmitter) error {
	return f(ctx, recs, out)
}

// NewBatch returns a Kafka-scope runner whose handler takes the ready
// records of a key-shard together (see [BatchHandler]). Everything [New]
// says holds, record by record: a record's outputs and its input offset
// commit in one Kafka transaction, and a failing record is routed by the
// failure policy on its own, its route in the transaction.
func NewBatch(cfg consumer.Config, o Options, h BatchHandler) (*Runner, error) {
	if h == nil {
		return nil, &consumer.ConfigError{Struct: "txn.NewBatch's handler", Reason: "is nil; pass the function that turns each batch of inputs into outputs"}
	}
	if cfg.KeyBreaker != nil {
		return nil, &consumer.ConfigError{Field: "KeyBreaker", Reason: "is set for a batch handler (txn.NewBatch), whose calls take the records of many keys at once; " +
			"the circuit breaker of each key holds one key's records: use a per-record handler (txn.New), or leave KeyBreaker nil"}
	}
	bs := &batchState{h: h}
	r, err := New(cfg, o, bs)
	if err != nil {
		return nil, err
	}
	r.s.batch = bs
	return r, nil
}

// batchState is a batch handler and the outcomes its batch calls left
// for the records' per-record paths (see preset).
type batchState struct {
	h       BatchHandler
	presets sync.Map // *consumer.Record → *preset
}

// preset is a record's first attempt, already made by a batch call: its
// outputs and its error.
type preset struct {
	out []*kgo.Record
	err error
}

// Handle implements Handler for the per-record path: a record's first
// attempt returns what its batch call said of it; any other calls the
// batch handler with the record alone.
func (bs *batchState) Handle(ctx context.Context, r *consumer.Record, out Emitter) error {
	if p, ok := bs.presets.LoadAndDelete(r); ok {
		p := p.(*preset)
		for _, o := range p.out {
			out.Emit(o)
		}
		return p.err
	}
	err := bs.h.HandleBatch(ctx, []*consumer.Record{r}, oneEmitter{out})
	if i, ierr, ok := consumer.FailedIndex(err); ok && i == 0 {
		return ierr
	}
	return err
}

// oneEmitter is the BatchEmitter of a one-record call.
type oneEmitter struct{ out Emitter }

func (e oneEmitter) Emit(i int, out *kgo.Record) {
	if i == 0 {
		e.out.Emit(out)
	}
}

// batchEmitter collects a batch call's outputs per input record.
type batchEmitter struct {
	out [][]*kgo.Record
}

// Emit implements BatchEmitter; an index outside the batch is ignored.
func (e *batchEmitter) Emit(i int, out *kgo.Record) {
	if i >= 0 && i < len(e.out) {
		e.out[i] = append(e.out[i], out)
	}
}

// processBatch runs a batch through the batch handler, then each record
// through the per-record path (handle), whose first attempt is the batch
// call's outcome for it: its outputs, or its route, join the open
// transaction there, one record after the other, as a Handler's do.
func (s *kafkaScope) processBatch(ctx context.Context, batch []*consumer.Record, done func(*consumer.Record)) {
	bs := s.batch
	if s.vs != nil {
		for _, rec := range batch {
			if !s.handle(ctx, rec, done) {
				return
			}
		}
		return
	}
	outs := map[*consumer.Record][]*kgo.Record{}
	batchcall.Run(batch, batchcall.Calls[*consumer.Record]{
		Admit: s.eng.Admit,
		Batch: func(rs []*consumer.Record) error {
			em := &batchEmitter{out: make([][]*kgo.Record, len(rs))}
			err := s.eng.CallBatch(ctx, rs, func(ctx context.Context) error { return bs.h.HandleBatch(ctx, rs, em) })
			clear(outs)
			for i, r := range rs {
				outs[r] = em.out[i]
			}
			return err
		},
		FailedAt: consumer.FailedIndex,
		Each: func(r *consumer.Record, first batchcall.First) bool {
			if first.Ran {
				p := &preset{err: first.Err}
				if first.Err == nil {
					p.out = outs[r]
				}
				bs.presets.Store(r, p)
			}
			ok := s.handle(ctx, r, done)
			bs.presets.Delete(r) // not asked for: the record ended before its handler
			return ok
		},
	})
}

package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/internal/kafkaerr"
)

// Taking a partition over: fencing earlier producers and reading the
// partition's position.

// takeOver starts publishing the partition (start), retrying with backoff
// until it succeeds or ctx ends (then ok is false), or the broker refuses
// the relay its transactional id or the position topic (an authorization
// error, which retrying cannot heal: it returns it, saying what to grant),
// or the database lacks the dead-letter table (a *dbscope.SchemaError,
// which says to run Migrate).
func (pub *publisher) takeOver(ctx context.Context, cl *kgo.Client, log *slog.Logger) (pos int64, ok bool, err error) {
	for attempt := 1; ; attempt++ {
		pos, err := pub.start(ctx, cl)
		if err == nil {
			return pos, true, nil
		}
		if ctx.Err() != nil {
			return 0, false, nil
		}
		if errors.As(err, new(*dbscope.SchemaError)) {
			return 0, false, fmt.Errorf("kscope: outbox relay: taking partition %d over: %w", pub.p, err)
		}
		if errors.Is(err, kerr.TransactionalIDAuthorizationFailed) || kafkaerr.Fatal(err) {
			o := pub.r.o
			return 0, false, fmt.Errorf("kscope: outbox relay: taking partition %d over: %w; grant this client Write and Describe on the transactional id %s-%d and Read and Describe on the position topic %s, then start the relay again",
				pub.p, err, o.TransactionalID, pub.p, o.PositionTopic)
		}
		d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
		log.Warn("kscope: outbox relay: taking the partition over failed; retrying", "err", err, "retry_in", d)
		if !backoff.Sleep(ctx, d) {
			return 0, false, nil
		}
	}
}

// start fences every earlier producer of the partition (aborting its open
// transaction) and reads the partition's position: the last sequence
// number a committed transaction published. A row after the position
// that the dead-letter table holds already is doomed: it is not sent
// again. (A relay moves a refused row out of the outbox as it
// dead-letters it; a relay of an earlier version left it in both tables
// when it stopped before the transaction carrying the position past it
// committed.)
func (pub *publisher) start(ctx context.Context, cl *kgo.Client) (int64, error) {
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return 0, fmt.Errorf("initialising the producer: %w", err)
	}
	ps, err := readPositions(ctx, pub.r.o, []int{pub.p})
	if err != nil {
		return 0, err
	}
	pos := ps[pub.p]
	if pub.doomed != nil && pub.doomed.seq == pos+1 {
		return pos, nil
	}
	r := pub.r
	var why string
	err = r.o.Pool.QueryRow(ctx, `SELECT error FROM `+r.o.TablePrefix+`outbox_dead WHERE outbox = $1 AND partition = $2 AND seq = $3`,
		r.o.Outbox, int32(pub.p), pos+1).Scan(&why)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return 0, fmt.Errorf("looking the partition's next row up in the dead-letter table: %w", schemaErr(ctx, r.o.Pool, r.o.TablePrefix, err))
	default:
		pub.doomed = &refusal{seq: pos + 1, err: errors.New(why)}
	}
	return pos, nil
}

// tookOver reports pos, the position read as the partition was taken
// over, once the rows up to it that a relay stopped between its commit
// and their deletion left behind are deleted. Only when the database has
// handed pos out: a position ahead of the database (see ahead) deletes
// nothing, and the publisher halts the partition once it finds no row
// after it.
func (pub *publisher) tookOver(ctx context.Context, pos int64) {
	if ahead, err := pub.ahead(ctx, pos); err != nil || ahead {
		pub.pos.Store(pos)
		return
	}
	pub.moveTo(ctx, pos)
}

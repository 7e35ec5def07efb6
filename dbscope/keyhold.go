package dbscope

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/scope"
)

// The circuit breaker of each key (consumer.Config.KeyBreaker) in the DB
// scope, which holds keys itself (scope.HoldInScope), in PostgreSQL. The
// failure that holds a key (Failures.Decide returns
// retrytopic.ActionHold) stores its record in the waiting table, first
// among its key's records, with a parked row marked held that carries the
// time of the key's probe (probe_at) and the probes that failed in a row
// (probes); nothing goes to a retry topic, and the record is done once
// its transaction commits. The key's later records wait behind that
// parked row as behind a head in the retry topics. The recovery pass
// (recoverParking, every releaseInterval) releases the held keys whose
// probe is due: the release transaction takes the held row, marks the
// first waiting record as the key's probe (Failures.KeyProbe) and applies
// the records in order, as any release does. A probe that fails in a way
// the breaker matches holds the key again, its record still first; a
// record behind it that holds the key becomes the held head. All of it
// happens in the transactions that apply the records, so a process that
// stops anywhere leaves the key held (probed again at the stored time) or
// released, never half of each.

// KeyHolds implements scope.KeyHolder: the DB scope keeps the records of a
// held key in PostgreSQL. A batch handler's runner (NewBatch) holds none:
// its calls take the records of many keys at once, and the runner refuses
// consumer.Config.KeyBreaker for it.
func (s *dbScope) KeyHolds() scope.KeyHold {
	if s.bh != nil {
		return 0
	}
	return scope.HoldInScope
}

// initHoldSQL prepares the statements of held keys for table prefix p.
func (s *dbScope) initHoldSQL(p string) {
	// A held key's parked row: a head in the retry topics that is held
	// becomes held in place.
	s.sqlHold = `INSERT INTO ` + p + `parked (consumer, topic, key, message_id, original_offset, stage, held, probe_at, probes)
		VALUES ($1, $2, $3, $4, $5, 0, true, now() + $6::bigint * interval '1 microsecond', $7)
		ON CONFLICT (consumer, topic, key, message_id) DO UPDATE SET
			stage = 0, version = NULL, held = true, probe_at = EXCLUDED.probe_at, probes = EXCLUDED.probes`
	// A record held as it is consumed goes before the records already
	// waiting behind its key's head (see 007_key_hold.sql).
	s.sqlWaitFirst = `INSERT INTO ` + p + `waiting (id, consumer, topic, key, message_id, src_topic, src_partition, src_offset, ts, value, header_keys, header_values, version)
		VALUES (-nextval(pg_get_serial_sequence('` + p + `waiting', 'id')), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`
	s.sqlTakeProbe = `DELETE FROM ` + p + `parked WHERE consumer = $1 AND topic = $2 AND key = $3 AND held AND probe_at <= now()
		RETURNING message_id, probes`
	s.sqlDueHeld = `SELECT topic, key FROM ` + p + `parked WHERE consumer = $1 AND held AND probe_at <= now() ORDER BY probe_at`
	s.sqlCountHeld = `SELECT count(*) FROM ` + p + `parked WHERE consumer = $1 AND held`
}

// hold makes record i, whose failure herr holds its key (step, with the
// cool-down until the probe as its Delay), its key's held head: it is
// stored first in the waiting table, its inbox status 'parked', with a
// parked row marked held, in this transaction; it is done once it
// commits. The key's later records in the transaction wait for the next
// one, which stores them behind it.
func (b *batchTx) hold(i int, herr error, step retrytopic.Step) error {
	r, m := b.work[i], b.metas[i]
	k := pairKey{m.OriginalTopic, string(r.Key)}
	b.res[i] = result{out: heldOutcome, err: herr, step: step}
	b.block(r)
	b.q.Exec(b.s.sqlWaitFirst, b.s.waitArgs(k.topic, r, b.ids[i], b.version(i))...)
	b.park.set(k, parkRow{id: b.ids[i], offset: m.OriginalOffset})
	b.waiting[k] = true
	b.storedWaiting = true
	b.setStatus(i, statusParked, 0, 0)
	_, err := b.tx.Exec(b.ctx, b.s.sqlHold, b.s.o.Consumer, k.topic, r.Key, b.ids[i], m.OriginalOffset, step.Delay.Microseconds(), 0)
	return err
}

// keyProbe is the probe of one held key, across the transactions of its
// release.
type keyProbe struct {
	settled bool   // a release transaction committed: it took the key's held row, or found none to take
	failed  int    // the probes of the key that failed before this one
	id      string // the identity of the record marked as the probe, once marked
}

// takeProbe, in a release transaction under the key's lock, takes the held
// row of key when its probe is due, and reports whether it did: the
// transaction's first record is the key's probe. A key no longer held, or
// not due yet (another process probed it meanwhile), is released as any
// other: the held row, while it is there, keeps it from running.
func (s *dbScope) takeProbe(ctx context.Context, tx pgx.Tx, topic string, key []byte, p *keyProbe) (bool, error) {
	var id string
	err := tx.QueryRow(ctx, s.sqlTakeProbe, s.o.Consumer, topic, key).Scan(&id, &p.failed)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// markProbe marks w, the first record a release transaction that took its
// key's held row runs, as the key's probe (Failures.KeyProbe), once: dl
// keeps the delivery, and its mark, across the transactions of the
// release.
func (s *dbScope) markProbe(w *waitingRow, dl releaseDeliveries, p *keyProbe) {
	if p.id != "" {
		return
	}
	r := w.rec
	if d, ok := dl[w.id]; ok {
		r = d
	}
	p.id = w.id
	s.f.KeyProbe(r, p.failed)
}

// holdReleased holds the key again, in a release transaction, for the
// waiting record w (delivered as r) whose failure herr Decide answered
// with step (ActionHold): w stays first in the waiting table, its key's
// held head, probed again after step.Delay. A probe that failed counts in
// the held row's probes; a record behind it starts them again.
func (s *dbScope) holdReleased(ctx context.Context, tx pgx.Tx, topic string, key []byte, w *waitingRow, r *consumer.Record, herr error, step retrytopic.Step, rel *released) error {
	probes := 0
	if p := rel.probe; p != nil && p.id == w.id {
		probes = p.failed + 1
	}
	if _, err := tx.Exec(ctx, s.sqlHold, s.o.Consumer, topic, key, w.id, s.f.Metadata(r).OriginalOffset, step.Delay.Microseconds(), probes); err != nil {
		return err
	}
	rel.hold = true
	rel.failed++
	rel.ends = append(rel.ends, releasedEnd{rec: r, out: hook.OutcomeHeld, err: herr})
	return nil
}

// probeHeld releases the held keys whose probe is due, each as its key's
// probe (see keyProbe), then counts the keys held (Stats.DB.HeldKeys). It
// runs whatever the configuration: keys held by a deployment with a key
// breaker are released by one without.
func (s *dbScope) probeHeld(ctx context.Context) error {
	rows, err := s.o.Pool.Query(ctx, s.sqlDueHeld, s.o.Consumer)
	if err != nil {
		return err
	}
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (heldKey, error) {
		var k heldKey
		err := row.Scan(&k.topic, &k.key)
		return k, err
	})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := s.releaseKey(ctx, k.topic, k.key, &keyProbe{}); err != nil {
			return err
		}
	}
	var n int64
	if err := s.o.Pool.QueryRow(ctx, s.sqlCountHeld, s.o.Consumer).Scan(&n); err != nil {
		return err
	}
	s.heldKeys.Store(n)
	return nil
}

package dbscope

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/retrytopic"
)

// parkRow is a row of the parked table.
type parkRow struct {
	id      string
	offset  int64
	stage   int
	version int64 // 0 when versions are not checked
}

// pairKey names a (original topic, key) pair.
type pairKey struct{ topic, key string }

// parking is the parked state of the keys of one transaction's records, as
// read at its start and changed by it.
type parking map[pairKey][]parkRow

func (p parking) head(k pairKey) (parkRow, bool) {
	rows := p[k]
	if len(rows) == 0 {
		return parkRow{}, false
	}
	h := rows[0]
	for _, r := range rows[1:] {
		if r.offset < h.offset {
			h = r
		}
	}
	return h, true
}

func (p parking) has(k pairKey, id string) bool {
	for _, r := range p[k] {
		if r.id == id {
			return true
		}
	}
	return false
}

func (p parking) set(k pairKey, row parkRow) {
	for i, r := range p[k] {
		if r.id == row.id {
			p[k][i] = row
			return
		}
	}
	p[k] = append(p[k], row)
}

func (p parking) remove(k pairKey, id string) {
	rows := p[k]
	for i, r := range rows {
		if r.id == id {
			p[k] = append(rows[:i], rows[i+1:]...)
			return
		}
	}
}

// ordered reports whether a new failure makes its record its key's head,
// later records of the key waiting behind it.
func (s *dbScope) ordered() bool {
	p := s.f.Policy()
	return !p.Unordered && !p.DisableRetryTopics && len(p.Ladder) > 0
}

// honours reports whether the transactions look up and honour the parked
// heads and waiting records of their keys: always in an ordered pipeline
// and with a key breaker (consumer.Config.KeyBreaker, whose held keys are
// parked rows); in a pipeline that is neither, while the consumer may have
// such rows, left by a deployment that was ordered (see parkWatch).
func (s *dbScope) honours() bool {
	return s.ordered() || s.holdKeys || s.parkRows.maybe()
}

// parkWatch tracks whether the consumer may have parked or waiting rows,
// for a pipeline that parks no new failure: its transactions skip the
// lookup of their keys' rows only while a scan of the tables, newer than
// every waiting row this process stored, found none. It starts as "may
// have" (its zero value).
type parkWatch struct {
	stored  atomic.Int64 // bumped after a transaction that stored a waiting row commits, and when a scan finds rows
	scanned atomic.Int64 // 1 + stored as it was before the last scan that found no row; 0 before any
}

// maybe reports whether the consumer may have parked or waiting rows.
func (w *parkWatch) maybe() bool { return w.stored.Load()+1 != w.scanned.Load() }

// storedRows records that a transaction that stored a waiting row committed.
func (w *parkWatch) storedRows() { w.stored.Add(1) }

// scan runs exists, which reports whether the consumer has parked or
// waiting rows, and records its answer. A row stored after the scan began
// is reported by storedRows after it commits, so it keeps maybe true.
func (w *parkWatch) scan(exists func() (bool, error)) (bool, error) {
	before := w.stored.Load()
	found, err := exists()
	switch {
	case err != nil:
		return true, err
	case found:
		if !w.maybe() {
			w.stored.Add(1)
		}
	default:
		w.scanned.Store(before + 1)
	}
	return found, nil
}

// parkedKeys returns the (original topic, key) pairs of the keyed records of
// work, whose parked rows the transaction reads.
func parkedKeys(work []*consumer.Record, metas []retrytopic.Metadata) (topics []string, keys [][]byte) {
	for i, r := range work {
		if r.Key != nil {
			topics = append(topics, metas[i].OriginalTopic)
			keys = append(keys, r.Key)
		}
	}
	return topics, keys
}

// scanParking reads the rows of sqlLoadParked.
func scanParking(rows pgx.Rows) (parking, error) {
	defer rows.Close()
	p := parking{}
	for rows.Next() {
		var topic string
		var key []byte
		var row parkRow
		if err := rows.Scan(&topic, &key, &row.id, &row.offset, &row.stage, &row.version); err != nil {
			return nil, err
		}
		k := pairKey{topic, string(key)}
		p[k] = append(p[k], row)
	}
	return p, rows.Err()
}

// begin opens the transaction, inserts the inbox rows of ids and reads
// what the transaction needs to know of the batch: which ids are new, the
// outcome the inbox remembers for the others, and, when the scope honours
// parking (s.honours), the parked heads and waiting records of the batch's
// keys. The
// common case — every id new, no key of the batch parked or waiting —
// costs one round trip (BEGIN, the inbox rows, one lookup of the keys) and
// takes no lock. Otherwise a second round trip locks the busy keys (so the
// worker of a key's retry topic and the one of its source topic do not
// interleave on it) and reads their state under the lock, with the
// remembered outcomes of the ids that were not new. A key found idle needs
// no lock: only a transaction that already sees it busy (a head or waiting
// records, both committed before any retry record of the key exists) can
// change its state concurrently.
func (s *dbScope) begin(ctx context.Context, ids []string, work []*consumer.Record, metas []retrytopic.Metadata, honour bool) (tx pgx.Tx, fresh freshIDs, known map[string]inboxStatus, park parking, waiting map[pairKey]bool, err error) {
	plain := s.inbox.usePlain(metas)
	if plain {
		s.inbox.plain.Add(1)
	}
	tx, fresh, busy, err := s.openTx(ctx, ids, work, metas, honour, plain)
	if plain && isDuplicateID(err) {
		// An id of the batch is in the inbox already: nothing of this
		// transaction ran but its inbox rows, which the rollback undoes.
		s.inbox.conflicted()
		if err := tx.Rollback(ctx); err != nil {
			return tx, fresh, nil, nil, nil, err
		}
		tx, fresh, busy, err = s.openTx(ctx, ids, work, metas, honour, false)
	}
	if err != nil {
		return tx, fresh, nil, nil, nil, err
	}
	var seenBefore []string
	if !fresh.all {
		for _, id := range ids {
			if !fresh.ids[id] {
				seenBefore = append(seenBefore, id)
			}
		}
	}
	known, park, waiting, err = s.loadState(ctx, tx, busy, seenBefore)
	return tx, fresh, known, park, waiting, err
}

// freshIDs says which ids of a batch got a new inbox row: all of them, or
// those in ids.
type freshIDs struct {
	all bool
	ids map[string]bool
}

// has reports whether id's inbox row is new.
func (f freshIDs) has(id string) bool { return f.all || f.ids[id] }

// busyKeys are the keys of a batch that have a parked head or waiting
// records, as two parallel arrays for the SQL.
type busyKeys struct {
	topics []string
	keys   [][]byte
}

// openTx is begin's first round trip: BEGIN, the inbox rows of ids (fresh
// names those that are new), and, when the scope honours parking, which
// keys of the batch are busy. plain writes the inbox rows with the plain
// insert (inboxInsert): every id is new when it succeeds, and an id already
// there fails it, with the transaction.
func (s *dbScope) openTx(ctx context.Context, ids []string, work []*consumer.Record, metas []retrytopic.Metadata, honour, plain bool) (tx pgx.Tx, fresh freshIDs, busy busyKeys, err error) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	var topics []string
	var keys [][]byte
	if honour {
		topics, keys = parkedKeys(work, metas)
	}
	if plain {
		b.Queue(s.inbox.sqlNew, s.o.Consumer, ids)
	} else {
		b.Queue(s.sqlInbox, s.o.Consumer, ids)
	}
	if len(keys) > 0 {
		b.Queue(s.sqlBusyKeys, s.o.Consumer, topics, keys)
	}
	br := s.o.Pool.SendBatch(ctx, b)
	tx = br.Tx()
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	if _, err := br.Exec(); err != nil { // BEGIN
		return tx, fresh, busy, err
	}
	if plain {
		if _, err := br.Exec(); err != nil {
			return tx, fresh, busy, err
		}
		fresh.all = true
	} else if err := readFresh(br, &fresh); err != nil {
		return tx, fresh, busy, err
	}
	if len(keys) > 0 {
		var rows pgx.Rows
		if rows, err = br.Query(); err != nil {
			return tx, fresh, busy, err
		}
		_, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
			var topic string
			var key []byte
			err := row.Scan(&topic, &key)
			busy.topics, busy.keys = append(busy.topics, topic), append(busy.keys, key)
			return struct{}{}, err
		})
	}
	return tx, fresh, busy, err
}

// readFresh reads the checked insert's row into fresh: whether every id
// got a new row and, when not, those that did.
func readFresh(br pgx.BatchResults, fresh *freshIDs) error {
	var newIDs []string
	if err := br.QueryRow().Scan(&fresh.all, &newIDs); err != nil {
		return err
	}
	if !fresh.all {
		fresh.ids = make(map[string]bool, len(newIDs))
		for _, id := range newIDs {
			fresh.ids[id] = true
		}
	}
	return nil
}

// loadState is begin's second round trip, when there is something to
// read: it locks the busy keys and reads their parked heads and waiting
// records, and reads the remembered outcomes of the ids seen before.
func (s *dbScope) loadState(ctx context.Context, tx pgx.Tx, busy busyKeys, seenBefore []string) (known map[string]inboxStatus, park parking, waiting map[pairKey]bool, err error) {
	known, park, waiting = map[string]inboxStatus{}, parking{}, map[pairKey]bool{}
	if len(seenBefore) == 0 && len(busy.keys) == 0 {
		return known, park, waiting, nil
	}
	b := &pgx.Batch{}
	if len(busy.keys) > 0 {
		b.Queue(s.sqlLockKeys, s.o.Consumer, busy.topics, busy.keys)
		b.Queue(s.sqlLoadParked, s.o.Consumer, busy.topics, busy.keys)
		b.Queue(s.sqlLoadWaitingKeys, s.o.Consumer, busy.topics, busy.keys)
	}
	if len(seenBefore) > 0 {
		b.Queue(s.sqlStatus, s.o.Consumer, seenBefore)
	}
	br := tx.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	if len(busy.keys) > 0 {
		if _, err := br.Exec(); err != nil { // the locks
			return nil, nil, nil, err
		}
		rows, err := br.Query()
		if err != nil {
			return nil, nil, nil, err
		}
		if park, err = scanParking(rows); err != nil {
			return nil, nil, nil, err
		}
		if rows, err = br.Query(); err != nil {
			return nil, nil, nil, err
		}
		if _, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
			var topic string
			var key []byte
			err := row.Scan(&topic, &key)
			waiting[pairKey{topic, string(key)}] = true
			return struct{}{}, err
		}); err != nil {
			return nil, nil, nil, err
		}
	}
	if len(seenBefore) > 0 {
		rows, err := br.Query()
		if err != nil {
			return nil, nil, nil, err
		}
		if _, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
			var id string
			var st inboxStatus
			err := row.Scan(&id, &st.status, &st.attempt, &st.stage, &st.via)
			known[id] = st
			return struct{}{}, err
		}); err != nil {
			return nil, nil, nil, err
		}
	}
	return known, park, waiting, nil
}

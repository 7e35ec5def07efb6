package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/internal/kafkaerr"
	"github.com/kscope-dev/kscope/retrytopic"
)

// workers are the publishers of the partitions a relay owns now.
type workers struct {
	r     *Relay
	mu    sync.Mutex
	run   map[int]*publisher
	wg    sync.WaitGroup
	fatal func() error
	err   error
	// failed is closed when a publisher failed for good (err), so that
	// Run returns at once.
	failed chan struct{}
}

func newWorkers(r *Relay) *workers {
	w := &workers{r: r, run: map[int]*publisher{}, failed: make(chan struct{})}
	w.fatal = func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.err
	}
	return w
}

// start starts publishing partition p.
func (w *workers) start(ctx context.Context, p int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.run[p] != nil {
		return
	}
	pctx, cancel := context.WithCancel(ctx)
	pub := &publisher{r: w.r, p: p, cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1)}
	pub.pos.Store(-1)
	w.run[p] = pub
	w.r.wakeMu.Lock()
	w.r.wake[p] = pub.wake
	w.r.pubs[p] = pub
	w.r.wakeMu.Unlock()
	w.r.owned.Add(1)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer close(pub.done)
		if err := pub.publish(pctx); err != nil && pctx.Err() == nil {
			w.fail(err)
		}
	}()
}

// fail fails the relay with err, unless it failed already: Run returns
// the first error.
func (w *workers) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
		close(w.failed)
	}
}

// stop stops publishing partition p and waits until its open transaction
// ended.
func (w *workers) stop(p int) {
	w.mu.Lock()
	pub := w.run[p]
	delete(w.run, p)
	w.mu.Unlock()
	if pub == nil {
		return
	}
	pub.cancel()
	<-pub.done
	w.r.wakeMu.Lock()
	delete(w.r.wake, p)
	delete(w.r.pubs, p)
	w.r.wakeMu.Unlock()
	w.r.owned.Add(-1)
}

func (w *workers) stopAll() {
	w.mu.Lock()
	ps := make([]int, 0, len(w.run))
	for p := range w.run {
		ps = append(ps, p)
	}
	w.mu.Unlock()
	for _, p := range ps {
		w.stop(p)
	}
	w.wg.Wait()
}

// publisher publishes one outbox partition.
type publisher struct {
	r      *Relay
	p      int
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{}
	pos    atomic.Int64 // the position its last committed transaction published; -1 until read
	stuck  atomic.Bool  // its last transaction failed for a reason an operator must fix

	// The rest is the publishing goroutine's alone.

	// probe bounds the rows of the next transaction while a record Kafka
	// refused is searched for (0: BatchSize). It halves with each refused
	// transaction and doubles with each committed one.
	probe int
	// lone is the row at the head of the partition that Kafka refused
	// when it was sent alone, and how many times in a row; once that
	// reaches refusalsToDeadLetter, doomed holds it and why.
	lone struct {
		seq int64
		n   int
	}
	doomed *refusal
	// stuckAt is the row that made the partition stuck: a transaction
	// that commits it ends the stuck state.
	stuckAt int64
	// Rate limits of the ERROR lines.
	deadLog, stuckLog, misplacedLog throttle
	// checkedTo is the last row checked for its partition (misplaced).
	checkedTo int64
}

// refusal is a row Kafka refused for good, and its answer.
type refusal struct {
	seq int64
	err error
}

// refusalsToDeadLetter is how many times in a row a row must be refused
// alone before it is dead-lettered: a refusal that a broker gives once (a
// corrupted request) is not taken for the row's.
const refusalsToDeadLetter = 3

// errorLogEvery is how often an ERROR that a state goes on is repeated.
const errorLogEvery = 30 * time.Second

// throttle lets a log line through at most once an interval and counts
// the ones it held back meanwhile.
type throttle struct {
	last time.Time
	held int
}

// allow reports whether a line may be logged now, and how many were held
// back since the last one.
func (t *throttle) allow() (held int, ok bool) {
	now := time.Now()
	if !t.last.IsZero() && now.Sub(t.last) < errorLogEvery {
		t.held++
		return 0, false
	}
	held, t.held, t.last = t.held, 0, now
	return held, true
}

// row is one outbox row.
type row struct {
	seq int64
	// id is the row's identity when the row holds one (a row requeued
	// from the dead-letter table keeps the one it was written with), ""
	// when it is the row's place: see publisher.ident.
	id      string
	topic   string
	key     []byte
	value   []byte
	headers []byte
	created time.Time
}

// producerOpts are the options of a partition's transactional producer.
func (o Options) producerOpts(txnID string) []kgo.Opt {
	return append(append([]kgo.Opt{}, o.ClientOptions...),
		kgo.SeedBrokers(o.Brokers...),
		kgo.TransactionalID(txnID),
		kgo.TransactionTimeout(o.TransactionTimeout),
		kgo.RecordPartitioner(positionPartitioner{topic: o.PositionTopic, rest: kgo.StickyKeyPartitioner(nil)}),
		kgo.ProducerLinger(0),
	)
}

// errFenced says another producer with the partition's transactional id
// took over: this one must stop.
var errFenced = errors.New("fenced")

// publish fences any earlier producer of the partition, reads its
// position, and publishes rows after it until ctx is done. A fenced
// producer stops: another relay owns the partition now.
func (pub *publisher) publish(ctx context.Context) error {
	log := pub.r.log.With("partition", pub.p)
	defer pub.setStuck(false) // the partition is no longer this relay's to report
	for attempt := 1; ; attempt++ {
		renew, err := pub.publishWith(ctx, log)
		if renew == nil || err != nil || ctx.Err() != nil {
			return err
		}
		// Another producer of the partition's transactional id fenced
		// this one, or the broker aborted a transaction that outlived
		// TransactionTimeout (it fences the producer too), or ended one
		// with an answer that leaves the producer failed for good. While
		// the partition is still this relay's (a rebalance that gave it
		// to another relay cancels ctx first), a new producer takes it
		// over again: that fences the other producer in turn and reads
		// the position the committed transactions reached, so nothing is
		// published twice, and the partition does not stop for good.
		d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
		if errors.Is(renew, errFenced) {
			pub.r.aborts.Add(1)
			log.Warn("kscope: outbox relay: this relay's producer was fenced (another relay with the same transactional id, or a transaction that outlived TransactionTimeout); taking the partition over again with a new producer",
				"retry_in", d)
		} else {
			log.Warn("kscope: outbox relay: this relay's producer cannot go on after its transaction failed; taking the partition over again with a new producer",
				"err", renew, "retry_in", d)
		}
		if !backoff.Sleep(ctx, d) {
			return nil
		}
	}
}

// publishWith publishes the partition with a producer of its own until ctx
// ends, an error that retrying cannot heal, or the producer cannot go on
// (renew then says why: fenced, or failed for good), when a new producer
// must take the partition over.
func (pub *publisher) publishWith(ctx context.Context, log *slog.Logger) (renew, err error) {
	r := pub.r
	txnID := r.o.TransactionalID + "-" + strconv.Itoa(pub.p)
	opts := r.o.producerOpts(txnID)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kscope: outbox relay: creating the producer of partition %d: %w", pub.p, err)
	}
	defer cl.Close()
	pos, ok, err := pub.takeOver(ctx, cl, log)
	if !ok {
		return nil, err
	}
	pub.pos.Store(pos)
	log.Info("kscope: outbox relay: publishing partition", "position", pos, "transactional_id", txnID)
	maxBytes, _ := cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32)
	poll := time.NewTimer(0)
	defer poll.Stop()
	for attempt := 0; ctx.Err() == nil; {
		rows, err := pub.read(ctx, pos)
		if err == nil {
			pub.misplaced(log, rows)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil
			}
			attempt++
			d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
			log.Warn("kscope: outbox relay: reading the outbox failed; retrying", "err", err, "retry_in", d)
			if !backoff.Sleep(ctx, d) {
				return nil, nil
			}
			continue
		}
		if len(rows) == 0 {
			if !pub.idle(ctx, pos, poll) {
				return nil, nil
			}
			continue
		}
		// A row Kafka refused for good goes to the dead-letter table
		// first; then a transaction that carries nothing but the position
		// moves the partition past it. A crash between the two leaves the
		// row in both tables: the relay that goes on finds it in the
		// dead-letter table as it takes the partition over (start) and
		// moves the position past it without sending it again (Kafka may
		// take it by then, and it would be published and dead, for an
		// operator to requeue).
		var batch []row
		if pub.doomed != nil && pub.doomed.seq != rows[0].seq {
			pub.doomed = nil // the position passed it meanwhile
		}
		if pub.doomed == nil && !ValidTopic(rows[0].topic) {
			// No broker takes it: no need to ask.
			pub.doomed = &refusal{seq: rows[0].seq, err: fmt.Errorf("kscope: %q is not a Kafka topic name (at most 249 of a-z A-Z 0-9 . _ -)", rows[0].topic)}
		}
		dead := pub.doomed
		if dead != nil {
			if err := pub.deadLetter(ctx, rows[0], dead.err); err != nil {
				if errors.As(err, new(*dbscope.SchemaError)) {
					return nil, fmt.Errorf("kscope: outbox relay: Kafka refuses the row %s for good, and it cannot be moved to the dead-letter table (it stays in the outbox, unpublished, and the partition waits): %w",
						pub.ident(rows[0]), err)
				}
				if ctx.Err() != nil {
					return nil, nil
				}
				attempt++
				d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
				log.Warn("kscope: outbox relay: writing a refused row to the dead-letter table failed; retrying", "id", pub.ident(rows[0]), "err", err, "retry_in", d)
				if !backoff.Sleep(ctx, d) {
					return nil, nil
				}
				continue
			}
		} else {
			batch = pub.batch(rows, maxBytes)
		}
		last := rows[0].seq
		if len(batch) > 0 {
			last = batch[len(batch)-1].seq
		}
		rowErrs, err := pub.send(ctx, cl, batch, last)
		switch {
		case errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
			return nil, fmt.Errorf("kscope: outbox relay: the broker refused this relay its transactional id %s "+
				"(grant this client Write and Describe on it, then start the relay again): %w", txnID, err)
		case errors.Is(err, errFenced):
			log.Warn("kscope: outbox relay: the producer was fenced", "err", err)
			return err, nil
		case err != nil:
			if ctx.Err() != nil {
				return nil, nil
			}
			r.aborts.Add(1)
			if pub.failed(log, batch, rowErrs, err) {
				attempt++
				d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
				if !backoff.Sleep(ctx, d) {
					return nil, nil
				}
			}
			// A transaction that ended in a definite answer other than a
			// fence (INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING: the
			// coordinator expired the transactional id) leaves franz-go's
			// producer failed for good, every later call answering that
			// error: a new producer takes the partition over instead of
			// this one being retried forever.
			if _, _, perr := cl.ProducerID(ctx); perr != nil {
				if ctx.Err() != nil {
					return nil, nil
				}
				return fmt.Errorf("initialising the producer again: %w", perr), nil
			}
			// A commit the broker applied without the relay hearing it
			// (the answer lost, or later than the relay waited) moved the
			// position: read it again rather than publish its rows twice.
			if pos, ok, err = pub.takeOver(ctx, cl, log); !ok {
				return nil, err
			}
			pub.pos.Store(pos)
			continue
		}
		attempt = 0
		pos = last
		pub.pos.Store(pos)
		r.published.Add(int64(len(batch)))
		r.transactions.Add(1)
		pub.committed(log, dead, rows[0], last)
		pub.prune(ctx, pos)
	}
	return nil, nil
}

// failed takes in a transaction of batch that did not commit (err; the
// producer's answer for each row in rowErrs) and reports whether to back
// off before the next. A row that Kafka refuses as a record is searched
// for with smaller transactions, without backing off, until it is refused
// alone, when it is tried again after a backoff, up to
// refusalsToDeadLetter times. A row whose topic is missing, refused to the
// relay or refuses its timestamps makes the partition stuck, reported at
// ERROR with what to do: that is not the row's fault, and the row is
// published once fixed.
func (pub *publisher) failed(log *slog.Logger, batch []row, rowErrs []error, err error) (backOff bool) {
	refused, blocked := -1, -1
	for i, e := range rowErrs {
		if refused < 0 && refusedRecord(e) {
			refused = i
		}
		if _, ok := topicProblem(e); blocked < 0 && ok {
			blocked = i
		}
	}
	switch {
	case refused >= 0 && (blocked < 0 || refused < blocked) && len(batch) > 1:
		// franz-go does not split a batch the broker refused (too large,
		// say): every record of it fails alike, so the refusal names no
		// row. The rows before the first refused one were not refused;
		// from it on, fewer rows at a time until one is refused alone.
		if refused > 0 {
			pub.probe = refused
		} else {
			pub.probe = max(1, len(batch)/2)
		}
		log.Warn("kscope: outbox relay: Kafka refused a record of the transaction; publishing fewer rows per transaction to find the row it refuses",
			"first_refused", pub.ident(batch[refused]), "rows", len(batch), "next_rows", pub.probe, "err", rowErrs[refused])
		return false
	case refused == 0: // alone
		w := batch[0]
		if pub.lone.seq != w.seq {
			pub.lone.seq, pub.lone.n = w.seq, 0
		}
		pub.lone.n++
		if pub.lone.n >= refusalsToDeadLetter {
			pub.doomed = &refusal{seq: w.seq, err: rowErrs[0]}
		}
		log.Warn("kscope: outbox relay: Kafka refused a row sent alone; it is moved to the dead-letter table if that goes on",
			"id", pub.ident(w), "topic", w.topic, "bytes", len(w.key)+len(w.value)+len(w.headers),
			"refusals", pub.lone.n, "dead_letter_after", refusalsToDeadLetter, "err", rowErrs[0])
		return true
	case blocked >= 0:
		w := batch[blocked]
		advice, _ := topicProblem(rowErrs[blocked])
		if blocked > 0 {
			pub.probe = blocked // the rows before it go out meanwhile
		}
		pub.setStuck(true)
		pub.stuckAt = w.seq
		if held, ok := pub.stuckLog.allow(); ok {
			log.Error("kscope: outbox relay: the partition cannot be published: "+advice+
				". Nothing is skipped: the relay retries the row, and the rows after it wait, until this is fixed. This is logged every 30 seconds meanwhile",
				"id", pub.ident(w), "topic", w.topic, "err", rowErrs[blocked], "attempts_since_last_log", held+1)
		} else {
			log.Debug("kscope: outbox relay: the partition is still stuck", "topic", w.topic, "err", rowErrs[blocked])
		}
		return blocked == 0 // the rows before it go out at once
	}
	log.Warn("kscope: outbox relay: the transaction did not commit, or its end was not confirmed; publishing again from the partition's committed position", "err", err)
	return true
}

// committed takes in a committed transaction up to last: it counts a
// dead-lettered row (dead, the partition's head, head), widens the
// transactions again after a refused row, and ends a stuck state once
// past the row that caused it.
func (pub *publisher) committed(log *slog.Logger, dead *refusal, head row, last int64) {
	r := pub.r
	if dead != nil {
		pub.doomed = nil
		r.deadLettered.Add(1)
		if held, ok := pub.deadLog.allow(); ok {
			log.Error("kscope: outbox relay: a row can never be published (Kafka refused it alone, again and again: too large for the producer or the topic, "+
				"or a record the broker rejects; or its topic name is not one Kafka allows); it was moved to the dead-letter table, and the partition goes on with the rows after it. "+
				"See it with 'kscope outbox dead show <id>'; once the cause is fixed (the topic's max.message.bytes and the relay's kgo.ProducerBatchMaxBytes raised above its size), "+
				"publish it again with 'kscope outbox dead requeue <id>' (with --topic NAME for a topic name Kafka does not allow), which keeps its identity so that a consumer that saw it drops the copy, "+
				"or drop it with 'kscope outbox dead discard <id>'. "+
				"At most one such line is logged every 30 seconds",
				"id", pub.ident(head), "topic", head.topic,
				"bytes", len(head.key)+len(head.value)+len(head.headers), "table", r.o.TablePrefix+"outbox_dead", "err", dead.err,
				"dead_lettered_since_last_log", held+1)
		}
	}
	if pub.probe > 0 {
		if pub.probe *= 2; pub.probe >= r.o.BatchSize {
			pub.probe = 0
		}
	}
	pub.lone.seq, pub.lone.n = 0, 0
	if pub.stuck.Load() && last >= pub.stuckAt {
		pub.setStuck(false)
		pub.stuckLog = throttle{}
		log.Info("kscope: outbox relay: the partition is published again")
	}
}

// setStuck records whether the partition is stuck, for Stats.
func (pub *publisher) setStuck(on bool) {
	if pub.stuck.Swap(on) != on {
		if on {
			pub.r.stuck.Add(1)
		} else {
			pub.r.stuck.Add(-1)
		}
	}
}

// id is the identity of the partition's row seq.
func (pub *publisher) id(seq int64) string {
	return pub.r.o.Outbox + "/" + strconv.Itoa(pub.p) + "/" + strconv.FormatInt(seq, 10)
}

// ident is the identity w's record carries in its kscope-id header: the
// one the row holds (a requeued row's, from when it was written), else
// its place, id(w.seq).
func (pub *publisher) ident(w row) string {
	if w.id != "" {
		return w.id
	}
	return pub.id(w.seq)
}

// batch returns the rows of the next transaction: at most probe of them
// while a refused row is searched for, none from a row to a topic name
// Kafka does not allow on (it is dead-lettered once at the head), and a
// row the producer surely refuses (larger on its own than its
// ProducerBatchMaxBytes for the topic, maxBytes) alone, so that the
// refusal is its own.
func (pub *publisher) batch(rows []row, maxBytes func(string) int32) []row {
	if pub.probe > 0 && pub.probe < len(rows) {
		rows = rows[:pub.probe]
	}
	for i, w := range rows {
		if !ValidTopic(w.topic) || maxBytes != nil && len(w.key)+len(w.value)+len(w.headers) > int(maxBytes(w.topic)) {
			if i == 0 {
				return rows[:1]
			}
			return rows[:i]
		}
	}
	return rows
}

// refusedRecord reports whether err is Kafka refusing a record as such: too
// large for the producer or the topic, or a record the broker rejects.
// Whether it is the record's own fault or that of another in its batch
// takes sending it alone to tell.
func refusedRecord(err error) bool {
	for _, e := range []error{kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord, kerr.CorruptMessage, kerr.InvalidTopicException} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// topicProblem reports whether err is a reason that a record cannot be
// published now that is not the record's fault, and says what to do.
func topicProblem(err error) (advice string, ok bool) {
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return "the topic does not exist; create it, or let the relay's producer create topics (kgo.AllowAutoTopicCreation() in Options.ClientOptions, with auto.create.topics.enable on the brokers)", true
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return "the broker refuses this relay the topic; grant this client Write on it", true
	case errors.Is(err, kerr.InvalidTimestamp):
		// The relay leaves the timestamp to the producer (the time it
		// publishes): a broker that refuses it disagrees with the relay's
		// clock, whatever the row.
		return "the broker refuses the records' timestamps (the relay's clock, when it publishes); bring the relay's clock in line with the brokers', or widen the topic's message.timestamp.before.max.ms and message.timestamp.after.max.ms", true
	}
	return "", false
}

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
// that the dead-letter table holds already (a relay moved it there and
// stopped before the transaction carrying the position past it
// committed) is doomed: it is not sent again.
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

// read returns the partition's rows after pos, in sequence order, at most
// BatchSize of them.
func (pub *publisher) read(ctx context.Context, pos int64) ([]row, error) {
	r := pub.r
	rows, err := r.o.Pool.Query(ctx, `SELECT seq, coalesce(id, ''), topic, key, value, headers, created_at FROM `+r.o.TablePrefix+`outbox
		WHERE outbox = $1 AND partition = $2 AND seq > $3 ORDER BY seq LIMIT $4`, r.o.Outbox, int32(pub.p), pos, r.o.BatchSize)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(rs pgx.CollectableRow) (row, error) {
		var w row
		err := rs.Scan(&w.seq, &w.id, &w.topic, &w.key, &w.value, &w.headers, &w.created)
		return w, err
	})
}

// misplaced counts and reports the rows whose key does not hash to this
// partition under the relay's Partitions: a Writer with fewer partitions
// than the relay wrote them (one with more writes rows the relay does not
// publish at all: watchStranded). They are published, but a key whose rows
// sit in two partitions is published side by side, not in order. Each row
// is counted once, however often it is read.
func (pub *publisher) misplaced(log *slog.Logger, rows []row) {
	n := 0
	var first row
	for _, w := range rows {
		if w.seq <= pub.checkedTo {
			continue
		}
		pub.checkedTo = w.seq
		if partitionOf(w.key, pub.r.o.Partitions) != pub.p {
			if n == 0 {
				first = w
			}
			n++
		}
	}
	if n == 0 {
		return
	}
	pub.r.misplacedRows.Add(int64(n))
	if held, ok := pub.misplacedLog.allow(); ok {
		log.Error("kscope: outbox relay: rows whose key hashes to another partition of the outbox: a Writer with another Partitions than the relay's wrote them "+
			"(Writer.Partitions must be the relay's). They are published, but a key whose rows sit in two partitions is published out of order; give every Writer the relay's Partitions. "+
			"At most one such line is logged every 30 seconds",
			"rows", n+held, "seq", first.seq, "relay_partitions", pub.r.o.Partitions)
	} else {
		pub.misplacedLog.held += n - 1
	}
}

// deadLetter writes w, with why Kafka refuses it, to the dead-letter
// table, with the identity the row holds (a requeued row keeps its
// original one); a row there already is left as it is. A missing table
// or column is reported as a *dbscope.SchemaError, which says to run
// Migrate.
func (pub *publisher) deadLetter(ctx context.Context, w row, why error) error {
	r := pub.r
	table := r.o.TablePrefix + "outbox_dead"
	_, err := r.o.Pool.Exec(ctx, `INSERT INTO `+table+` (outbox, partition, seq, topic, key, value, headers, created_at, error, id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, nullif($10, '')) ON CONFLICT (outbox, partition, seq) DO NOTHING`,
		r.o.Outbox, int32(pub.p), w.seq, w.topic, w.key, w.value, w.headers, w.created, why.Error(), w.id)
	return schemaErr(ctx, r.o.Pool, r.o.TablePrefix, err)
}

// send publishes rows and the partition's new position, last, in one
// Kafka transaction. When it does not commit, rowErrs holds the
// producer's answer for each row (nil for a row it took).
func (pub *publisher) send(ctx context.Context, cl *kgo.Client, rows []row, last int64) (rowErrs []error, err error) {
	r := pub.r
	if err := cl.BeginTransaction(); err != nil {
		return nil, err
	}
	var mu sync.Mutex
	rowErrs = make([]error, len(rows))
	var perr error // the first error, of a row or of the position
	note := func(i int) func(*kgo.Record, error) {
		return func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				if i >= 0 {
					rowErrs[i] = err
				}
				if perr == nil {
					perr = err
				}
				mu.Unlock()
			}
		}
	}
	for i, w := range rows {
		hs, err := decodeHeaders(w.headers)
		if err != nil {
			// A row kscope did not write: published without headers
			// rather than never.
			r.log.Error("kscope: outbox relay: a row's headers cannot be decoded; publishing it without them", "partition", pub.p, "seq", w.seq, "err", err)
		}
		hs = append(hs, kgo.RecordHeader{Key: retrytopic.HeaderID, Value: []byte(pub.ident(w))})
		cl.Produce(ctx, &kgo.Record{Topic: w.topic, Key: w.key, Value: w.value, Headers: hs}, note(i))
	}
	cl.Produce(ctx, &kgo.Record{Topic: r.o.PositionTopic, Partition: int32(pub.p), Key: []byte(strconv.Itoa(pub.p)), Value: []byte(strconv.FormatInt(last, 10))}, note(-1))
	ferr := cl.Flush(ctx)
	if ferr != nil {
		// Stopped while flushing: nothing may stay buffered for the abort.
		_ = cl.AbortBufferedRecords(context.WithoutCancel(ctx))
	}
	mu.Lock()
	err = errors.Join(perr, ferr)
	rowErrs = slices.Clone(rowErrs)
	mu.Unlock()
	try := kgo.TryCommit
	if err != nil {
		try = kgo.TryAbort
	}
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.TransactionTimeout)
	eerr := cl.EndTransaction(endCtx, try)
	cancel()
	if fenced(err) || fenced(eerr) {
		return rowErrs, fmt.Errorf("%w: %v", errFenced, errors.Join(err, eerr))
	}
	if err == nil && eerr == nil {
		return nil, nil
	}
	if eerr != nil {
		// Make sure no transaction stays open before the next one.
		_ = cl.EndTransaction(context.WithoutCancel(ctx), kgo.TryAbort)
	}
	return rowErrs, errors.Join(err, eerr, errors.New("the transaction did not commit"))
}

func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed)
}

// idle waits, with nothing after the position pos, until a writer's commit
// wakes the publisher or the poll interval passes. First it checks that the
// database has handed pos out at all; when it has not, it halts the
// partition until ctx ends and reports false.
func (pub *publisher) idle(ctx context.Context, pos int64, poll *time.Timer) bool {
	if ahead, err := pub.ahead(ctx, pos); err == nil && ahead {
		pub.halt(ctx, pos)
		return false
	}
	poll.Reset(pub.r.o.PollInterval)
	select {
	case <-ctx.Done():
	case <-pub.wake:
	case <-poll.C:
	}
	return true
}

// ahead reports whether pos, the position the partition's position topic
// holds, is past the last sequence number the database handed out for the
// partition: the outbox tables were recreated (a new database, a forgotten
// migration run again on an empty one) or restored from a backup, or the
// relay reads another database than its writers. Publishing on would skip
// the rows numbered up to pos, and pruning would delete them unpublished.
func (pub *publisher) ahead(ctx context.Context, pos int64) (bool, error) {
	r := pub.r
	var handed int64
	err := r.o.Pool.QueryRow(ctx, `SELECT coalesce(max(next_seq) - 1, 0) FROM `+r.o.TablePrefix+`outbox_sequences
		WHERE outbox = $1 AND partition = $2`, r.o.Outbox, int32(pub.p)).Scan(&handed)
	return err == nil && pos > handed, err
}

// halt stops publishing the partition whose position is ahead of the
// database, and says so until ctx ends (the relay stops or loses the
// partition): it publishes and deletes nothing of the partition, so the
// rows the database holds stay there for the operator.
func (pub *publisher) halt(ctx context.Context, pos int64) {
	r := pub.r
	r.halted.Add(1)
	defer r.halted.Add(-1)
	msg := "kscope: outbox relay: the position topic says this partition is published up to a sequence number the database has not handed out: " +
		"the outbox tables were recreated or restored, or the relay reads another database than the writers. " +
		"Nothing of the partition is published or deleted until this is resolved: publishing on would skip, and delete, the rows numbered up to the position. " +
		"Stop the relays, compare the outbox table with what consumers of the topic saw, then either delete the position topic (the relay publishes every row the table holds) " +
		"or raise the partition's next_seq above the position (rows numbered up to it are never published), and start the relays again"
	attrs := []any{"outbox", r.o.Outbox, "partition", pub.p, "position", pos, "position_topic", r.o.PositionTopic}
	r.log.Error(msg, attrs...)
	t := time.NewTicker(errorLogEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.log.Error(msg, attrs...)
		}
	}
}

// prune deletes the rows the position has passed; a failure is retried
// with the next transaction's.
func (pub *publisher) prune(ctx context.Context, pos int64) {
	r := pub.r
	if _, err := r.o.Pool.Exec(ctx, `DELETE FROM `+r.o.TablePrefix+`outbox WHERE outbox = $1 AND partition = $2 AND seq <= $3`,
		r.o.Outbox, int32(pub.p), pos); err != nil && ctx.Err() == nil {
		r.log.Warn("kscope: outbox relay: deleting published rows failed; retried after the next transaction", "partition", pub.p, "err", err)
	}
}

// positionPartitioner sends position records to the partition they name
// and every other record where rest would.
type positionPartitioner struct {
	topic string
	rest  kgo.Partitioner
}

func (p positionPartitioner) ForTopic(t string) kgo.TopicPartitioner {
	if t == p.topic {
		return kgo.ManualPartitioner().ForTopic(t)
	}
	return p.rest.ForTopic(t)
}

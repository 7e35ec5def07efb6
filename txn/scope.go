package txn

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/internal/ratelog"
	"github.com/kscope-dev/kscope/scope"
	"github.com/kscope-dev/kscope/sequence"
)

type tp struct {
	topic     string
	partition int32
}

// counters are the Kafka-scope counters (consumer.KafkaStats) of one
// transaction, or of the runner.
type counters struct {
	records, outputs, dead, skipped, retryTopic             atomic.Int64
	stale, gapsDetected, gapsHealed, gapsAccepted, timedOut atomic.Int64
	duplicates, remembered, versionsSkipped, gapsFilled     atomic.Int64
}

func (c *counters) add(o *counters) {
	c.records.Add(o.records.Load())
	c.outputs.Add(o.outputs.Load())
	c.dead.Add(o.dead.Load())
	c.skipped.Add(o.skipped.Load())
	c.retryTopic.Add(o.retryTopic.Load())
	c.stale.Add(o.stale.Load())
	c.gapsDetected.Add(o.gapsDetected.Load())
	c.gapsHealed.Add(o.gapsHealed.Load())
	c.gapsAccepted.Add(o.gapsAccepted.Load())
	c.timedOut.Add(o.timedOut.Load())
	c.duplicates.Add(o.duplicates.Load())
	c.remembered.Add(o.remembered.Load())
	c.versionsSkipped.Add(o.versionsSkipped.Load())
	c.gapsFilled.Add(o.gapsFilled.Load())
}

// kafkaScope is the Kafka scope's unit of work on the runner (a
// scope.Transactor): it runs each record's handler, with in-place
// retries, and adds the outputs, or the record's route, to the open
// transaction; after each poll it ends the transaction that is due, with
// each partition's offset and done records (committed.go, end.go), and
// has the runner rewind the partitions when it aborts.
type kafkaScope struct {
	o      Options
	h      Handler
	batch  *batchState // a batch handler's (NewBatch): h is its per-record path
	cfg    consumer.Config
	log    *slog.Logger
	vs     *versionStore // nil without Options.Versions
	dltLog *ratelog.Limiter

	eng scope.Engine[*consumer.Record]   // set before the workers start
	f   scope.Failures[*consumer.Record] // eng's
	obs observer

	// The runner's transactional session (set by UseTxn, for each
	// session), the gate of its open transaction, and the partitions'
	// committed state.
	e      scope.TxnEngine[*consumer.Record]
	sess   *kgo.GroupTransactSession
	gate   *gate
	states committedParts

	cur *txnState // the open transaction's; replaced when it ends (no worker is joined then)

	// limit is the largest record the producer writes (its batch limit).
	limit int64
	// unwritable holds the inputs of aborted transactions one of whose
	// records the broker refused as such: on their redelivery they fail,
	// as Terminal, instead of producing it again. refusedInRow counts the
	// transactions in a row that aborted for refusals no input could be
	// blamed for alone.
	unwritableMu sync.Mutex
	unwritable   map[recKey]error
	refusedInRow int

	statsMu            sync.Mutex // a transaction's counters join the runner's at once
	c                  counters
	committed, aborted atomic.Int64
}

// init completes the scope with the runner's configuration (defaults
// filled in).
func (s *kafkaScope) init(cfg consumer.Config) {
	s.cfg = cfg
	s.log = cfg.Logger.With("group", cfg.Group, "scope", "kafka")
	s.cur = &txnState{}
	s.unwritable = map[recKey]error{}
	if s.o.Versions != nil || s.o.Dedupe != nil {
		var vcfg sequence.Config
		if s.o.Versions != nil {
			vcfg = *s.o.Versions
		}
		s.vs = &versionStore{cfg: vcfg, group: cfg.Group, kcfg: cfg, parts: map[tp]*partVersions{}, owned: map[tp]uint64{}, expiringSet: map[*parkedRec]bool{}}
	}
}

// TxnConfig implements scope.Transactor.
func (s *kafkaScope) TxnConfig() (string, time.Duration) {
	return s.o.TransactionalID, s.o.TransactionTimeout
}

// ClientOptions are the transactional producer's settings, the version
// changelog's partitioner, and a fetch wait no longer than a few
// transactions.
func (s *kafkaScope) ClientOptions() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.TransactionalID(s.o.TransactionalID),
		kgo.TransactionTimeout(s.o.TransactionTimeout),
		kgo.FetchMaxWait(min(500*time.Millisecond, s.o.CommitInterval*5)),
		// The committed state of newly assigned partitions, from their
		// offsets' metadata.
		kgo.OnOffsetsFetched(s.onOffsetsFetched),
	}
	if s.vs != nil {
		opts = append(opts, kgo.RecordPartitioner(newChangelogPartitioner(s.cfg.Group, s.cfg.Topics)))
	}
	return opts
}

// ClientDefaults implements scope.ClientDefaulter: under a records rate
// limit that lets a transaction take at most lingerInputs inputs, the
// producer lingers for the commit interval (consumer.Config.ClientOptions
// may set kgo.ProducerLinger otherwise). A transaction's outputs are read
// only once it commits, and ending it flushes what lingers, so lingering
// delays no reader: a transaction's outputs go in a few produce requests
// instead of one every few records (franz-go's default linger is 10ms),
// a third of the CPU at 200 records a second (docs/flow-control.md).
// Without such a limit the default stays: a linger as long as a
// transaction would hold up to the producer's buffer (10,000 records) a
// transaction, and cap the rate there.
func (s *kafkaScope) ClientDefaults() []kgo.Opt {
	if d := lingerUnder(s.cfg.RateLimit.Records, s.o.CommitInterval); d > 0 {
		return []kgo.Opt{kgo.ProducerLinger(d)}
	}
	return nil
}

// lingerInputs is the most inputs a transaction may take, at a records
// rate limit, for the producer to linger for the commit interval: a
// tenth of franz-go's default buffer of 10,000 records, leaving room for
// handlers that emit several outputs an input.
const lingerInputs = 1000

// lingerUnder returns the producer linger under records rate limit lim
// with transactions of commitInterval: commitInterval when lim bounds a
// transaction's inputs to lingerInputs, else 0 (the client's default).
func lingerUnder(lim consumer.Rate, commitInterval time.Duration) time.Duration {
	if lim.PerSecond <= 0 {
		return 0
	}
	if lim.PerSecond*commitInterval.Seconds()+float64(max(lim.Burst, 1)) > lingerInputs {
		return 0
	}
	return commitInterval
}

// KeyHolds implements scope.KeyHolder: the runner keeps the records of a
// key its circuit breaker holds in memory (consumer.Config.KeyBreaker;
// New refuses it with Options.Versions, NewBatch with a batch handler).
// The records of other keys commit past them in the transactions'
// offset metadata (commit.Done).
func (s *kafkaScope) KeyHolds() scope.KeyHold { return scope.HoldInMemory }

// BatchLimits: a worker takes the queued records of a partition together;
// each is handled and joins a transaction on its own.
func (s *kafkaScope) BatchLimits() (int, time.Duration) { return 64, 0 }

// UsesRetryTopics: failing records go to the delayed retry topics only
// with an Unordered policy (and no versions), as in the AtLeastOnce scope.
func (s *kafkaScope) UsesRetryTopics() bool {
	return s.cfg.Failures.Unordered && s.o.Versions == nil && len(s.cfg.Failures.RetryTopics()) > 0
}

// UseEngine implements scope.EngineUser.
func (s *kafkaScope) UseEngine(e scope.Engine[*consumer.Record]) {
	s.eng, s.f, s.obs = e, e.Failures(), e.Observer()
}

// UseTxn implements scope.Transactor: a new session's gate, and its first
// transaction begun.
func (s *kafkaScope) UseTxn(e scope.TxnEngine[*consumer.Record]) error {
	s.e, s.sess, s.gate = e, e.Session(), newGate(s.o.MaxRecords)
	s.limit = producerLimit(s.sess.Client())
	if s.vs != nil {
		s.vs.setKick(s.kick)
	}
	s.log.Info("kscope: transactional runner started", "topics", s.cfg.Topics, "transactional_id", s.o.TransactionalID,
		"retry_topics", s.UsesRetryTopics(), "versions", s.o.Versions != nil, "dedupe", s.o.Dedupe != nil)
	return s.begin()
}

// kick wakes the poll loop, so that the scope's timers run again (tick).
func (s *kafkaScope) kick() {
	s.gate.mu.Lock()
	s.gate.wake()
	s.gate.mu.Unlock()
}

// Start creates the version changelogs that are missing. Without
// Options.Versions it fails with a *consumer.ConfigError on Versions while
// records that an earlier deployment with Versions parked behind a version
// gap wait in a changelog (see checkNoParked); a changelog it cannot read
// is logged, and the runner starts.
func (s *kafkaScope) Start(ctx context.Context) error {
	if s.vs != nil {
		return ensureChangelogs(ctx, s.cfg)
	}
	ce, changelogs, err := checkNoParked(ctx, s.cfg)
	switch {
	case ce != nil:
		return ce
	case err != nil && ctx.Err() == nil:
		s.log.Warn("kscope: could not look for records parked in a version changelog by a deployment with Versions; starting anyway", "err", err)
	case len(changelogs) > 0:
		s.log.Info("kscope: the version changelogs of a deployment with Versions hold no parked record; each start without Versions reads them through: delete them once Versions is not coming back (their key versions go with them)",
			"changelogs", changelogs)
	}
	return nil
}

// Process handles a batch of one partition's records, one by one.
func (s *kafkaScope) Process(ctx context.Context, batch []*consumer.Record, done func(*consumer.Record)) {
	if s.batch != nil {
		s.processBatch(ctx, batch, done)
		return
	}
	var pv *partVersions
	if len(batch) > 0 {
		pv = s.guardPart(batch[0])
	}
	if pv == nil || len(batch) == 1 {
		for _, rec := range batch {
			if !s.handleIn(ctx, rec, done, pv, nil) {
				return // stopped, or the record's assignment ended: its next owner redoes it
			}
		}
		return
	}
	keys := batchKeys.Get().(*[]idKey)
	defer batchKeys.Put(keys)
	s.touchBatch(pv, batch, keys)
	for i, rec := range batch {
		if !s.handleIn(ctx, rec, done, pv, &(*keys)[i]) {
			return // stopped, or the record's assignment ended: its next owner redoes it
		}
	}
}

// flush waits for the produces of the transaction that ends and returns
// the first that failed; see refusals for records the broker refused as
// such. The producer's lingering batches are sent at once: waiting for
// their linger (franz-go's 10ms, or the commit interval under a records
// rate limit) would keep every key-shard waiting at the gate as long.
func (s *kafkaScope) flush() error {
	// Flush returns once nothing is buffered, or with its context's
	// error, which Background never has; the produces' callbacks are
	// waited for below.
	_ = s.sess.Client().Flush(context.Background())
	s.cur.wg.Wait()
	err := s.cur.failed()
	if err == nil {
		return nil
	}
	return s.refusals(s.cur, err)
}

// refusedLimit is how many transactions in a row may abort for records
// the broker refused, without one input to blame, before Run stops.
const refusedLimit = 3

// refusals handles the records of tx, which failed with err, that the
// broker refused as records: their inputs are failed, as Terminal, when
// they are delivered again (after this transaction aborts and rewinds),
// instead of failing every transaction. An input is blamed when its
// record was refused on its own account (too large alone, or an invalid
// topic name), or when it is the only input with refused records (the
// broker refuses a whole batch for one bad record in it, so refusals
// spread over several inputs do not say which is bad). A dead-letter
// record refused, or refusals no input can be blamed for in refusedLimit
// transactions in a row, stop the runner: nothing of those transactions
// commits, and nothing is lost.
func (s *kafkaScope) refusals(tx *txnState, err error) error {
	tx.mu.Lock()
	rs := tx.unwritable
	tx.mu.Unlock()
	if len(rs) == 0 {
		return err
	}
	inputs := map[recKey]refusal{}
	blamed := map[recKey]refusal{}
	for _, r := range rs {
		if r.kind == producedDead {
			return fmt.Errorf("%w: the dead-letter topic %s refused %s, so that record can neither be handled nor dead-lettered; "+
				"raise the topic's max.message.bytes (or kgo.ProducerBatchMaxBytes in Config.ClientOptions) and start the runner again: %w",
				ErrUnwritable, r.topic, r.what, r.err)
		}
		inputs[r.input] = r
		if r.alone {
			blamed[r.input] = r
		}
	}
	if len(blamed) == 0 && len(inputs) == 1 {
		blamed = inputs
	}
	if len(blamed) == 0 {
		s.refusedInRow++
		if s.refusedInRow >= refusedLimit {
			return fmt.Errorf("%w: %d transactions in a row aborted because the broker refused records of several inputs together, "+
				"which does not say which input's record is bad (a record batch larger than the topic's max.message.bytes: lower "+
				"kgo.ProducerBatchMaxBytes in Config.ClientOptions below it, or fix the handler whose outputs the broker refuses); %s: %w",
				ErrUnwritable, s.refusedInRow, describeRefused(inputs), err)
		}
		return err
	}
	s.unwritableMu.Lock()
	for k, r := range blamed {
		s.unwritable[k] = consumer.Terminal(fmt.Errorf("kscope: %s can never be written, so the transaction that held it aborted: %w", r.what, r.err))
	}
	s.unwritableMu.Unlock()
	s.log.Error("kscope: the broker refused a record as such; the input it belongs to fails as Terminal when it is delivered again",
		"inputs", describeRefused(blamed), "err", err)
	return err
}

// describeRefused names up to five of the inputs of rs.
func describeRefused(rs map[recKey]refusal) string {
	var names []string
	for k := range rs {
		names = append(names, fmt.Sprintf("%s[%d]@%d", k.topic, k.partition, k.offset))
	}
	slices.Sort(names)
	if len(names) > 5 {
		names = append(names[:5], fmt.Sprintf("and %d more", len(names)-5))
	}
	return strings.Join(names, ", ")
}

// unwritableOf returns why rec must fail without running its handler (a
// record it produced was refused in an earlier transaction), or nil.
func (s *kafkaScope) unwritableOf(rec *consumer.Record) error {
	if rec.Offset < 0 {
		return nil
	}
	s.unwritableMu.Lock()
	defer s.unwritableMu.Unlock()
	if len(s.unwritable) == 0 {
		return nil
	}
	return s.unwritable[keyOf(rec)]
}

// producerLimit returns the largest record cl writes: a record whose
// batch of its own exceeds kgo.ProducerBatchMaxBytes, or that exceeds
// kgo.MaxBufferedBytes, is refused.
func producerLimit(cl *kgo.Client) int64 {
	limit := int64(cl.OptValue(kgo.ProducerBatchMaxBytes).(int32))
	if b, _ := cl.OptValue(kgo.MaxBufferedBytes).(int64); b > 0 && b < limit {
		limit = b
	}
	return limit
}

// ended accounts for the transaction that ended: the version store, the
// records' outcomes and the counters; the next one starts afresh.
func (s *kafkaScope) ended(committed bool) {
	tx := s.cur
	if s.vs != nil {
		s.vs.end(committed)
		s.expireRemembered(time.Now())
	}
	tx.finish(s.obs, committed)
	if committed {
		s.refusedInRow = 0
		if len(tx.cleared) > 0 {
			s.unwritableMu.Lock()
			for _, k := range tx.cleared {
				delete(s.unwritable, k)
			}
			s.unwritableMu.Unlock()
		}
	}
	s.statsMu.Lock()
	if committed {
		s.committed.Add(1)
		s.c.add(&tx.counters)
	} else {
		s.aborted.Add(1)
	}
	s.statsMu.Unlock()
	s.cur = &txnState{}
	s.dltLog.Flush()
}

// TxnAssigning implements scope.Transactor: the committed state of newly
// assigned partitions is unknown until their offsets are fetched
// (onOffsetsFetched).
func (s *kafkaScope) TxnAssigning(ps map[string][]int32) { s.states.assigning(ps) }

// TxnSkip implements scope.Transactor: the records their partition's
// committed state says are done are not handled again.
func (s *kafkaScope) TxnSkip(topic string, p int32, recs []*kgo.Record) ([]*kgo.Record, []int64) {
	return s.states.skip(topic, p, recs)
}

// TxnProgress implements scope.Transactor: offsets to commit though no
// record joined, so the open transaction ends as if one had.
func (s *kafkaScope) TxnProgress() { s.gate.progress() }

// TxnGone implements scope.Transactor: it forgets the committed state, the
// versions and the unwritable inputs of partitions whose assignment ended.
// When records of them may have added to the open transaction (ended), it
// must not commit: their outputs would commit without their input offsets,
// and the partitions' next owner would produce them again (see
// commitOrAbort); and it ends soon, even if nothing joined it, since the
// session reports no other revoke or loss until a transaction ends.
func (s *kafkaScope) TxnGone(ps map[string][]int32, ended bool) {
	if ended {
		s.gate.markGone()
	}
	s.gate.release()
	s.states.gone(ps)
	s.forget(ps)
	if ended {
		s.gate.endSoon()
	}
}

// forget forgets the versions, and the unwritable inputs, of partitions
// whose assignment ended.
func (s *kafkaScope) forget(ps map[string][]int32) {
	if s.vs != nil {
		s.vs.drop(ps)
	}
	s.unwritableMu.Lock()
	for k := range s.unwritable {
		if slices.Contains(ps[k.topic], k.partition) {
			delete(s.unwritable, k)
		}
	}
	s.unwritableMu.Unlock()
}

// TxnPrepare restores the versions of newly assigned partitions before
// their records are dispatched. A partition assigned again may have
// changelog writes in the open transaction (which then aborts): it is
// ended first, since restoring waits until no transaction is open on the
// changelog.
func (s *kafkaScope) TxnPrepare(ctx context.Context) error {
	if s.vs == nil || ctx.Err() != nil || len(s.vs.missing(s.cfg.Topics)) == 0 {
		return nil
	}
	if err := s.endTxn(ctx, false); err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		need := s.vs.missing(s.cfg.Topics)
		if len(need) == 0 {
			return nil
		}
		err := s.vs.restore(ctx, need)
		if err == nil {
			// A partition assigned again while it was read (a newer
			// generation) was not installed: the next round reads it.
			s.expireRemembered(time.Now())
			continue
		}
		if ctx.Err() != nil {
			return nil // stopping
		}
		d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
		s.log.Warn("kscope: restoring versions from the changelog failed; retrying", "err", err, "retry_in", d)
		if !backoff.Sleep(ctx, d) {
			return nil
		}
	}
}

// tick sends the parked records that waited past GapTimeout to their
// key-shards, which dead-letter them, notes which remembered identities
// are past the guard's window (Options.Dedupe), and returns when the next
// parked record times out.
func (s *kafkaScope) tick(now time.Time) time.Time {
	if s.vs == nil {
		return time.Time{}
	}
	s.expireRemembered(now)
	for _, p := range s.vs.takeExpired(now) {
		if !s.e.Schedule(p.Topic, p.Partition, p.Key, func(ctx context.Context, rec *consumer.Record) { s.expire(ctx, rec, p) }) {
			s.vs.expiring(p, false)
		}
	}
	return s.vs.nextExpiry()
}

// expireRemembered notes, in each partition's state, which remembered
// identities are past the guard's window at now (Options.Dedupe).
func (s *kafkaScope) expireRemembered(now time.Time) {
	if s.o.Dedupe == nil {
		return
	}
	for _, pv := range s.vs.all() {
		pv.expireIDs(now, s.o.Dedupe.Window)
	}
}

// ReportStats fills in the Kafka scope's counters; Done counts the input
// records committed, Commits the transactions committed. With Versions or
// Dedupe, Waiting says which assigned partitions wait for their state to
// be restored from the changelog (the runner is not ready until then).
func (s *kafkaScope) ReportStats(st *consumer.Stats) {
	if s.vs != nil {
		st.Waiting = s.vs.waiting(s.states.inputs(s.cfg.Topics))
	}
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	k := &st.Kafka
	k.Records, k.Outputs, k.Committed = s.c.records.Load(), s.c.outputs.Load(), s.committed.Load()
	k.Aborted, k.DeadLettered, k.Skipped = s.aborted.Load(), s.c.dead.Load(), s.c.skipped.Load()
	k.RetryTopic, k.Stale, k.GapsDetected = s.c.retryTopic.Load(), s.c.stale.Load(), s.c.gapsDetected.Load()
	k.GapsHealed, k.GapsAccepted, k.GapsTimedOut = s.c.gapsHealed.Load(), s.c.gapsAccepted.Load(), s.c.timedOut.Load()
	k.Duplicates, k.VersionsSkipped, k.GapsFilled = s.c.duplicates.Load(), s.c.versionsSkipped.Load(), s.c.gapsFilled.Load()
	st.Dedupe.Hits, st.Dedupe.Remembered = k.Duplicates, s.c.remembered.Load()
	st.Done, st.Commits = k.Records, k.Committed
}

// observer dispatches the runner's hooks.
type observer = scope.Observer[*consumer.Record]

// The contract's interfaces the Kafka scope implements: a changed
// signature is a compile error here.
var (
	_ scope.Transactor[*consumer.Record]  = (*kafkaScope)(nil)
	_ scope.EngineUser[*consumer.Record]  = (*kafkaScope)(nil)
	_ scope.RetryTopicUser                = (*kafkaScope)(nil)
	_ scope.KeyHolder                     = (*kafkaScope)(nil)
	_ scope.Batcher                       = (*kafkaScope)(nil)
	_ scope.ClientOptioner                = (*kafkaScope)(nil)
	_ scope.Starter                       = (*kafkaScope)(nil)
	_ scope.StatsReporter[consumer.Stats] = (*kafkaScope)(nil)
)

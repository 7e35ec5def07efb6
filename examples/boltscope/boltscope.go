package boltscope

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/scope"
)

// InboxBucket is the bbolt bucket of the inbox: it holds a bucket per
// consumer group, and that one an entry per record identity the group
// applied, skipped or dead-lettered. A handler must not write to it.
const InboxBucket = "kscope.inbox"

// Handler applies one record in the bbolt file.
type Handler interface {
	// Handle applies r in tx, the read-write transaction that also
	// writes r's inbox entry. A nil error commits both. An error rolls
	// both back and goes to the runner's failure policy, by its class
	// (consumer.Retryable, consumer.Terminal, consumer.DecodeError; an
	// unmarked error has the smaller "unknown" budget), except a business
	// skip (consumer.Skip), which commits both. A panic is the record's
	// failure too. Handle must not commit or roll back tx, nor keep tx or
	// what it read from it after it returns.
	Handle(ctx context.Context, tx *bolt.Tx, r *consumer.Record) error
}

// HandlerFunc adapts a function to [Handler].
type HandlerFunc func(ctx context.Context, tx *bolt.Tx, r *consumer.Record) error

// Handle calls f(ctx, tx, r).
func (f HandlerFunc) Handle(ctx context.Context, tx *bolt.Tx, r *consumer.Record) error {
	return f(ctx, tx, r)
}

// New returns a runner that applies each record of cfg's topics to db
// through h, exactly once (the package documentation says what that
// covers and what it does not), in the runner's one member of cfg.Group.
// The inbox is kept per consumer group, so runners of several groups may
// share one file. Run creates the inbox's buckets before it consumes
// anything, and fails at once when it cannot (a closed or read-only
// file).
//
// New returns *consumer.ConfigError values, joined, for a nil h or db, a
// db open read-only, and a cfg that cannot work.
func New(cfg consumer.Config, db *bolt.DB, h Handler) (*consumer.Runner, error) {
	var errs []error
	if h == nil {
		errs = append(errs, &consumer.ConfigError{Struct: "boltscope.New's handler",
			Reason: "is nil; pass the function that applies each record in its transaction"})
	}
	switch {
	case db == nil:
		errs = append(errs, &consumer.ConfigError{Struct: "boltscope.New's db",
			Reason: "is nil; open the file with bolt.Open and pass it"})
	case db.IsReadOnly():
		errs = append(errs, &consumer.ConfigError{Struct: "boltscope.New's db",
			Reason: fmt.Sprintf("%s is open read-only; the scope writes each record's inbox entry in it, so open it without bolt.Options.ReadOnly", db.Path())})
	}
	s := &boltScope{db: db, h: h, topics: cfg.Failures.Unordered}
	if db != nil {
		s.path = db.Path()
	}
	r, err := consumer.NewScoped(cfg, s)
	if err = errors.Join(err, errors.Join(errs...)); err != nil {
		return nil, err
	}
	c := r.Config()
	s.identity, s.group = c.Identity, []byte(c.Group)
	return r, nil
}

// The contract's interfaces the scope implements: a changed signature is a
// compile error here, not a scope the runner silently runs without them.
var (
	_ scope.Scope[*consumer.Record]       = (*boltScope)(nil)
	_ scope.EngineUser[*consumer.Record]  = (*boltScope)(nil)
	_ scope.RetryTopicUser                = (*boltScope)(nil)
	_ scope.Starter                       = (*boltScope)(nil)
	_ scope.StatsReporter[consumer.Stats] = (*boltScope)(nil)
)

// boltScope is the scope: a record's handler runs in a bbolt transaction
// that also writes its inbox entry.
type boltScope struct {
	db       *bolt.DB
	path     string // db's, for messages (a closed db has none)
	h        Handler
	identity consumer.Identity
	group    []byte // the inbox's bucket in InboxBucket
	// topics says that failing records may go to the retry topics
	// (Config.Failures.Unordered): the runner then consumes them too.
	topics bool

	f   scope.Failures[*consumer.Record]
	obs scope.Observer[*consumer.Record]

	applied, duplicates, skipped, failed atomic.Int64
	transactions, storeRetries           atomic.Int64
}

// UseEngine implements scope.EngineUser: the runner's failure policy and
// hooks.
func (s *boltScope) UseEngine(e scope.Engine[*consumer.Record]) {
	s.f, s.obs = e.Failures(), e.Observer()
}

// UsesRetryTopics implements scope.RetryTopicUser: the scope keeps a
// failing record's retries in place, which keeps its key's order without
// a store of the records behind it, unless the failure policy is
// Unordered.
func (s *boltScope) UsesRetryTopics() bool { return s.topics }

// Start implements scope.Starter: it creates the inbox's buckets, so that
// a file that cannot be written fails Run before it consumes anything.
func (s *boltScope) Start(context.Context) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		_, err := inboxOf(tx, s.group)
		return err
	})
	if err != nil {
		return fmt.Errorf("boltscope: creating the inbox bucket %s/%s in %s: %w", InboxBucket, s.group, s.path, err)
	}
	return nil
}

// ReportStats implements scope.StatsReporter, in the DB scope's section
// of the runner's Stats: Applied, Duplicates, Skipped, Failed (handler
// calls that failed), Transactions (committed) and TxRetries
// (transactions retried after an error of the file).
func (s *boltScope) ReportStats(st *consumer.Stats) {
	st.DB.Applied = s.applied.Load()
	st.DB.Duplicates = s.duplicates.Load()
	st.DB.Skipped = s.skipped.Load()
	st.DB.Failed = s.failed.Load()
	st.DB.Transactions = s.transactions.Load()
	st.DB.TxRetries = s.storeRetries.Load()
}

// inboxOf returns group's inbox bucket in tx, creating it when missing.
func inboxOf(tx *bolt.Tx, group []byte) (*bolt.Bucket, error) {
	top, err := tx.CreateBucketIfNotExists([]byte(InboxBucket))
	if err != nil {
		return nil, err
	}
	return top.CreateBucketIfNotExists(group)
}

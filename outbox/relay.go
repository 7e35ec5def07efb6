package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/backoff"
	"github.com/kscope-dev/kscope/internal/kafkaerr"
	"github.com/kscope-dev/kscope/internal/lifecycle"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Defaults applied to Options fields left at their zero value.
const (
	DefaultBatchSize          = 500
	DefaultPollInterval       = time.Second
	DefaultTransactionTimeout = time.Minute
)

// Options configure a Relay.
type Options struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// Pool is the PostgreSQL pool the outbox tables are in. Required. The
	// relay holds one of its connections to LISTEN for new rows, and uses
	// one more per partition it publishes at a time.
	Pool *pgxpool.Pool

	// Outbox, Partitions and TablePrefix name the outbox, as the Writer
	// that adds to it does. Defaults "default", 16 and
	// dbscope.DefaultTablePrefix.
	Outbox      string
	Partitions  int
	TablePrefix string

	// Group is the consumer group through which relay instances share the
	// outbox's partitions: each partition is published by the instance the
	// group assigns it to. Default "kscope-outbox-<Outbox>".
	Group string
	// OwnPartitions, when not nil, makes the relay publish these
	// partitions without a group (a static split between instances, or
	// one instance owning all). Every partition must be owned by one
	// relay at a time; two that own one fence each other and publish
	// nothing twice.
	OwnPartitions []int

	// TransactionalID prefixes the transactional id of each partition's
	// producer: partition p publishes as "<TransactionalID>-<p>", so the
	// instance that takes a partition over fences the one that had it,
	// and a zombie's open transaction is aborted before anything is
	// published. Default "kscope-outbox-<Outbox>".
	TransactionalID string

	// PositionTopic holds each partition's position (the last published
	// sequence number), written in the same Kafka transaction as the
	// records it covers. It is created if missing, compacted, with
	// Partitions partitions. Default "kscope-outbox-<Outbox>.positions".
	PositionTopic string

	// BatchSize bounds the rows one Kafka transaction publishes. Default
	// 500.
	BatchSize int
	// PollInterval is how often a partition is read when no notification
	// of a new row arrived (rows normally wake the relay through
	// LISTEN/NOTIFY as their transaction commits). Default 1s.
	PollInterval time.Duration
	// TransactionTimeout is the broker's bound on an open transaction.
	// Default 1m. Java: transaction.timeout.ms.
	TransactionTimeout time.Duration

	// ClientOptions are passed to franz-go before kscope's own (TLS,
	// SASL, a client id).
	ClientOptions []kgo.Opt
	// Logger receives the relay's logs. Default slog.Default().
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	w := Writer{Outbox: o.Outbox, Partitions: o.Partitions, TablePrefix: o.TablePrefix}.withDefaults()
	o.Outbox, o.Partitions, o.TablePrefix = w.Outbox, w.Partitions, w.TablePrefix
	name := "kscope-outbox-" + retrytopic.SafeName(o.Outbox)
	if o.Group == "" {
		o.Group = name
	}
	if o.TransactionalID == "" {
		o.TransactionalID = name
	}
	if o.PositionTopic == "" {
		o.PositionTopic = name + ".positions"
	}
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.TransactionTimeout == 0 {
		o.TransactionTimeout = DefaultTransactionTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("kscope: outbox.Options.%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if len(o.Brokers) == 0 {
		bad("Brokers", "no seed broker given; set it to at least one host:port")
	}
	if o.Pool == nil {
		bad("Pool", "is nil; pass the *pgxpool.Pool of the database the outbox is in")
	}
	if err := (Writer{Outbox: o.Outbox, Partitions: o.Partitions, TablePrefix: o.TablePrefix}).validate(); err != nil {
		errs = append(errs, err)
	}
	for _, p := range o.OwnPartitions {
		if p < 0 || p >= o.Partitions {
			bad("OwnPartitions", "lists %d; partitions run from 0 to Partitions-1 (%d)", p, o.Partitions-1)
		}
	}
	if o.BatchSize < 0 {
		bad("BatchSize", "is %d; set a positive count (0 selects %d)", o.BatchSize, DefaultBatchSize)
	}
	if o.PollInterval < 0 {
		bad("PollInterval", "is %s; set a positive duration (0 selects %s)", o.PollInterval, DefaultPollInterval)
	}
	if o.TransactionTimeout < 0 {
		bad("TransactionTimeout", "is %s; set a positive duration (0 selects %s)", o.TransactionTimeout, DefaultTransactionTimeout)
	}
	if len(o.Brokers) > 0 {
		// franz-go checks its options when a client is built (which
		// does not connect yet): a conflict with the producers'
		// transactions is reported here rather than when Run starts them.
		if cl, err := kgo.NewClient(o.producerOpts(o.TransactionalID + "-0")...); err != nil {
			bad("ClientOptions", "conflict with the relay's transactional producers (%v); remove the conflicting option", err)
		} else {
			cl.Close()
		}
	}
	return errors.Join(errs...)
}

// Stats are a relay's counters.
type Stats struct {
	Published    int64 // records published (their transaction committed)
	Transactions int64 // Kafka transactions committed
	Aborts       int64 // Kafka transactions aborted (and retried)
	Partitions   int   // outbox partitions this relay publishes now
	// Halted counts the partitions this relay refuses to publish now:
	// their position topic is past the last sequence number the database
	// handed out (the outbox tables were recreated or restored). Each is
	// logged at ERROR, with what to do, every 30 seconds.
	Halted int
	// Stuck counts the partitions whose last transaction failed for a
	// reason that is not the rows' and that an operator must fix: a row's
	// topic does not exist (and the producer does not create topics), the
	// broker refuses the relay a topic, or it refuses the records'
	// timestamps. The relay retries them, with backoff, skipping nothing;
	// each is logged at ERROR, with the topic and what to do, every 30
	// seconds while it lasts.
	Stuck int
	// DeadLettered counts the rows moved to the dead-letter table
	// (<TablePrefix>outbox_dead), not published: rows Kafka refuses for
	// good, as a record too large for the producer or the topic, or one
	// the broker rejects, or to a topic name Kafka does not allow. Each is
	// logged at ERROR (at most one line every 30 seconds).
	DeadLettered int64
	// Stranded counts the rows of the outbox in partitions outside 0 to
	// Partitions-1, seen at the relay's last look (when it started, then
	// every minute): a Writer with another Partitions wrote them, and no
	// relay of the outbox publishes them. They are logged at ERROR, with
	// what to do, when their count changes.
	Stranded int64
	// Misplaced counts the rows this relay read whose key hashes to
	// another partition under its Partitions: a Writer with fewer
	// partitions wrote them. They are published, but a key whose rows sit
	// in two partitions is published out of order. Logged at ERROR, at
	// most one line every 30 seconds.
	Misplaced int64
}

// Relay publishes an outbox's committed rows to Kafka, exactly once to a
// read_committed reader: each partition's rows go out in Kafka
// transactions that also write the partition's position to the position
// topic, so a relay that crashes, restarts or is replaced by another
// instance goes on from the last committed transaction. A row Kafka
// refuses for good (too large, say) is moved to the dead-letter table
// <TablePrefix>outbox_dead rather than stop its partition, and a row to a
// missing topic waits for it, loudly (see the package doc, "Rows Kafka
// refuses"). Build it with New, Run it, Close it.
type Relay struct {
	o    Options
	log  *slog.Logger
	life lifecycle.State

	published, transactions, aborts atomic.Int64
	owned, halted, stuck            atomic.Int64
	deadLettered                    atomic.Int64
	strandedRows, misplacedRows     atomic.Int64

	wakeMu sync.Mutex
	wake   map[int]chan struct{} // per partition being published
	pubs   map[int]*publisher    // the partitions being published
}

// New returns a relay for the outbox o names; bad options are reported
// with what to change.
func New(o Options) (*Relay, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	return &Relay{o: o, log: o.Logger.With("outbox", o.Outbox), wake: map[int]chan struct{}{}, pubs: map[int]*publisher{}}, nil
}

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	return Stats{Published: r.published.Load(), Transactions: r.transactions.Load(), Aborts: r.aborts.Load(), Partitions: int(r.owned.Load()),
		Halted: int(r.halted.Load()), Stuck: int(r.stuck.Load()), DeadLettered: r.deadLettered.Load(), Stranded: r.strandedRows.Load(),
		Misplaced: r.misplacedRows.Load()}
}

// Close stops a running Run and waits for it; idempotent.
func (r *Relay) Close() error { return r.life.Close() }

// Outbox returns the name of the outbox the relay publishes.
func (r *Relay) Outbox() string { return r.o.Outbox }

// Pending reports, for each partition this relay publishes now and whose
// position it has read, its position, the committed rows after it and
// its rows in the dead-letter table: what metrics and health checks watch
// (a backlog that grows, a row that waits long). Other partitions are
// other instances' to report.
func (r *Relay) Pending(ctx context.Context) ([]PartitionStatus, error) {
	pos := map[int]int64{}
	r.wakeMu.Lock()
	for p, pub := range r.pubs {
		if v := pub.pos.Load(); v >= 0 {
			pos[p] = v
		}
	}
	r.wakeMu.Unlock()
	if len(pos) == 0 {
		return nil, nil
	}
	return pendingOf(ctx, r.o, pos)
}

// Run publishes until ctx is canceled or Close is called (then it returns
// nil once every partition's open transaction ended), or until an error
// that retrying cannot heal, which it returns: a partition's producer that
// cannot be created, the broker refusing this client the relay's group,
// its position topic or a partition's transactional id (an authorization
// error; grant the ACLs and start the relay again), or the database
// lacking an outbox table or column, the dead-letter table and the
// identity column of requeued rows included (a [*dbscope.SchemaError]:
// run [Migrate], then start the relay again).
// The rows stay in the outbox.
func (r *Relay) Run(ctx context.Context) error {
	ctx, end, err := r.life.Begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	if err := r.prepare(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// Run's goroutines end with it, on a fatal error as well as on ctx.
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.listen(lctx)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.watchStranded(lctx)
	}()

	workers := newWorkers(r)
	defer workers.stopAll()
	if r.o.OwnPartitions != nil {
		for _, p := range r.o.OwnPartitions {
			workers.start(ctx, p)
		}
		select {
		case <-ctx.Done():
		case <-workers.failed:
		}
		return workers.fatal()
	}
	return r.runGroup(ctx, lctx, &wg, workers)
}

// prepare checks the outbox tables and creates or checks the position
// topic, before anything is published.
func (r *Relay) prepare(ctx context.Context) error {
	if err := r.checkTables(ctx); err != nil {
		return err
	}
	return r.ensurePositionTopic(ctx)
}

// runGroup publishes the partitions that a group on the position topic
// assigns to this relay (partition p of the position topic is outbox
// partition p) until ctx ends or a worker fails; the group's watch runs
// in wg until lctx ends.
func (r *Relay) runGroup(ctx, lctx context.Context, wg *sync.WaitGroup, workers *workers) error {
	onGone := func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
		for _, p := range ps[r.o.PositionTopic] {
			workers.stop(int(p))
		}
	}
	opts := append(append([]kgo.Opt{}, r.o.ClientOptions...),
		kgo.SeedBrokers(r.o.Brokers...),
		kgo.ConsumerGroup(r.o.Group),
		kgo.ConsumeTopics(r.o.PositionTopic),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(func(_ context.Context, cl *kgo.Client, ps map[string][]int32) {
			cl.PauseFetchTopics(r.o.PositionTopic) // the relay reads positions itself
			for _, p := range ps[r.o.PositionTopic] {
				workers.start(ctx, int(p))
			}
		}),
		kgo.OnPartitionsRevoked(onGone),
		kgo.OnPartitionsLost(onGone),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kscope: outbox relay: creating the group client: %w", err)
	}
	defer cl.Close()
	// The client's group management assigns and revokes the partitions
	// in the background; nothing is fetched. A poll returns only what the
	// group reports: an error that cannot heal (the group or the position
	// topic refused to this client) stops the relay, others are logged.
	cl.PauseFetchTopics(r.o.PositionTopic)
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.watchGroup(lctx, cl, workers)
	}()
	select {
	case <-ctx.Done():
	case <-workers.failed:
	}
	return workers.fatal() // the deferred Close ends the watch's poll
}

// watchGroup polls the group client, which fetches nothing, for the errors
// its group management reports, until ctx ends or the client closes. A
// fatal one fails the relay.
func (r *Relay) watchGroup(ctx context.Context, cl *kgo.Client, workers *workers) {
	for {
		fs := cl.PollFetches(ctx)
		if fs.IsClientClosed() || ctx.Err() != nil {
			return
		}
		fs.EachError(func(_ string, _ int32, err error) {
			if kafkaerr.Fatal(err) {
				workers.fail(fmt.Errorf("kscope: outbox relay: the group %q: %w; grant this client the group and the position topic %q", r.o.Group, err, r.o.PositionTopic))
				return
			}
			r.log.Warn("kscope: outbox relay: the group reported an error; the client retries", "group", r.o.Group, "err", err)
		})
	}
}

// checkTables fails with a [*dbscope.SchemaError], which says to run
// Migrate, when the database lacks a table or column the relay uses: a
// relay that found no dead-letter table only when a row must go there
// would stop then, and one that cannot read a row's identity would
// retry reading forever. A database that cannot be reached is waited
// for; any other error of the check is logged, and the relay starts.
func (r *Relay) checkTables(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		missing, err := missingSchema(ctx, r.o.Pool, r.o.TablePrefix)
		switch {
		case err == nil && len(missing) == 0:
			return nil
		case err == nil:
			return fmt.Errorf("kscope: outbox relay: %w", &dbscope.SchemaError{Prefix: r.o.TablePrefix, Missing: missing})
		case ctx.Err() != nil:
			return ctx.Err()
		case !dbscope.IsTransient(err):
			r.log.Warn("kscope: outbox relay: could not check the outbox tables; starting anyway", "err", err)
			return nil
		}
		d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
		r.log.Warn("kscope: outbox relay: checking the outbox tables failed; retrying", "err", err, "retry_in", d)
		if !backoff.Sleep(ctx, d) {
			return ctx.Err()
		}
	}
}

// ensurePositionTopic creates the position topic (compacted, one
// partition per outbox partition) or checks the one there.
func (r *Relay) ensurePositionTopic(ctx context.Context) error {
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, r.o.ClientOptions...), kgo.SeedBrokers(r.o.Brokers...))...)
	if err != nil {
		return fmt.Errorf("kscope: outbox relay: creating a Kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, r.o.PositionTopic)
	if err != nil {
		return fmt.Errorf("kscope: outbox relay: looking up the position topic: %w", err)
	}
	if d, ok := td[r.o.PositionTopic]; ok && d.Err == nil {
		if n := len(d.Partitions); n != r.o.Partitions {
			return fmt.Errorf("kscope: outbox relay: the position topic %s has %d partitions, the outbox %d; an outbox's Partitions cannot change while it has a position topic", r.o.PositionTopic, n, r.o.Partitions)
		}
		return nil
	}
	compact := "compact"
	resp, err := adm.CreateTopic(ctx, int32(r.o.Partitions), -1, map[string]*string{"cleanup.policy": &compact}, r.o.PositionTopic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("kscope: outbox relay: creating the position topic %s: %w; create it (compacted, %d partitions) or grant CREATE", r.o.PositionTopic, err, r.o.Partitions)
	}
	return nil
}

// listen wakes the partitions' publishers when a transaction that added
// rows commits, through LISTEN/NOTIFY; while it cannot listen, they poll.
func (r *Relay) listen(ctx context.Context) {
	channel := r.o.TablePrefix + "outbox"
	for attempt := 1; ctx.Err() == nil; attempt++ {
		err := func() error {
			conn, err := r.o.Pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
				return err
			}
			defer conn.Exec(context.WithoutCancel(ctx), "UNLISTEN "+channel) //nolint:errcheck // best effort before the connection goes back
			attempt = 0
			// Rows that committed before the LISTEN sent no wake-up this
			// relay heard: the publishers look now rather than at their
			// next poll.
			r.kickAll()
			for {
				n, err := conn.Conn().WaitForNotification(ctx)
				if err != nil {
					return err
				}
				i := strings.LastIndexByte(n.Payload, '/')
				name, part, ok := n.Payload[:max(i, 0)], n.Payload[i+1:], i >= 0
				if p, err := strconv.Atoi(part); ok && err == nil && name == r.o.Outbox {
					r.kick(p)
				}
			}
		}()
		if ctx.Err() != nil {
			return
		}
		d := backoff.Delay(attempt, 100*time.Millisecond, 10*time.Second)
		r.log.Warn("kscope: outbox relay: listening for new rows failed; polling every PollInterval meanwhile", "err", err, "retry_in", d)
		if !backoff.Sleep(ctx, d) {
			return
		}
	}
}

// kickAll wakes the publisher of every partition this relay publishes.
func (r *Relay) kickAll() {
	r.wakeMu.Lock()
	ps := make([]int, 0, len(r.wake))
	for p := range r.wake {
		ps = append(ps, p)
	}
	r.wakeMu.Unlock()
	for _, p := range ps {
		r.kick(p)
	}
}

// kick wakes partition p's publisher, if this relay publishes it.
func (r *Relay) kick(p int) {
	r.wakeMu.Lock()
	ch := r.wake[p]
	r.wakeMu.Unlock()
	if ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

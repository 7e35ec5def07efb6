package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/ratelog"
	"github.com/kscope-dev/kscope/scope"
)

// Defaults of a DedupeConfig.
const (
	DefaultDedupeWindow  = 24 * time.Hour // DedupeConfig.Window
	DefaultDedupeCleanup = time.Minute    // DedupeConfig.CleanupInterval
)

// DedupeUnavailable says what the AtLeastOnce scope does while its dedupe
// store does not answer (DedupeConfig.Unavailable).
type DedupeUnavailable int

const (
	// FailClosed holds the key-shard whose records the store did not
	// answer for, retrying the store with a backoff that grows to 30 s,
	// until it answers; no record of it is handled meanwhile. The default:
	// for the services kscope serves a duplicate (a second charge, a
	// second shipment) costs more than a delay, and the delay shows
	// (Stats().Dedupe.StoreErrors, the WARN lines, consumer lag).
	FailClosed DedupeUnavailable = iota
	// FailOpen handles the records as if none were a duplicate, counting
	// each in Stats().Dedupe.Unavailable and reporting the record event
	// kscope.dedupe_unavailable: for a service whose handlers are
	// idempotent anyway and whose throughput matters more.
	FailOpen
)

// String returns "fail_closed" or "fail_open".
func (u DedupeUnavailable) String() string {
	switch u {
	case FailClosed:
		return "fail_closed"
	case FailOpen:
		return "fail_open"
	}
	return fmt.Sprintf("DedupeUnavailable(%d)", int(u))
}

// DedupeConfig is the idempotency guard of the AtLeastOnce scope
// (Config.Dedupe): the identity of each record whose handler returned nil
// (Config.Identity: the producer's message-id header, say), prefixed with
// the consumer group (so that groups sharing a store keep apart), is
// remembered in Store for Window, and a record whose identity is remembered is not
// handled again: it is done, committed, counted in Stats().Dedupe.Hits,
// and its delivery ends with the outcome duplicate. A record that failed
// leaves no mark. See package dedupe and docs/dedupe.md.
//
// The identities of a worker's batch (up to 64 records of a key-shard)
// are looked up in one call before their handlers run, and those that
// succeeded are remembered in one call after the last of them, before any
// of them is reported done: so a record is committed only once remembered.
// A crash between a handler's success and that call leaves the record
// handled and not remembered: its redelivery runs it again. Handlers close
// that window with idempotent effects, or the DB scope closes it (the
// inbox row commits with the handler's writes).
//
// The DB scope needs no store (its inbox is its guard) and the Kafka scope
// keeps its own in its transactions (txn.Options.Dedupe): they refuse
// Store.
type DedupeConfig struct {
	// Store remembers the identities; nil turns the guard off.
	Store dedupe.Store
	// Window is how long an identity is remembered: a duplicate that
	// comes later is handled again. Default DefaultDedupeWindow.
	Window time.Duration
	// Unavailable is what happens while the store does not answer.
	// Default FailClosed.
	Unavailable DedupeUnavailable
	// CleanupInterval is how often the runner asks a store that removes
	// expired identities itself (a Cleanup method, as dedupe.Postgres
	// has) to do so. Default DefaultDedupeCleanup.
	CleanupInterval time.Duration
}

// DedupeStats counts the idempotency guard's work (Config.Dedupe), in
// [Stats].Dedupe.
type DedupeStats struct {
	Hits        int64 // records not handled: their identity was remembered
	Remembered  int64 // identities remembered after their handler succeeded
	Unavailable int64 // records handled without the store's answer (FailOpen)
	StoreErrors int64 // calls of the store that failed
}

// validateDedupe checks c.Dedupe and reports each problem to bad.
func (c Config) validateDedupe(bad func(field, format string, args ...any)) {
	d := c.Dedupe
	if d.Store == nil {
		if d.Window != 0 || d.Unavailable != FailClosed || d.CleanupInterval != 0 {
			bad("Dedupe.Store", "is nil while other Dedupe fields are set; set Store (dedupe.NewMemory, dedupe.NewPostgres, redisstore.New) or leave Dedupe empty")
		}
		return
	}
	if d.Window < 0 {
		bad("Dedupe.Window", "is %s; set it to a positive duration (0 selects %s)", d.Window, DefaultDedupeWindow)
	}
	if d.Unavailable != FailClosed && d.Unavailable != FailOpen {
		bad("Dedupe.Unavailable", "is %s; use FailClosed or FailOpen", d.Unavailable)
	}
	if d.CleanupInterval < 0 {
		bad("Dedupe.CleanupInterval", "is %s; set it to a positive duration (0 selects %s)", d.CleanupInterval, DefaultDedupeCleanup)
	}
}

// dedupeGuard is the AtLeastOnce scope's idempotency guard; nil without
// Config.Dedupe.Store.
type dedupeGuard struct {
	cfg      DedupeConfig
	identity Identity
	// prefix goes before each identity in the store, so that groups that
	// consume the same messages and share a store (a table, a Redis
	// prefix) keep apart: "<len(group)>:<group>:".
	prefix string
	log    *slog.Logger
	logs   *ratelog.Limiter
	f      scope.Failures[*Record]
	obs    scope.Observer[*Record]

	hits, remembered, unavailable, storeErrors atomic.Int64
}

// newGuard returns cfg's guard, or nil without a store.
func newGuard(cfg Config) *dedupeGuard {
	d := cfg.Dedupe
	if d.Store == nil {
		return nil
	}
	if d.Window == 0 {
		d.Window = DefaultDedupeWindow
	}
	if d.CleanupInterval == 0 {
		d.CleanupInterval = DefaultDedupeCleanup
	}
	return &dedupeGuard{cfg: d, identity: cfg.Identity, prefix: strconv.Itoa(len(cfg.Group)) + ":" + cfg.Group + ":", log: cfg.Logger.With("group", cfg.Group), logs: ratelog.New(10, 10*time.Second)}
}

// stats returns the guard's counters.
func (g *dedupeGuard) stats() DedupeStats {
	if g == nil {
		return DedupeStats{}
	}
	return DedupeStats{Hits: g.hits.Load(), Remembered: g.remembered.Load(), Unavailable: g.unavailable.Load(), StoreErrors: g.storeErrors.Load()}
}

// seen looks ids up. While the store does not answer it fails open (seen
// is nil: no answer) or closed (it retries, holding the key-shard, until ctx ends or
// of's partition is revoked: ok false).
func (g *dedupeGuard) seen(ctx context.Context, ids []string, of *Record) (seen []bool, ok bool) {
	seen, err := g.store(ctx, func(ctx context.Context) ([]bool, error) { return g.cfg.Store.Seen(ctx, ids) }, of)
	if err == nil {
		return seen, true
	}
	if ctx.Err() != nil || of.Revoked() {
		return nil, false
	}
	return nil, true // FailOpen: no answer
}

// remember remembers ids once their records' handlers succeeded. It
// reports false when they must not be reported done (FailClosed, and ctx
// ended or of's partition was revoked before the store answered): they
// are delivered again.
func (g *dedupeGuard) remember(ctx context.Context, ids []string, of *Record) bool {
	if len(ids) == 0 {
		return true
	}
	if ctx.Err() != nil {
		// A stop does not cut short the remembering of records already
		// handled: it gets a few seconds of its own.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
	}
	_, err := g.store(ctx, func(ctx context.Context) ([]bool, error) {
		return nil, g.cfg.Store.Remember(ctx, ids, g.cfg.Window)
	}, of)
	if err == nil {
		g.remembered.Add(int64(len(ids)))
		return true
	}
	return g.cfg.Unavailable == FailOpen
}

// store makes one call of the store. A failure is counted and logged;
// with FailOpen it is returned, with FailClosed the call is retried on the
// runner's retry loop (holding the key-shard, with a growing backoff that
// it logs) until it succeeds, ctx ends or of's partition is revoked.
func (g *dedupeGuard) store(ctx context.Context, call func(ctx context.Context) ([]bool, error), of *Record) ([]bool, error) {
	out, err := call(ctx)
	if err == nil {
		return out, nil
	}
	g.storeErrors.Add(1)
	if g.cfg.Unavailable == FailOpen {
		g.logs.Log(ctx, g.log, slog.LevelWarn, "kscope: the dedupe store did not answer; handling records without it (FailOpen)", "dedupe unavailable", slog.Any("err", err))
		return nil, err
	}
	first := true
	ok := g.f.Rounds(ctx, nil, func() scope.Round[*Record] {
		if !first {
			if out, err = call(ctx); err == nil {
				return scope.Round[*Record]{}
			}
			g.storeErrors.Add(1)
		}
		first = false
		return scope.Round[*Record]{Err: fmt.Errorf("kscope: the dedupe store did not answer; the key-shard waits for it (FailClosed): %w", err), More: true, Of: of}
	})
	if !ok {
		return nil, err
	}
	return out, nil
}

// unguarded reports a record handled without the store's answer.
func (g *dedupeGuard) unguarded(r *Record) {
	g.unavailable.Add(1)
	g.obs.Event(r, hook.EventDedupeUnavailable, "")
}

// dedupeStats returns the guard's counters, zero without one.
func (r *Runner) dedupeStats() DedupeStats {
	if s, ok := r.unit.(guardedScope); ok {
		return s.guard().stats()
	}
	return DedupeStats{}
}

package consumer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// stuckAfter is how long the poll loop may stay away from polling before
// the runner is not live: a loop that neither waits in a poll nor waits for
// its workers to free in-flight room, and has not come back to poll for
// this long, is stuck (in a rebalance callback, a transaction's end, a
// dispatch). Waiting in a poll for records, or for workers to finish (a
// slow handler, a database that is down), is not being stuck: a restart
// would not help.
const stuckAfter = 2 * time.Minute

// brokersDownAfter is how long no request may reach any broker, while
// requests fail, before the runner is not ready. A member of a group makes
// a request at least every heartbeat interval (3 s by default), so a
// healthy runner never goes this long without one; one broker down among
// several does not make the runner unready as long as the others answer.
const brokersDownAfter = 5 * time.Second

// Health is what a runner's liveness and readiness probes read (see the
// health package for an http.Handler that serves them). Live and Ready are
// the verdicts; NotLive and NotReady say why not, one sentence a reason;
// the other fields are what the verdicts are built from.
//
// A runner is live unless Run returned an error or its poll loop is stuck:
// away from polling for 2 minutes, neither waiting in a poll for records
// nor waiting for its workers to free in-flight room nor for its scope
// (Waiting: a slow handler, a database that is down or a long changelog
// restore is not a stuck loop: a restart would not help).
// Before Run, while it starts and after a clean stop it is live.
//
// It is ready while Run runs, the member has joined its group (received an
// assignment, even an empty one), its scope started (Waiting is empty: in
// the DB scope the database answered and its schema checked out; in the
// Kafka scope with Versions or Dedupe the assigned partitions' state was
// restored from their changelogs, after each assignment), the brokers
// answer, no key-shard holds on a deployment error (Hold.Shards is 0) and
// no fatal error is pending. The brokers do not
// answer when no request has reached one for 5 s while requests fail: a
// group member makes one at least every heartbeat (3 s by default), so a
// broker outage turns the runner unready within about 5 s, and one broker
// down among several that answer does not. A runner that is not live is
// not ready either: every reason in NotLive is in NotReady too.
type Health struct {
	Live     bool
	Ready    bool
	NotLive  []string // why Live is false; empty when it is true
	NotReady []string // why Ready is false; empty when it is true

	Group   string // the runner's consumer group (Config.Group)
	Running bool   // Run was called and has not returned
	Joined  bool   // the member received its assignment in the current group session and has not lost it since
	// Err is the error Run returned, or the fatal error Run stops on
	// while it shuts down; nil otherwise.
	Err     error
	Waiting string    // what Run waits for at start (Stats.Waiting)
	Hold    HoldStats // key-shards holding on a deployment error (Stats.Hold)
	// BrokersDownSince is when a request last reached a broker, while
	// none has for 5 s and requests fail; zero otherwise.
	// BrokerErr is the last failure then.
	BrokersDownSince time.Time
	BrokerErr        string
	// PolledAt is when the poll loop last came back to poll or wait;
	// zero before it first did. InPoll says it waits now, in a poll or
	// for in-flight room.
	PolledAt time.Time
	InPoll   bool
}

// Health returns what the runner's liveness and readiness probes read. It
// is safe to call at any time, concurrently with Run, and cheap enough for
// a probe every second.
func (r *Runner) Health() Health {
	now := time.Now()
	// joined before Stats: a member joins once its scope knows the
	// assigned partitions, so a scope that restores their state at
	// assignment reports it in Waiting by then.
	joined := r.joined.Load()
	st := r.Stats()
	h := Health{Group: r.cfg.Group, Waiting: st.Waiting, Hold: st.Hold}
	r.runHealth.mu.Lock()
	h.Running, h.Err = r.runHealth.running, r.runHealth.err
	ended := r.runHealth.ended
	r.runHealth.mu.Unlock()
	pending := r.fatalErr()
	if h.Running && h.Err == nil {
		h.Err = pending
	}
	h.Joined = h.Running && joined
	if at := r.loopBeat.at.Load(); at != 0 && h.Running {
		h.PolledAt = time.Unix(0, at)
		h.InPoll = r.loopBeat.waiting.Load()
	}
	if h.Running {
		h.BrokersDownSince, h.BrokerErr = r.brokers.down(now)
	}

	var notLive, notReady []string
	switch {
	case ended && h.Err != nil:
		notLive = append(notLive, fmt.Sprintf("Run returned an error: %v", h.Err))
	case ended:
		notReady = append(notReady, "Run returned")
	case !h.Running:
		notReady = append(notReady, "Run has not been called")
	}
	// A loop that waits for its scope (Waiting: a changelog restore) is
	// not stuck: the scope reports its progress and failures there.
	if !h.PolledAt.IsZero() && !h.InPoll && h.Waiting == "" && now.Sub(h.PolledAt) >= stuckAfter {
		notLive = append(notLive, fmt.Sprintf("the poll loop has not come back to poll for %s (since %s)",
			now.Sub(h.PolledAt).Round(time.Second), h.PolledAt.Format(time.RFC3339)))
	}
	if h.Running {
		if pending != nil {
			notReady = append(notReady, fmt.Sprintf("a fatal error is pending; Run stops: %v", pending))
		}
		if h.Waiting != "" {
			notReady = append(notReady, "the scope has not started: "+h.Waiting)
		}
		if !h.BrokersDownSince.IsZero() {
			notReady = append(notReady, fmt.Sprintf("no broker answered for %s: %s",
				now.Sub(h.BrokersDownSince).Round(time.Second), h.BrokerErr))
		}
		if !h.Joined && h.Waiting == "" {
			notReady = append(notReady, fmt.Sprintf("the member has not joined group %s yet (no assignment received)", h.Group))
		}
		if h.Hold.Shards > 0 {
			notReady = append(notReady, fmt.Sprintf("%d key-shards hold since %s on an error that says the deployment is wrong: %s",
				h.Hold.Shards, h.Hold.Since.Format(time.RFC3339), h.Hold.Err))
		}
	}
	h.NotLive = notLive
	h.NotReady = append(append([]string(nil), notLive...), notReady...)
	h.Live, h.Ready = len(h.NotLive) == 0, len(h.NotReady) == 0
	return h
}

// runHealth is what Health knows of Run: whether it runs, and what it
// returned.
type runHealth struct {
	mu      sync.Mutex
	running bool
	ended   bool
	err     error
}

// runBegins marks Run running, for Health.
func (r *Runner) runBegins() {
	r.runHealth.mu.Lock()
	r.runHealth.running = true
	r.runHealth.mu.Unlock()
}

// runEnds marks Run returned with err, for Health.
func (r *Runner) runEnds(err error) {
	r.runHealth.mu.Lock()
	r.runHealth.running, r.runHealth.ended, r.runHealth.err = false, true, err
	r.runHealth.mu.Unlock()
}

// sessionBegins resets what Health knows of the group and the brokers for
// a new client: it has not joined, and its brokers are taken to answer
// until a request fails.
func (r *Runner) sessionBegins() {
	r.joined.Store(false)
	r.brokers.reset()
}

// loopBeat is the poll loop's heartbeat: when it last changed between
// working and waiting (in a poll, or for in-flight room).
type loopBeat struct {
	at      atomic.Int64 // unix nanoseconds; 0 before the loop first ran
	waiting atomic.Bool
}

// wait marks the loop waiting (alive however long it waits).
func (b *loopBeat) wait() {
	b.at.Store(time.Now().UnixNano())
	b.waiting.Store(true)
}

// back marks the loop back from a wait, or at the top of a turn.
func (b *loopBeat) back() {
	b.waiting.Store(false)
	b.at.Store(time.Now().UnixNano())
}

// brokerHealth is a client hook that keeps when a request last reached a
// broker and when one last failed to.
type brokerHealth struct {
	okAt, failAt atomic.Int64 // unix nanoseconds
	mu           sync.Mutex
	lastErr      error
}

var (
	_ kgo.HookBrokerConnect = (*brokerHealth)(nil)
	_ kgo.HookBrokerE2E     = (*brokerHealth)(nil)
)

func (b *brokerHealth) reset() {
	b.okAt.Store(time.Now().UnixNano())
	b.failAt.Store(0)
}

// OnBrokerConnect counts a failed dial (or connection setup) as a failure.
func (b *brokerHealth) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		b.failed(err)
	}
}

// OnBrokerE2E counts a request written and its response read as a
// success, and one that failed on the wire as a failure.
func (b *brokerHealth) OnBrokerE2E(_ kgo.BrokerMetadata, _ int16, e2e kgo.BrokerE2E) {
	if err := e2e.Err(); err != nil {
		b.failed(err)
		return
	}
	b.okAt.Store(time.Now().UnixNano())
}

func (b *brokerHealth) failed(err error) {
	if errors.Is(err, context.Canceled) {
		return // the client gave the request up: no news of the broker
	}
	b.mu.Lock()
	b.lastErr = err
	b.mu.Unlock()
	b.failAt.Store(time.Now().UnixNano())
}

// down returns when a request last reached a broker, and the last
// failure, when none has for brokersDownAfter and one failed since;
// else a zero time.
func (b *brokerHealth) down(now time.Time) (time.Time, string) {
	ok, fail := b.okAt.Load(), b.failAt.Load()
	if fail <= ok || now.Sub(time.Unix(0, ok)) < brokersDownAfter {
		return time.Time{}, ""
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return time.Unix(0, ok), b.lastErr.Error()
}

package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/txn"
)

// The "db-breaker" and "txn-breaker" children pay each record at the
// payment gateway named by gatewayEnv before it is done, through a
// circuit breaker of the gateway that opens after its refusals (503s)
// and stays open for the duration in breakerOpenForEnv. They report each
// change of the breaker's state and each record routed to a retry topic
// or the dead-letter topic as event lines (eventLinePref).
const (
	breakerOpenForEnv = "KSCOPE_CHILD_BREAKER_OPEN_FOR"
	childNameEnv      = "KSCOPE_CHILD_NAME"
	eventLinePref     = "EVENT "
	breakerEvent      = "breaker "
	routedEvent       = "routed "

	// breakerChildFailures is how many refusals open the breaker, and
	// breakerChildShards the children's key-shards: at most that many
	// calls are out when it opens.
	breakerChildFailures = 3
	breakerChildShards   = 8
)

// errGatewayDown is the gateway's refusal; the children's breaker trips on
// it.
var errGatewayDown = errors.New("payment gateway unavailable (503)")

// breakerChildPolicy is the breaker children's failure policy: ordered
// retries through two retry topics, with as many attempts in place as the
// breaker's failures, so that without the breaker a record refused by the
// gateway would go on to the retry topics.
func breakerChildPolicy() retrytopic.Policy {
	return retrytopic.Policy{Backoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, InPlaceAttempts: 3,
		Ladder: []time.Duration{500 * time.Millisecond, 2 * time.Second}, RetryableAttempts: 10}
}

// breakerChildConfig adds the gateway's breaker, the failure policy and
// the event hook to cfg.
func breakerChildConfig(cfg *consumer.Config, say func(string, []byte)) error {
	openFor, err := time.ParseDuration(os.Getenv(breakerOpenForEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", breakerOpenForEnv, err)
	}
	cfg.Shards = breakerChildShards
	cfg.Failures = breakerChildPolicy()
	cfg.Breakers = []consumer.BreakerConfig{{
		Name:  "gateway",
		Trips: func(err error) bool { return errors.Is(err, errGatewayDown) },
		// The in-place attempts: a record refused alone opens the
		// breaker on its last attempt in place.
		Failures: breakerChildFailures, Window: 10 * time.Second, OpenFor: openFor,
	}}
	cfg.Hooks = append(cfg.Hooks, eventHook{say: say})
	return nil
}

// eventHook prints the breaker's changes of state and the records routed
// to a retry topic or the dead-letter topic as event lines.
type eventHook struct{ say func(string, []byte) }

func (h eventHook) OnBreaker(b hook.Breaker) {
	h.say(eventLinePref, []byte(breakerEvent+b.State))
}

func (h eventHook) OnRecordEvent(_ context.Context, _ string, r *kgo.Record, ev hook.Event, detail string) {
	if ev == hook.EventRetryTopic || ev == hook.EventDeadLetter {
		h.say(eventLinePref, fmt.Appendf(nil, "%s%s %s %s", routedEvent, r.Value, ev, detail))
	}
}

// gatewayClient pays records at the gateway.
type gatewayClient struct {
	url string
	hc  *http.Client
}

func newGatewayClient() *gatewayClient {
	return &gatewayClient{url: os.Getenv(gatewayEnv), hc: &http.Client{Timeout: 5 * time.Second}}
}

// pay asks the gateway to pay the record id: a 503 is errGatewayDown,
// retryable.
func (g *gatewayClient) pay(ctx context.Context, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/pay/"+url.PathEscape(id), nil)
	if err != nil {
		return err
	}
	resp, err := g.hc.Do(req)
	if err != nil {
		return consumer.Retryable(err)
	}
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusServiceUnavailable:
		return consumer.Retryable(fmt.Errorf("paying %s: %w", id, errGatewayDown))
	}
	return consumer.Retryable(fmt.Errorf("paying %s: gateway answered %d", id, resp.StatusCode))
}

// runBreakerChild runs a "db-breaker" (DB scope) or "txn-breaker" (Kafka
// scope) child.
func runBreakerChild(ctx context.Context, cfg consumer.Config, db bool, maxDelay time.Duration, emit func([]byte), say func(string, []byte)) int {
	if err := breakerChildConfig(&cfg, say); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	gw := newGatewayClient()
	dawdle := func() {
		if maxDelay > 0 {
			time.Sleep(rand.N(maxDelay))
		}
	}
	var run func(context.Context) error
	if db {
		pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer pool.Close()
		r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
			func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
				dawdle()
				id := consumer.Identity{}.Of(r)
				key, seq, _ := testenv.ParseKeyed(r.Value)
				// The effect first: a refusal rolls it back.
				if _, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`, id, key, seq); err != nil {
					return err
				}
				if err := gw.pay(ctx, id); err != nil {
					return err
				}
				emit(r.Value)
				return nil
			}))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		run = r.Run
	} else {
		out := cfg.Topics[0] + ".out"
		o := txn.Options{TransactionalID: cfg.Group + "-" + os.Getenv(childNameEnv), CommitInterval: 50 * time.Millisecond}
		r, err := txn.New(cfg, o, txn.HandlerFunc(func(ctx context.Context, r *consumer.Record, em txn.Emitter) error {
			dawdle()
			if err := gw.pay(ctx, consumer.Identity{}.Of(r)); err != nil {
				return err
			}
			for _, s := range []string{"a", "b"} {
				em.Emit(&kgo.Record{Topic: out, Key: r.Key, Value: []byte(string(r.Value) + "#" + s)})
			}
			emit(r.Value)
			return nil
		}))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		run = r.Run
	}
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// childEvent is an event line of a child, with when the test read it.
type childEvent struct {
	at   time.Time
	line string // without eventLinePref
}

// childEvents are the event lines a child printed, in order.
type childEvents struct {
	mu    sync.Mutex
	lines []childEvent
}

func (e *childEvents) add(line string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lines = append(e.lines, childEvent{at: time.Now(), line: line})
}

// list returns the events whose line starts with prefix, the prefix cut.
func (e *childEvents) list(prefix string) []childEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []childEvent
	for _, ev := range e.lines {
		if v, ok := strings.CutPrefix(ev.line, prefix); ok {
			out = append(out, childEvent{at: ev.at, line: v})
		}
	}
	return out
}

// breakerState is the state the child's breaker last reported ("closed"
// before any change), and how many times it opened.
func (e *childEvents) breakerState() (state string, opens int) {
	state = "closed"
	for _, ev := range e.list(breakerEvent) {
		state = ev.line
		if state == "open" {
			opens++
		}
	}
	return state, opens
}

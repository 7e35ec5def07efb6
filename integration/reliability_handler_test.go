package integration

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// TestReliabilityHandlerFaults runs the faults that come from handlers and
// operators rather than from the infrastructure: what handlers really
// return, and what changes between two deployments. Each row has a time
// bound; a row over it is reported as a hang.
func TestReliabilityHandlerFaults(t *testing.T) {
	for _, sc := range handlerScenarios() {
		sc.table = tableHandler
		t.Run(sc.scope+"/"+sc.fault, func(t *testing.T) { runScenario(t, sc) })
	}
}

// expectRunError runs a member that must stop at start with an error
// containing want, within limit, and returns how long that took.
func (e *relRun) expectRunError(name string, edit func(*consumer.Config), want string, limit time.Duration) {
	e.t.Helper()
	m := e.startWith(name, edit)
	e.members = e.members[:len(e.members)-1] // it is expected to stop
	select {
	case <-m.done:
	case <-time.After(limit):
		m.stop()
		<-m.done
		e.t.Fatalf("member %s ran for %s without the error %q (Run then returned %v)", name, limit, want, m.runErr)
	}
	if m.runErr == nil || !strings.Contains(m.runErr.Error(), want) {
		e.t.Fatalf("member %s: Run returned %v, want an error containing %q", name, m.runErr, want)
	}
	e.faults.Add(1)
}

// toRetryTopic moves the stream's last n poison records from the source to
// the retry topic of delay, each due at due: a backlog left there by an
// earlier incarnation.
func (e *relRun) toRetryTopic(n int, delay time.Duration, due time.Time) {
	e.t.Helper()
	topic := retrytopic.RetryTopic(e.group, delay)
	if err := e.k.CreateTopic(context.Background(), topic, 4); err != nil {
		e.t.Fatal(err)
	}
	moved := e.recs[len(e.recs)-n:]
	e.recs = e.recs[:len(e.recs)-n]
	for _, r := range moved {
		r.Topic = topic
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: consumer.HeaderDue, Value: []byte(strconv.FormatInt(due.UnixMilli(), 10))})
	}
	if err := e.k.Produce(context.Background(), moved...); err != nil {
		e.t.Fatal(err)
	}
	e.faults.Add(int64(n))
}

// outputEnd is the sum of the Kafka scope's output end offsets: the
// outputs committed so far, with their transaction markers.
func (e *relRun) outputEnd() int64 {
	ends, err := e.k.EndOffsets(context.Background(), e.topic+".out")
	if err != nil {
		return 0
	}
	var n int64
	for _, o := range ends {
		n += o
	}
	return n
}

// failFirst fails the first attempt of every record whose sequence number
// is seq modulo mod, with err, counting a fault each time.
func failFirst(mod, seq int, attempts int32, err error) func(e *relRun, ctx context.Context, tx pgx.Tx, r *consumer.Record, attempt int32) error {
	return func(e *relRun, _ context.Context, _ pgx.Tx, r *consumer.Record, attempt int32) error {
		if _, s, _ := testenv.ParseKeyed(r.Value); s%mod == seq && attempt <= attempts {
			e.faults.Add(1)
			return err
		}
		return nil
	}
}

func handlerScenarios() []relScenario {
	var out []relScenario
	for _, scope := range []string{"DB", "Kafka"} {
		out = append(out,
			relScenario{scope: scope, fault: "a retry record due in the year 9999", poison: 3, bound: 90 * time.Second,
				cfg: func(c *consumer.Config) { c.Failures.Unordered = scope == "Kafka" },
				setup: func(e *relRun) {
					e.toRetryTopic(1, 200*time.Millisecond, time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC))
				},
				inject: func(e *relRun) { e.waitProgress(int64(e.total() / 4)) }},
			relScenario{scope: scope, fault: "TLS configured against a plaintext listener", manual: true, bound: 90 * time.Second,
				inject: func(e *relRun) {
					e.expectRunError("tls", func(c *consumer.Config) {
						c.ClientOptions = append(c.ClientOptions, kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}))
					}, "TLS", time.Minute)
					e.start("a")
				}},
			relScenario{scope: scope, fault: "input topic created after the consumer started", noTopic: true, bound: 90 * time.Second,
				inject: func(e *relRun) {
					e.start("a")
					testenv.WaitFor(e.t, 30*time.Second, "a warning naming the missing input topic", func() bool {
						return strings.Contains(e.logs.String(), "an input topic does not exist") && strings.Contains(e.logs.String(), "topic="+e.topic)
					})
					e.faults.Add(1)
					e.createInput()
				}},
		)
	}
	for _, scope := range []string{"DB", "Kafka"} {
		out = append(out, relScenario{scope: scope, poison: 12, bound: 90 * time.Second,
			fault: "handler errors wrapping io.ErrUnexpectedEOF (a DecodeError), io.EOF and a net.Error",
			poisonErr: func(i int) error {
				switch i % 3 {
				case 0:
					return consumer.DecodeError(fmt.Errorf("truncated JSON body: %w", io.ErrUnexpectedEOF))
				case 1:
					return fmt.Errorf("calling the gateway: %w", io.EOF)
				}
				return fmt.Errorf("calling the gateway: %w", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded})
			},
			inject: func(e *relRun) {
				testenv.WaitFor(e.t, time.Minute, "every poison record dead-lettered", func() bool { return e.dltAtLeast(12) })
				e.faults.Add(12)
			}})
	}
	out = append(out,
		relScenario{scope: "Kafka", fault: "one key retrying in place for about 7s (backoff 1s to 2s)", bound: 90 * time.Second,
			cfg: func(c *consumer.Config) {
				c.Failures.Backoff, c.Failures.MaxBackoff, c.Failures.InPlaceAttempts = time.Second, 2*time.Second, 6
				c.Failures.RetryableAttempts = 10
			},
			before: func(e *relRun, _ context.Context, _ pgx.Tx, r *consumer.Record, attempt int32) error {
				if key, s, _ := testenv.ParseKeyed(r.Value); key == "k003" && s == 5 && attempt <= 4 {
					e.faults.Add(1)
					return consumer.Retryable(errFlaky)
				}
				return nil
			},
			inject: func(e *relRun) {
				testenv.WaitFor(e.t, time.Minute, "the key retrying", func() bool { return e.faults.Load() > 0 })
				// The committed input offset of the key's partition stays
				// at the retrying record; the outputs of the other records
				// commit meanwhile.
				start := time.Now()
				testenv.WaitFor(e.t, time.Minute, "a quarter of the outputs committed", func() bool {
					return e.outputEnd() >= int64(e.total()/2)
				})
				if el := time.Since(start); el > 5*time.Second || e.faults.Load() >= 4 {
					e.t.Errorf("other keys waited for the retrying key: a quarter of the outputs took %s (%d failed attempts by then)", el, e.faults.Load())
				}
			}},
		relScenario{scope: "Kafka", fault: "restart after a death between TxnOffsetCommit and EndTxn (the open transaction's timeout 5m)",
			manual: true, bound: 90 * time.Second,
			inject: func(e *relRun) {
				// The predecessor's output must never be seen.
				e.k.OpenTransaction(e.t, e.group+"-a", e.group, e.topic, 4, 0, &kgo.Record{Topic: e.topic + ".out", Value: []byte("predecessor#a")})
				e.faults.Add(1)
				start := time.Now()
				e.start("a") // the same transactional id
				e.waitProgress(int64(e.total() / 4))
				if el := time.Since(start); el > 30*time.Second {
					e.t.Errorf("the restarted member waited %s for its predecessor's transaction", el)
				}
			}},
		relScenario{scope: "Kafka", fault: "output topic created after the consumer started", noOutput: true, bound: 90 * time.Second,
			inject: func(e *relRun) {
				testenv.WaitFor(e.t, time.Minute, "an error naming the missing output topic", func() bool {
					return strings.Contains(e.logs.String(), "output topic "+e.topic+".out does not exist")
				})
				e.faults.Add(1)
				if err := e.k.CreateTopic(context.Background(), e.topic+".out", 4); err != nil {
					e.t.Fatal(err)
				}
			}},
		relScenario{scope: "DB", fault: "a failed statement ignored (nil returned), and Skip after a failed statement", skips: 12, bound: 90 * time.Second,
			before: func(e *relRun, ctx context.Context, tx pgx.Tx, r *consumer.Record, attempt int32) error {
				if _, s, _ := testenv.ParseKeyed(r.Value); s%19 == 4 && attempt == 1 {
					e.faults.Add(1)
					_, _ = tx.Exec(ctx, `SELECT 1/0`) // the error is ignored: the transaction is left aborted
					return errSkipEffect
				}
				return nil
			},
			inject: func(e *relRun) { e.waitProgress(int64(e.total() / 2)) }},
		relScenario{scope: "DB", fault: "dbscope.Migrate forgotten before the first start", manual: true, noMigrate: true, bound: 90 * time.Second,
			inject: func(e *relRun) {
				e.expectRunError("a", nil, "dbscope.Migrate", 30*time.Second)
				if err := dbscope.Migrate(context.Background(), e.pool, ""); err != nil {
					e.t.Fatal(err)
				}
				e.start("b")
			}},
		relScenario{scope: "DB", fault: "retry backlog of 400 not yet due, in-flight bound 100", poison: 400, bound: 2 * time.Minute,
			cfg: func(c *consumer.Config) {
				c.MaxInFlightRecords = 100
				c.Failures.Ladder = []time.Duration{200 * time.Millisecond, 30 * time.Second}
			},
			setup: func(e *relRun) { e.toRetryTopic(400, 30*time.Second, time.Now().Add(20*time.Second)) },
			inject: func(e *relRun) {
				// The source stream finishes while the backlog waits.
				start := time.Now()
				testenv.WaitFor(e.t, 2*time.Minute, "the source stream applied", func() bool {
					return e.progress() >= int64(e.total())
				})
				if el := time.Since(start); el > 15*time.Second {
					e.t.Errorf("the source stream took %s beside a retry backlog that is not due: it waited for it", el)
				}
			}},
		relScenario{scope: "DB", fault: "shutdown while a record sleeps in a 30s retry backoff", manual: true, bound: 90 * time.Second,
			cfg: func(c *consumer.Config) {
				c.DrainTimeout, c.RebalanceTimeout = 20*time.Second, 40*time.Second
				c.Failures.Backoff, c.Failures.MaxBackoff = 30*time.Second, 30*time.Second
				c.Failures.InPlaceAttempts = 3
			},
			// One record fails once, and waits 30s for its second attempt.
			before: func(e *relRun, _ context.Context, _ pgx.Tx, r *consumer.Record, attempt int32) error {
				if _, s, _ := testenv.ParseKeyed(r.Value); s == 7 && attempt == 1 && e.faults.CompareAndSwap(0, 1) {
					return consumer.Retryable(errFlaky)
				}
				return nil
			},
			inject: func(e *relRun) {
				a := e.start("a")
				testenv.WaitFor(e.t, time.Minute, "a record in its backoff", func() bool { return e.faults.Load() > 0 })
				start := time.Now()
				if err := a.leave(e.t); err != nil {
					e.t.Errorf("member a: %v", err)
				}
				if el := time.Since(start); el > 5*time.Second {
					e.t.Errorf("the shutdown took %s: it waited for a retry backoff", el)
				}
				e.start("b")
			}},
		relScenario{scope: "DB", fault: "a retry rung removed between two deployments", manual: true, bound: 2 * time.Minute,
			cfg: func(c *consumer.Config) {
				c.Failures.Ladder = []time.Duration{200 * time.Millisecond, 2 * time.Second}
				c.Failures.RetryableAttempts = 10
			},
			before: failFirst(41, 11, 4, consumer.Retryable(errFlaky)),
			inject: func(e *relRun) {
				a := e.start("a")
				// The first deployment stops early, while records are on
				// their way through the rungs (some routed twice, since a
				// stop can fall between a routing's transaction and its
				// acknowledgement); the second drains what is left.
				testenv.WaitFor(e.t, time.Minute, "records failing through the rungs", func() bool { return e.faults.Load() >= 8 })
				if err := a.leave(e.t); err != nil {
					e.t.Errorf("member a: %v", err)
				}
				e.startWith("b", func(c *consumer.Config) { c.Failures.Ladder = c.Failures.Ladder[:1] })
			}},
	)
	return out
}

// errSkipEffect is returned by a handler hook that wants its record's
// attempt to end without the effect and without an error of its own: the
// hook returns it, and the record's handler returns nil.
var errSkipEffect = errors.New("return nil without the effect")

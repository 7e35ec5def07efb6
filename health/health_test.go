package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/health"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/txn"
)

// Every runner kscope builds is something the handler can check.
var (
	_ health.Runner = (*consumer.Runner)(nil)
	_ health.Runner = (*dbscope.Runner)(nil)
	_ health.Runner = (*txn.Runner)(nil)
)

func config(k *testenv.Kafka, group, topic string) consumer.Config {
	return consumer.Config{
		Brokers:        k.Brokers,
		Group:          group,
		Topics:         []string{topic},
		CommitInterval: 50 * time.Millisecond,
		DrainTimeout:   5 * time.Second,
		Logger:         slog.New(slog.DiscardHandler),
	}
}

func ignore(context.Context, *consumer.Record) error { return nil }

// run runs r until the test ends and returns a channel with what Run
// returned.
func run(t *testing.T, r interface{ Run(context.Context) error }) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc, done := make(chan error, 1), make(chan struct{})
	go func() { errc <- r.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("Run did not return within a minute of cancel")
		}
	})
	return errc
}

// probe GETs path on srv and returns the status code and the body.
func probe(t *testing.T, srv *httptest.Server, path string) (int, health.Report) {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("GET %s: Content-Type %q, want application/json", path, ct)
	}
	var rep health.Report
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatalf("GET %s: body is not a report: %v", path, err)
	}
	return resp.StatusCode, rep
}

// says reports whether rep has a failed check of group whose reasons
// contain want.
func says(rep health.Report, group, want string) bool {
	for _, c := range rep.Checks {
		if c.Runner == group && !c.OK && strings.Contains(strings.Join(c.Reasons, "\n"), want) {
			return true
		}
	}
	return false
}

// /readyz turns 200 once the member joined its group, 503 within 10 s of
// the broker going away, and 200 again once it is back; /livez stays 200
// throughout. On the in-process kfake the broker closes every connection
// at its first request; on Apache Kafka its JVM is killed and restarted on
// the same port and data directory.
func TestReadyzFollowsTheBroker(t *testing.T) {
	k := testenv.KafkaT(t)
	goAway, comeBack := brokerSwitch(t, k)
	const topic, group = "health-broker", "g-health-broker"
	if err := k.CreateTopic(context.Background(), topic, 2); err != nil {
		t.Fatal(err)
	}
	r, err := consumer.New(config(k, group, topic), consumer.HandlerFunc(ignore))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(health.New(r))
	defer srv.Close()

	if code, rep := probe(t, srv, "/readyz"); code != http.StatusServiceUnavailable || !says(rep, group, "Run has not been called") {
		t.Fatalf("before Run: /readyz %d %+v, want 503 saying Run has not been called", code, rep)
	}
	if code, rep := probe(t, srv, "/livez"); code != http.StatusOK || rep.Status != "ok" {
		t.Fatalf("before Run: /livez %d %+v, want 200", code, rep)
	}
	run(t, r)
	testenv.WaitFor(t, 30*time.Second, "/readyz 200 once the member joined", func() bool {
		code, _ := probe(t, srv, "/readyz")
		return code == http.StatusOK
	})
	if !r.Health().Joined {
		t.Fatal("ready but Health().Joined is false")
	}

	goAway()
	gone := time.Now()
	var rep health.Report
	testenv.WaitFor(t, 10*time.Second, "/readyz 503 naming the brokers after the broker went away", func() bool {
		var code int
		code, rep = probe(t, srv, "/readyz")
		return code == http.StatusServiceUnavailable && says(rep, group, "no broker answered")
	})
	t.Logf("%s: unready %s after the broker went away: %+v", k.Kind, time.Since(gone).Round(time.Millisecond), rep)
	if rep.Status != "unready" {
		t.Fatalf("status %q, want unready", rep.Status)
	}
	if code, rep := probe(t, srv, "/livez"); code != http.StatusOK {
		t.Fatalf("/livez %d %+v while the broker is away, want 200: a restart does not bring a broker back", code, rep)
	}

	back := comeBack()
	testenv.WaitFor(t, time.Minute, "/readyz 200 once the broker is back", func() bool {
		code, _ := probe(t, srv, "/readyz")
		return code == http.StatusOK
	})
	t.Logf("%s: ready %s after the broker came back", k.Kind, time.Since(back).Round(time.Millisecond))
	if code, rep := probe(t, srv, "/livez"); code != http.StatusOK {
		t.Fatalf("/livez %d %+v after the broker came back, want 200", code, rep)
	}
}

// brokerSwitch returns how the test takes k's broker away and brings it
// back; comeBack returns when the broker answers again. It skips the test
// on a backend it cannot take away (external brokers, a container).
func brokerSwitch(t *testing.T, k *testenv.Kafka) (goAway func(), comeBack func() time.Time) {
	t.Helper()
	switch {
	case k.Cluster != nil:
		var away atomic.Bool
		k.Cluster.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
			if !away.Load() {
				return nil, nil, false
			}
			k.Cluster.KeepControl()
			return nil, errors.New("the broker went away"), true // closes the connection
		})
		return func() { away.Store(true) }, func() time.Time { away.Store(false); return time.Now() }
	case k.Apache != nil:
		id := k.Apache.NodeIDs()[0]
		goAway = func() {
			if err := k.Apache.Kill(id); err != nil {
				t.Fatal(err)
			}
		}
		comeBack = func() time.Time {
			// Restart returns once the broker is in the cluster's
			// metadata again: it answers from then on.
			start := time.Now()
			if err := k.Apache.Restart(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			t.Logf("the broker restarted in %s", time.Since(start).Round(time.Millisecond))
			return time.Now()
		}
		return goAway, comeBack
	}
	t.Skipf("taking the broker away needs the in-process kfake or Apache Kafka backend, not %s", k.Kind)
	return nil, nil
}

// /livez turns 503 once Run returned an error (here the broker refuses the
// group its topic), and says what the error was.
func TestLivezFailsWhenRunFailed(t *testing.T) {
	k := testenv.KafkaT(t)
	if k.Cluster == nil {
		t.Skip("refusing the topic needs the in-process kfake backend")
	}
	const topic, group = "health-refused", "g-health-refused"
	if err := k.CreateTopic(context.Background(), topic, 1); err != nil {
		t.Fatal(err)
	}
	r, err := consumer.New(config(k, group, topic), consumer.HandlerFunc(ignore))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(health.New(r))
	defer srv.Close()
	errc := run(t, r)
	testenv.WaitFor(t, 30*time.Second, "/readyz 200", func() bool {
		code, _ := probe(t, srv, "/readyz")
		return code == http.StatusOK
	})
	if _, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Topic: topic, Err: kerr.TopicAuthorizationFailed, Count: -1}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, kerr.TopicAuthorizationFailed) {
			t.Fatalf("Run returned %v, want the refused read", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after the broker refused the topic")
	}
	code, rep := probe(t, srv, "/livez")
	if code != http.StatusServiceUnavailable || rep.Status != "not live" || !says(rep, group, "Run returned an error") || !says(rep, group, "TOPIC_AUTHORIZATION_FAILED") {
		t.Fatalf("/livez %d %+v after Run failed, want 503 naming the error", code, rep)
	}
	if code, rep := probe(t, srv, "/readyz"); code != http.StatusServiceUnavailable || !says(rep, group, "Run returned an error") {
		t.Fatalf("/readyz %d %+v after Run failed, want 503", code, rep)
	}
}

// /livez turns 503 once Run returned an error on any backend: here a
// DB-scope runner's schema check finds a database kscope's tables were
// never migrated into, and /livez names what is missing.
func TestLivezFailsWhenTheSchemaIsMissing(t *testing.T) {
	k := testenv.KafkaT(t)
	const topic, group = "health-schema", "g-health-schema"
	if err := k.CreateTopic(context.Background(), topic, 1); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), testenv.DatabaseT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r, err := dbscope.New(config(k, group, topic), dbscope.Options{Pool: pool},
		dbscope.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(health.New(r))
	defer srv.Close()
	errc := run(t, r)
	select {
	case err := <-errc:
		var se *dbscope.SchemaError
		if !errors.As(err, &se) {
			t.Fatalf("Run returned %v, want a *dbscope.SchemaError", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return on a database without kscope's tables")
	}
	code, rep := probe(t, srv, "/livez")
	if code != http.StatusServiceUnavailable || !says(rep, group, "Run returned an error") || !says(rep, group, "dbscope.Migrate") {
		t.Fatalf("/livez %d %+v after the schema check failed, want 503 naming the missing tables", code, rep)
	}
	if code, rep := probe(t, srv, "/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz %d %+v after Run failed, want 503", code, rep)
	}
}

// A DB-scope runner that waits at start for its database is live and not
// ready, and /readyz says which database it waits for; once the database
// answers (a proxy to a migrated database starts listening where the pool
// points) and the schema checks out, /readyz answers 200.
func TestReadyzWhileTheDatabaseIsAwayAtStart(t *testing.T) {
	k := testenv.KafkaT(t)
	const topic, group = "health-db", "g-health-db"
	if err := k.CreateTopic(context.Background(), topic, 1); err != nil {
		t.Fatal(err)
	}
	real, err := pgxpool.ParseConfig(testenv.DatabaseT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := migrate(real); err != nil {
		t.Fatal(err)
	}
	addr := closedPort(t)
	cc := real.ConnConfig
	cfg, err := pgxpool.ParseConfig((&url.URL{Scheme: "postgres", User: url.User(cc.User), Host: addr, Path: "/" + cc.Database, RawQuery: "sslmode=disable"}).String())
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r, err := dbscope.New(config(k, group, topic), dbscope.Options{Pool: pool, StartTimeout: time.Minute},
		dbscope.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(health.New(r))
	defer srv.Close()
	run(t, r)
	testenv.WaitFor(t, 20*time.Second, "/readyz 503 naming the database's address", func() bool {
		code, rep := probe(t, srv, "/readyz")
		return code == http.StatusServiceUnavailable && says(rep, group, "the scope has not started") && says(rep, group, addr)
	})
	if code, rep := probe(t, srv, "/livez"); code != http.StatusOK {
		t.Fatalf("/livez %d %+v while the database is away at start, want 200", code, rep)
	}
	testenv.Proxy(t, addr, net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))))
	up := time.Now()
	testenv.WaitFor(t, 30*time.Second, "/readyz 200 once the database answers", func() bool {
		code, _ := probe(t, srv, "/readyz")
		return code == http.StatusOK
	})
	t.Logf("ready %s after the database answered", time.Since(up).Round(time.Millisecond))
}

// migrate creates kscope's tables in the database of cfg.
func migrate(cfg *pgxpool.Config) error {
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	return dbscope.Migrate(context.Background(), pool, "")
}

// The handler answers only its two paths, only to GET and HEAD, and fails
// both probes when it was given no runner.
func TestHandlerPathsAndMethods(t *testing.T) {
	srv := httptest.NewServer(health.New())
	defer srv.Close()
	for path, want := range map[string]int{"/livez": 503, "/readyz": 503, "/healthz": 404, "/probes/readyz": 503} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	if code, rep := probe(t, srv, "/readyz"); code != 503 || len(rep.Checks) != 1 || !strings.Contains(rep.Checks[0].Reasons[0], "no runner") {
		t.Fatalf("no runners: %d %+v", code, rep)
	}
	resp, err := http.Post(srv.URL+"/livez", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /livez: %d, want 405", resp.StatusCode)
	}
}

// closedPort returns a loopback address where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(fmt.Errorf("closing %s: %w", addr, err))
	}
	return addr
}

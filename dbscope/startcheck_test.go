package dbscope_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// A runner whose connection string has a wrong password fails at start
// with a *dbscope.DatabaseError that names the user and the setting to
// check, instead of logging and joining the group.
func TestWrongPasswordFailsAtStart(t *testing.T) {
	good := passwordDatabase(t)
	u, err := url.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "wrong")
	pool := lazyPool(t, u.String())
	r, err := dbscope.New(baseConfig(&testenv.Kafka{Brokers: []string{"127.0.0.1:1"}}, "g-wrong-password", "t"),
		dbscope.Options{Pool: pool}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	err = runBounded(t, r, 30*time.Second)
	var de *dbscope.DatabaseError
	if !errors.As(err, &de) || de.TimedOut || !strings.HasPrefix(de.Code, "28") {
		t.Fatalf("Run returned %v, want a *dbscope.DatabaseError with a class 28 SQLSTATE", err)
	}
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != "28P01" {
		t.Fatalf("Run returned %v, want it to wrap PostgreSQL's 28P01", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "password") || !strings.Contains(msg, u.User.Username()) || !strings.Contains(msg, "connection string") {
		t.Fatalf("Run returned %q, want it to name the user and say to check the password of the connection string", msg)
	}
}

// A runner whose connection string names a database that does not exist
// fails at start with a *dbscope.DatabaseError that names the database.
func TestMissingDatabaseFailsAtStart(t *testing.T) {
	u, err := url.Parse(testenv.DatabaseT(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/no_such_database_kscope"
	r, err := dbscope.New(baseConfig(&testenv.Kafka{Brokers: []string{"127.0.0.1:1"}}, "g-missing-db", "t"),
		dbscope.Options{Pool: lazyPool(t, u.String())}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	err = runBounded(t, r, 30*time.Second)
	var de *dbscope.DatabaseError
	if !errors.As(err, &de) || de.Code != "3D000" || !strings.Contains(err.Error(), "no_such_database_kscope") || !strings.Contains(err.Error(), "database name") {
		t.Fatalf("Run returned %v, want a *dbscope.DatabaseError naming the missing database and the setting", err)
	}
}

// A runner pointed at a port where nothing listens retries, reporting
// the wait in Stats().Waiting, and fails after Options.StartTimeout with
// a *dbscope.DatabaseError that names the address.
func TestClosedDatabasePortFailsAfterStartTimeout(t *testing.T) {
	addr := closedPort(t)
	pool := lazyPool(t, "postgres://kscope@"+addr+"/kscope?sslmode=disable&connect_timeout=5")
	const timeout = 2 * time.Second
	r, err := dbscope.New(baseConfig(&testenv.Kafka{Brokers: []string{"127.0.0.1:1"}}, "g-closed-db", "t"),
		dbscope.Options{Pool: pool, StartTimeout: timeout}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = runBounded(t, r, 30*time.Second)
	var de *dbscope.DatabaseError
	if !errors.As(err, &de) || !de.TimedOut || de.Addr != addr {
		t.Fatalf("Run returned %v, want a *dbscope.DatabaseError that timed out on %s", err, addr)
	}
	if took := time.Since(start); took < timeout {
		t.Fatalf("Run failed after %v, before its start timeout of %v", took, timeout)
	}
	if msg := err.Error(); !strings.Contains(msg, addr) || !strings.Contains(msg, "StartTimeout") {
		t.Fatalf("Run returned %q, want it to name %s and Options.StartTimeout", msg, addr)
	}
	if w := r.Stats().Waiting; w != "" {
		t.Fatalf("Stats().Waiting is %q after Run returned, want empty", w)
	}
}

// A database that starts answering within the start window lets the
// runner start: until then Stats().Waiting says what it waits for, then
// records are applied.
func TestDatabaseUpDuringStartWindow(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	real := newPool(t)
	const topic = "db-comes-up"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	addr := closedPort(t)
	cc := real.Config().ConnConfig
	u := url.URL{Scheme: "postgres", User: url.User(cc.User), Host: addr, Path: "/" + cc.Database, RawQuery: "sslmode=disable"}
	pool := lazyPool(t, u.String())
	r, err := dbscope.New(baseConfig(k, "g-db-comes-up", topic), dbscope.Options{Pool: pool, StartTimeout: time.Minute}, dbscope.HandlerFunc(insertEffect))
	if err != nil {
		t.Fatal(err)
	}
	run(t, r)
	testenv.WaitFor(t, 20*time.Second, "Stats().Waiting naming the database's address", func() bool {
		return strings.Contains(r.Stats().Waiting, addr)
	})
	testenv.Proxy(t, addr, net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))))
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("k/1")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the record applied once the database answers", func() bool { return countEffects(t, real).rows == 1 })
	if w := r.Stats().Waiting; w != "" {
		t.Fatalf("Stats().Waiting is %q once the runner started, want empty", w)
	}
}

// runBounded runs r and returns what Run returned, failing the test when
// Run did not return within bound.
func runBounded(t *testing.T, r interface{ Run(context.Context) error }, bound time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	err := r.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Run did not return within %v (returned %v)", bound, err)
	}
	return err
}

// lazyPool returns a pool on dbURL that connects on first use.
func lazyPool(t *testing.T, dbURL string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// closedPort returns a loopback address where nothing listens: a port the
// kernel handed out and that was closed again.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// passwordDatabase returns the URL of a database whose user logs in with
// a password: on DATABASE_URL's server, a role made for the test (the
// test is skipped when the server lets a wrong password in); else on a
// throwaway server whose pg_hba.conf asks that role for its password.
func passwordDatabase(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	var pg *testenv.Postgres
	if os.Getenv("DATABASE_URL") != "" {
		pg = testenv.SharedPostgres(t)
	} else {
		dir := t.TempDir()
		hba := filepath.Join(dir, "pg_hba.conf")
		conf := "local all all trust\nhost all kscope 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
		if err := os.WriteFile(hba, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		// The server may run as another user (as root, as postgres).
		for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		var err error
		pg, err = testenv.StartPostgres(ctx, testenv.PostgresOptions{Settings: map[string]string{"fsync": "off", "hba_file": hba}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pg.Close)
	}
	dbURL, err := pg.NewDatabase(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	role := "pw_" + strings.TrimPrefix(u.Path, "/") // the database's name is unique
	if _, err := conn.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN PASSWORD 'right'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), pg.URL)
		if err == nil {
			c.Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize()) //nolint:errcheck // best effort
			c.Close(context.Background())
		}
	})
	u.User = url.UserPassword(role, "wrong")
	if c, err := pgx.Connect(ctx, u.String()); err == nil {
		c.Close(ctx)
		t.Skip("the PostgreSQL server lets a wrong password in (trust authentication)")
	}
	u.User = url.UserPassword(role, "right")
	return u.String()
}

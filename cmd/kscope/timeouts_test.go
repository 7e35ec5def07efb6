package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/outbox"
)

// bounded runs kscope with args and checks that it fails (exit 1) within
// limit, naming addr and the timeout flag that gave up.
func bounded(t *testing.T, limit time.Duration, addr, flag string, args ...string) {
	t.Helper()
	start := time.Now()
	res := kscope(t, args...)
	if took := time.Since(start); took > limit {
		t.Errorf("%s: failed after %v, want within %v", strings.Join(args[:2], " "), took.Round(time.Millisecond), limit)
	}
	res.want(t, exitFailure, addr, flag)
}

// A broker that takes connections and never answers (a hung broker, a
// port something else listens on) fails a command within
// --request-timeout, and the error names the broker.
func TestSilentBrokerFailsWithinTheRequestTimeout(t *testing.T) {
	addr := testenv.SilentServer(t)
	pg := testenv.StalledPostgres(t) // never reached: the broker fails first
	timeouts := []string{"--brokers", addr, "--request-timeout", "1s", "--connect-timeout", "1s"}
	for _, args := range [][]string{
		{"dlt", "list", "--group", "payments"},
		{"dlt", "show", "--group", "payments", "--partition", "0", "--offset", "0"},
		{"dlt", "redrive", "--group", "payments", "--to", "source", "--by", "ops"},
		{"replay", "--group", "payments", "--topic", "orders", "--to-end"},
		{"outbox", "status", "--database-url", "postgres://kscope@" + pg + "/db?sslmode=disable"},
	} {
		bounded(t, 5*time.Second, addr, "no answer from the brokers "+addr+" within --request-timeout 1s", append(args, timeouts...)...)
	}
}

// A PostgreSQL port that takes connections and never answers fails an
// outbox command within --connect-timeout; a server that connects and
// then never answers a query, within --request-timeout. The error names
// the server.
func TestSilentPostgresFailsWithinItsTimeouts(t *testing.T) {
	silent := testenv.SilentServer(t)
	for _, args := range [][]string{
		{"outbox", "dead", "list"},
		{"outbox", "dead", "show", "default/0/1"},
		{"outbox", "dead", "discard", "default/0/1", "--yes"},
	} {
		bounded(t, 5*time.Second, silent, "PostgreSQL at "+silent+" did not complete the connection within --connect-timeout 1s",
			append(args, "--database-url", "postgres://kscope@"+silent+"/db", "--connect-timeout", "1s")...)
	}
	stalled := testenv.StalledPostgres(t)
	for _, args := range [][]string{
		{"outbox", "dead", "list"},
		{"outbox", "dead", "requeue", "--all", "--yes"},
	} {
		bounded(t, 5*time.Second, stalled, "PostgreSQL at "+stalled+" did not answer within --request-timeout 1s",
			append(args, "--database-url", "postgres://kscope@"+stalled+"/db?sslmode=disable", "--request-timeout", "1s")...)
	}
}

func TestTimeoutFlagsMustBePositive(t *testing.T) {
	kscope(t, "dlt", "list", "--brokers", "127.0.0.1:1", "--group", "g", "--request-timeout", "0s").
		want(t, exitUsage, "--request-timeout must be positive")
	kscope(t, "outbox", "dead", "list", "--database-url", "postgres://x@127.0.0.1:1/db", "--connect-timeout", "-1s").
		want(t, exitUsage, "--connect-timeout and --request-timeout must be positive")
	// Both are documented, with their defaults, on every command that
	// talks to a server (not dev, which starts its own, nor the policy
	// commands, which read a file).
	for _, c := range commands() {
		if c.name == "dev" || strings.HasPrefix(c.name, "policy ") {
			continue
		}
		kscope(t, append([]string{"help"}, strings.Fields(c.name)...)...).want(t, exitOK, "--connect-timeout duration", "(default 10s)", "--request-timeout duration", "(default 15s)")
	}
}

// outbox status on an outbox no relay has run for (no position topic)
// says so, and counts every row as pending, instead of failing with
// UNKNOWN_TOPIC_OR_PARTITION.
func TestOutboxStatusBeforeAnyRelay(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	url := testenv.DatabaseT(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Writer{Outbox: "billing", Partitions: 2}.Add(ctx, tx, &kgo.Record{Topic: "invoices", Value: []byte("x")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	res := kscope(t, "outbox", "status", brokers(k), "--database-url", url, "--outbox", "billing", "--partitions", "2")
	res.want(t, exitOK, "1 row pending", "no relay of outbox billing has run yet: its position topic kscope-outbox-billing.positions does not exist")
	if strings.Contains(res.stdout+res.stderr, "UNKNOWN_TOPIC_OR_PARTITION") {
		t.Fatalf("status surfaces Kafka's error:\n%s", res.stdout+res.stderr)
	}
	kscope(t, "outbox", "status", brokers(k), "--database-url", url, "--outbox", "billing", "--partitions", "2", "--json").
		want(t, exitOK, `"position":0,"pending":1`, `"never_relayed":true`)
}

// An error line says "kscope <command>: " once: not again from the
// library's "kscope: " prefix, nor the command's name twice.
func TestErrorsSayKscopeOnce(t *testing.T) {
	if got := message("outbox status", errors.New("kscope: outbox status: reading the positions: kscope: outbox: x")); got != "reading the positions: outbox: x" {
		t.Errorf("message: %q", got)
	}
	// A database without kscope's tables: the library's errors say
	// "kscope: outbox: ..." and "kscope: outbox status: ...".
	url := testenv.DatabaseT(t)
	k := testenv.KafkaT(t)
	for _, c := range []struct {
		name string
		args []string
	}{
		{"outbox dead list", []string{"--database-url", url}},
		{"outbox dead show", []string{"default/0/1", "--database-url", url}},
		{"outbox status", []string{"--database-url", url, brokers(k)}},
		{"dlt list", []string{"--group", "nosuch", brokers(k)}},
	} {
		res := kscope(t, append(strings.Fields(c.name), c.args...)...)
		if res.code != exitFailure {
			t.Fatalf("%s: exit %d\n%s%s", c.name, res.code, res.stdout, res.stderr)
		}
		line, _, _ := strings.Cut(res.stderr, "\n")
		t.Log(line)
		rest, ok := strings.CutPrefix(line, "kscope "+c.name+": ")
		if !ok || strings.Contains(rest, "kscope: ") || strings.HasPrefix(rest, c.name) || strings.HasPrefix(rest, "kscope") {
			t.Errorf("%s: the error line says kscope or the command more than once: %q", c.name, line)
		}
	}
}

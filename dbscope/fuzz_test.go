package dbscope_test

import (
	"context"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/sequence"
)

// The table prefix goes into SQL text (identifiers cannot be parameters):
// whatever Options hold, New never panics, and it accepts only a prefix
// that is a plain lower-case identifier, so no prefix can inject SQL.
// Every other field is accepted only within its documented bounds.
func FuzzOptions(f *testing.F) {
	f.Add("", 0, int64(0), int64(0), int64(0), 0, "", false, 0, 0, int64(0))
	f.Add("kscope_", 64, int64(time.Millisecond), int64(time.Hour), int64(time.Minute), 1000, "payments", true, 1, 1, int64(time.Minute))
	f.Add("x; DROP TABLE users; --", -1, int64(-1), int64(-1), int64(-1), -1, "c", true, 7, -2, int64(-1))
	f.Add("Upper", 1, int64(0), int64(0), int64(0), 0, "", false, 0, 0, int64(0))
	f.Add("a\"b", 1, int64(0), int64(0), int64(0), 0, "", false, 0, 0, int64(0))
	f.Add("_123456789012345678901234567890123456789", 1, int64(0), int64(0), int64(0), 0, "", false, 0, 0, int64(0))
	// A pool that never connects: New only validates.
	pool, err := pgxpool.New(context.Background(), "postgres://kscope@127.0.0.1:1/none?sslmode=disable")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(pool.Close)
	ident := regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)
	cfg := consumer.Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}}
	h := dbscope.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Record) error { return nil })
	f.Fuzz(func(t *testing.T, prefix string, batch int, linger, ttl, interval int64, cleanupBatch int, name string,
		versions bool, gaps, first int, gapTimeout int64) {
		o := dbscope.Options{
			Pool: pool, TablePrefix: prefix, BatchSize: batch, BatchLinger: time.Duration(linger),
			InboxTTL: time.Duration(ttl), CleanupInterval: time.Duration(interval), CleanupBatch: cleanupBatch, Consumer: name,
		}
		if versions {
			o.Versions = &sequence.Config{Gaps: sequence.GapPolicy(gaps), First: sequence.FirstPolicy(first), GapTimeout: time.Duration(gapTimeout)}
		}
		r, err := dbscope.New(cfg, o, h)
		if err != nil {
			var ce *consumer.ConfigError
			if !errors.As(err, &ce) || ce.Field == "" || ce.Reason == "" {
				t.Fatalf("error %q is not a ConfigError naming a field", err)
			}
			return
		}
		r.Close()
		if prefix != "" && !ident.MatchString(prefix) {
			t.Fatalf("New accepted the table prefix %q", prefix)
		}
		if batch < 0 || linger < 0 || ttl < 0 || interval < 0 || cleanupBatch < 0 {
			t.Fatalf("New accepted negative bounds: %+v", o)
		}
	})
}

// Migrate refuses a prefix that is not a plain identifier before it runs
// any SQL: a nil database handle is never touched.
func TestMigrateRefusesAnUnsafePrefix(t *testing.T) {
	for _, p := range []string{"x; DROP TABLE users; --", "a\"b", "Upper", "a b", "1abc", "kscope-", "ünï"} {
		if err := dbscope.Migrate(context.Background(), nil, p); err == nil {
			t.Fatalf("Migrate accepted the prefix %q", p)
		}
	}
}

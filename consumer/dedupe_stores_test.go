package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/dedupe/redisstore"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// guardBackend is one of kscope's dedupe stores, on a real server.
type guardBackend struct {
	name string
	// open returns a fresh store and, when the test needs an outage,
	// functions that make it unavailable and bring it back.
	open func(t *testing.T, outage bool) (s dedupe.Store, down, up func())
	// keeps says whether the store still holds its identities after the
	// outage (the test's Redis keeps nothing across a restart).
	keeps bool
}

var redisPrefixes atomic.Int64

func guardBackends() []guardBackend {
	return []guardBackend{
		{name: "memory", open: func(t *testing.T, _ bool) (dedupe.Store, func(), func()) {
			return dedupe.NewMemory(0), nil, nil
		}},
		{name: "postgres", keeps: true, open: openPostgresStore},
		{name: "redis", open: openRedisStore},
	}
}

// openPostgresStore opens a Postgres store on a fresh database; the outage
// refuses that database's connections.
func openPostgresStore(t *testing.T, _ bool) (dedupe.Store, func(), func()) {
	ctx := context.Background()
	url := testenv.DatabaseT(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := dedupe.NewPostgres(pool, dedupe.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.AcceptConnections(context.Background(), url) }) //nolint:errcheck // the outage may have ended
	down := func() {
		if err := testenv.RefuseConnections(ctx, url); err != nil {
			t.Fatal(err)
		}
	}
	up := func() {
		if err := testenv.AcceptConnections(ctx, url); err != nil {
			t.Fatal(err)
		}
	}
	return s, down, up
}

// openRedisStore opens a Redis store with a key prefix of its own on the
// shared server, or, for an outage, on a server of the test's own, which
// the outage stops and starts again on the same port.
func openRedisStore(t *testing.T, outage bool) (dedupe.Store, func(), func()) {
	srv := testenv.RedisT
	if outage {
		srv = testenv.LocalRedisT
	}
	r := srv(t)
	o, err := redis.ParseURL(r.URL)
	if err != nil {
		t.Fatal(err)
	}
	// Calls fail at once while the server is down, rather than after the
	// client's retries.
	o.MaxRetries, o.DialerRetries, o.DialTimeout = -1, 1, time.Second
	c := redis.NewClient(o)
	prefix := fmt.Sprintf("kscope-test:%d:%d:", time.Now().UnixNano(), redisPrefixes.Add(1))
	t.Cleanup(func() { // REDIS_URL's server is the user's: leave no key
		ctx := context.Background()
		it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for it.Next(ctx) {
			c.Del(ctx, it.Val())
		}
		c.Close()
	})
	s := redisstore.New(c, redisstore.Options{Prefix: prefix})
	down := func() {
		if err := r.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	up := func() {
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return s, down, up
}

// expectRemembered fails the test unless the store's answer for ids, as
// the runner of group stores them (the group before each; none when
// group is empty), is want.
func expectRemembered(t *testing.T, s dedupe.Store, group string, ids []string, want []bool) {
	t.Helper()
	stored := make([]string, len(ids))
	for i, id := range ids {
		stored[i] = id
		if group != "" {
			stored[i] = fmt.Sprintf("%d:%s:%s", len(group), group, id)
		}
	}
	got, err := s.Seen(context.Background(), stored)
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("the store's Seen(%q) = %v, %v; want %v", ids, got, err, want)
	}
}

// With each store, a message produced twice (the same message-id header)
// is handled once: the second copy, in the same batch or a later one, is
// committed without its handler, counted in Stats().Dedupe.Hits, and its
// delivery ends with the outcome duplicate.
func TestDedupeStoresSkipDuplicates(t *testing.T) {
	for _, b := range guardBackends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			store, _, _ := b.open(t, false)
			k := testenv.KafkaT(t)
			topic, group := "dds-skip-"+b.name, "g-dds-skip-"+b.name
			if err := k.CreateTopic(ctx, topic, 2); err != nil {
				t.Fatal(err)
			}
			if err := k.Produce(ctx, msg(topic, "a", "m1", "1"), msg(topic, "b", "m2", "2"), msg(topic, "a", "m1", "1 again")); err != nil {
				t.Fatal(err)
			}
			var c calls
			o := &outcomes{}
			cfg := baseConfig(t, k, group, topic)
			cfg.Dedupe = consumer.DedupeConfig{Store: store}
			cfg.Hooks = []hook.Hook{o}
			r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error { c.add(r); return nil }))
			if err != nil {
				t.Fatal(err)
			}
			runAsync(t, r)
			testenv.WaitFor(t, time.Minute, "the first records committed", func() bool { return k.CaughtUp(ctx, group, topic) && c.get("m2") == 1 })
			if err := k.Produce(ctx, msg(topic, "b", "m2", "2 again"), msg(topic, "c", "m3", "3")); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, time.Minute, "the later records committed", func() bool { return k.CaughtUp(ctx, group, topic) && c.get("m3") == 1 })
			for _, id := range []string{"m1", "m2", "m3"} {
				if n := c.get(id); n != 1 {
					t.Errorf("message %s handled %d times; want once", id, n)
				}
			}
			if st := r.Stats().Dedupe; st.Hits != 2 || st.Remembered != 3 || st.StoreErrors != 0 {
				t.Errorf("Stats().Dedupe = %+v; want 2 hits, 3 remembered, no store error", st)
			}
			if n := o.get(hook.OutcomeDuplicate); n != 2 {
				t.Errorf("%d deliveries ended with the outcome duplicate; want 2", n)
			}
			expectRemembered(t, store, group, []string{"m1", "m2", "m3", "m4"}, []bool{true, true, true, false})
		})
	}
}

// With each store, a record whose handler fails leaves no mark: the same
// message produced again runs the handler, and is remembered once it
// succeeds.
func TestDedupeStoresFailureLeavesNoMark(t *testing.T) {
	for _, b := range guardBackends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			store, _, _ := b.open(t, false)
			k := testenv.KafkaT(t)
			topic, group := "dds-fail-"+b.name, "g-dds-fail-"+b.name
			if err := k.CreateTopic(ctx, topic, 1); err != nil {
				t.Fatal(err)
			}
			if err := k.Produce(ctx, msg(topic, "a", "m1", "bad"), msg(topic, "a", "m2", "good")); err != nil {
				t.Fatal(err)
			}
			var c calls
			cfg := baseConfig(t, k, group, topic)
			cfg.Dedupe = consumer.DedupeConfig{Store: store}
			r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, r *consumer.Record) error {
				c.add(r)
				if string(r.Value) == "bad" {
					return consumer.Terminal(errors.New("rejected"))
				}
				return nil
			}))
			if err != nil {
				t.Fatal(err)
			}
			runAsync(t, r)
			testenv.WaitFor(t, time.Minute, "the failing record dead-lettered", func() bool { return k.CaughtUp(ctx, group, topic) && c.get("m2") == 1 })
			expectRemembered(t, store, group, []string{"m1", "m2"}, []bool{false, true})
			if err := k.Produce(ctx, msg(topic, "a", "m1", "good now")); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, time.Minute, "the message produced again handled", func() bool { return c.get("m1") == 2 && k.CaughtUp(ctx, group, topic) })
			expectRemembered(t, store, group, []string{"m1"}, []bool{true})
			if st := r.Stats().Dedupe; st.Hits != 0 || st.Remembered != 2 {
				t.Errorf("Stats().Dedupe = %+v; want no hit, 2 remembered", st)
			}
		})
	}
}

// The runner asks a Postgres store to delete its expired rows every
// CleanupInterval: rows whose window passed go, the others stay.
func TestDedupePostgresCleanedByTheRunner(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.DatabaseT(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := dedupe.NewPostgres(pool, dedupe.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO kscope_dedupe (id, expires_at) VALUES ('old-1', now() - interval '1 minute'),
		('old-2', now() - interval '1 second'), ('live', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	k := testenv.KafkaT(t)
	const topic, group = "dds-cleanup", "g-dds-cleanup"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, k, group, topic)
	cfg.Dedupe = consumer.DedupeConfig{Store: store, CleanupInterval: 50 * time.Millisecond}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	runAsync(t, r)
	testenv.WaitFor(t, time.Minute, "the expired rows deleted", func() bool {
		var n int
		return pool.QueryRow(ctx, `SELECT count(*) FROM kscope_dedupe`).Scan(&n) == nil && n == 1
	})
	expectRemembered(t, store, "", []string{"live"}, []bool{true})
}

package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/dedupe/dedupetest"
	"github.com/kscope-dev/kscope/dedupe/redisstore"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/internal/testmain"
)

func TestMain(m *testing.M) { testmain.Main(m) }

var prefixes atomic.Int64

// newClient returns a client of srv, closed when t ends.
func newClient(t *testing.T, srv *testenv.Redis) *redis.Client {
	t.Helper()
	o, err := redis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// uniquePrefix gives each store its own keys on the shared server.
func uniquePrefix(t *testing.T) string {
	return fmt.Sprintf("kscope-test:%d:%d:", time.Now().UnixNano(), prefixes.Add(1))
}

// deleteOnCleanup deletes the keys under prefix when t ends: REDIS_URL's
// server is the user's.
func deleteOnCleanup(t *testing.T, c *redis.Client, prefix string) {
	t.Cleanup(func() {
		ctx := context.Background()
		it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for it.Next(ctx) {
			c.Del(ctx, it.Val())
		}
	})
}

func TestRedisConformance(t *testing.T) {
	srv := testenv.RedisT(t)
	dedupetest.Run(t, func(t *testing.T) dedupe.Store {
		c, p := newClient(t, srv), uniquePrefix(t)
		deleteOnCleanup(t, c, p)
		return redisstore.New(c, redisstore.Options{Prefix: p})
	})
}

// Keys are the prefix and the identity, with the window as their expiry.
func TestRedisKeysAreThePrefixAndTheIdentity(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, testenv.RedisT(t))
	p := uniquePrefix(t)
	deleteOnCleanup(t, c, p)
	s := redisstore.New(c, redisstore.Options{Prefix: p})
	if err := s.Remember(ctx, []string{"orders/0/7"}, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	ttl, err := c.PTTL(ctx, p+"orders/0/7").Result()
	if err != nil || ttl <= 80*time.Second || ttl > 90*time.Second {
		t.Fatalf("PTTL of %q = %s, %v; want about 90s", p+"orders/0/7", ttl, err)
	}
	def := redisstore.New(c, redisstore.Options{})
	id := uniquePrefix(t)
	if err := def.Remember(ctx, []string{id}, time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Del(context.Background(), redisstore.DefaultPrefix+id) })
	if n, err := c.Exists(ctx, redisstore.DefaultPrefix+id).Result(); err != nil || n != 1 {
		t.Fatalf("EXISTS %s = %d, %v; want the key under DefaultPrefix", redisstore.DefaultPrefix+id, n, err)
	}
	if err := s.Remember(ctx, []string{"x"}, 0); err == nil {
		t.Fatal("Remember with a ttl of 0 succeeded")
	}
}

// A store whose server is down returns errors (the runner's Unavailable
// setting decides what then), and answers again once it is back on the
// same port (empty: the test server keeps nothing).
func TestRedisUnavailableReturnsErrorsThenRecovers(t *testing.T) {
	ctx := context.Background()
	srv, err := testenv.StartLocalRedis(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	// No retries: each call fails at once while the server is down.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	s := redisstore.New(c, redisstore.Options{})
	if err := s.Remember(ctx, []string{"a"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Seen(ctx, []string{"a"}); err == nil {
		t.Fatal("Seen succeeded while the server is down")
	}
	if err := s.Remember(ctx, []string{"b"}, time.Hour); err == nil {
		t.Fatal("Remember succeeded while the server is down")
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Remember(ctx, []string{"b"}, time.Hour); err != nil {
		t.Fatalf("Remember once the server is back: %v", err)
	}
	got, err := s.Seen(ctx, []string{"a", "b"})
	if err != nil || !slices.Equal(got, []bool{false, true}) {
		t.Fatalf("Seen(a, b) once the server is back = %v, %v; want [false true] (a was lost with the server's memory)", got, err)
	}
}

// BenchmarkRedisBatchOf64 runs what the runner does per batch of 64
// records: one Seen of their identities, then one Remember of them.
func BenchmarkRedisBatchOf64(b *testing.B) {
	ctx := context.Background()
	srv := testenv.RedisT(b)
	o, err := redis.ParseURL(srv.URL)
	if err != nil {
		b.Fatal(err)
	}
	c := redis.NewClient(o)
	defer c.Close()
	p := fmt.Sprintf("kscope-bench:%d:", time.Now().UnixNano())
	s := redisstore.New(c, redisstore.Options{Prefix: p})
	ids := make([]string, 64)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		for i := range ids {
			ids[i] = fmt.Sprintf("orders/%d/%d", n%12, n)
			n++
		}
		if _, err := s.Seen(ctx, ids); err != nil {
			b.Fatal(err)
		}
		if err := s.Remember(ctx, ids, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(n), "µs/record")
	b.StopTimer()
	it := c.Scan(ctx, 0, p+"*", 1000).Iterator()
	for it.Next(ctx) {
		c.Del(ctx, it.Val())
	}
}

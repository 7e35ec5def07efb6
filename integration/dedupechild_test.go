package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/dedupe/redisstore"
)

// childRedisEnv names the Redis the "alo-dedupe" children remember in.
const childRedisEnv = "KSCOPE_CHILD_REDIS"

// memLinePref starts the line an "alo-dedupe" child prints once the store
// acknowledged the identities it remembered (comma-separated, without the
// group the runner puts before them).
const memLinePref = "MEM "

// announcing is a dedupe store that prints what it remembered once the
// store acknowledged it: the parent tells a second handler call that the
// guard should have prevented from one a crash let through.
type announcing struct {
	dedupe.Store
	say func(pref string, v []byte)
}

func (a announcing) Remember(ctx context.Context, ids []string, ttl time.Duration) error {
	if err := a.Store.Remember(ctx, ids, ttl); err != nil {
		return err
	}
	plain := make([]string, len(ids))
	for i, id := range ids {
		plain[i] = id[strings.LastIndexByte(id, ':')+1:]
	}
	a.say(memLinePref, []byte(strings.Join(plain, ",")))
	return nil
}

// runDedupeChild is the "alo-dedupe" child: the AtLeastOnce scope with the
// idempotency guard in Redis; its handler reports each call (REC) before it
// returns.
func runDedupeChild(ctx context.Context, cfg consumer.Config, maxDelay time.Duration, emit func([]byte), say func(string, []byte)) int {
	opt, err := redis.ParseURL(os.Getenv(childRedisEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	client := redis.NewClient(opt)
	defer client.Close()
	cfg.Dedupe = consumer.DedupeConfig{Store: announcing{Store: redisstore.New(client, redisstore.Options{}), say: say}}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		if maxDelay > 0 {
			time.Sleep(rand.N(maxDelay))
		}
		emit(rec.Value)
		return nil
	}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

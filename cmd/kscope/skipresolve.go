package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dedupe"
	"github.com/kscope-dev/kscope/dedupe/redisstore"
	"github.com/kscope-dev/kscope/policy"
)

// inboxResolved is the inbox status of an identity kscope dlt skip
// resolved: the DB scope treats it as done, even when redriven.
const inboxResolved = "resolved"

// resolveOpts are dlt skip's flags that say where the group's scope
// deduplicates, to mark the skipped identities resolved there.
type resolveOpts struct {
	scope         string
	dedupe        string
	databaseURL   *string
	tablePrefix   *string
	inboxConsumer string
	dedupeTable   string
	redisURL      string
	redisPrefix   string
	window        time.Duration
	timeouts      *timeouts
}

func (o *resolveOpts) declare(fs *flag.FlagSet, to *timeouts) {
	o.timeouts = to
	fs.StringVar(&o.scope, "scope", "", "the group's scope: db, at_least_once or kafka (default: its entry in the policy file)")
	fs.StringVar(&o.dedupe, "dedupe", "", "an at_least_once group's dedupe store: postgres, redis, memory or none (default: its entry in the policy file)")
	o.databaseURL = databaseFlag(fs)
	o.tablePrefix = tablePrefixFlag(fs)
	fs.StringVar(&o.inboxConsumer, "inbox-consumer", "", "a DB-scope consumer's name in its inbox (dbscope.Options.Consumer; default the group)")
	fs.StringVar(&o.dedupeTable, "dedupe-table", dedupe.DefaultPostgresTable, "with --dedupe postgres: the store's table (dedupe.PostgresOptions.Table)")
	fs.StringVar(&o.redisURL, "redis-url", "", "with --dedupe redis: the Redis URL, redis://host:port/db (default $REDIS_URL)")
	fs.StringVar(&o.redisPrefix, "redis-prefix", redisstore.DefaultPrefix, "with --dedupe redis: the store's key prefix (redisstore.Options.Prefix)")
	fs.DurationVar(&o.window, "dedupe-window", consumer.DefaultDedupeWindow, "with --dedupe: how long the store remembers the identities (consumer.DedupeConfig.Window)")
}

// resolver marks identities resolved where a group's scope deduplicates.
type resolver struct {
	resolve func(ctx context.Context, ids []string) (note string, err error)
	close   func()
}

// resolver returns the resolver of group's scope, from the flags or the
// group's entry in the policy file.
func (o *resolveOpts) resolver(e *env, group string) (*resolver, error) {
	scope, store := policy.Scope(o.scope), policy.DedupeStore(o.dedupe)
	if path := e.policyPath(); path != "" {
		f, err := loadPolicy(path)
		if err != nil {
			return nil, err
		}
		if c, ok := f.Consumer(group); ok {
			scope = cmpOr(scope, c.Scope)
			store = cmpOr(store, c.Dedupe)
		}
	}
	switch scope {
	case policy.ScopeDB:
		return o.inbox(e, group)
	case policy.ScopeAtLeastOnce:
		return o.dedupeStore(e, group, store)
	case policy.ScopeKafka:
		return noResolver("the Kafka scope keeps no dedupe state kscope can write: a replay of the source topic handles these records again " +
			"(a redrive passes over them)"), nil
	case "":
		return nil, usagef("say the group's scope with --scope db, at_least_once or kafka (or give --policy with an entry for group %s): the skipped identities are marked resolved where the scope deduplicates", group)
	}
	return nil, usagef("unknown --scope %q: use db, at_least_once or kafka", o.scope)
}

// cmpOr returns a, or b when a is empty.
func cmpOr[T ~string](a, b T) T {
	if a != "" {
		return a
	}
	return b
}

func noResolver(note string) *resolver {
	return &resolver{resolve: func(context.Context, []string) (string, error) { return note, nil }, close: func() {}}
}

// inbox marks the identities resolved in the DB scope's inbox: a row of
// each, with status resolved, whatever it said (a row the inbox lost is
// written).
func (o *resolveOpts) inbox(e *env, group string) (*resolver, error) {
	prefix := cmpOr(*o.tablePrefix, "kscope_")
	if !prefixRE.MatchString(prefix) {
		return nil, usagef("--table-prefix %q is not a table prefix: letters, digits and _, not starting with a digit", prefix)
	}
	db, err := e.database(*o.databaseURL, o.timeouts)
	if err != nil {
		return nil, err
	}
	name := cmpOr(o.inboxConsumer, group)
	table := pgx.Identifier{prefix + "inbox"}.Sanitize()
	sql := `INSERT INTO ` + table + ` AS i (consumer, message_id, status) SELECT $1, id, $3 FROM unnest($2::text[]) AS id
		ON CONFLICT (consumer, message_id) DO UPDATE SET status = EXCLUDED.status, attempt = 0, stage = 0, via = '', processed_at = now()`
	return &resolver{close: db.Close, resolve: func(ctx context.Context, ids []string) (string, error) {
		err := db.request(ctx, func(ctx context.Context) error {
			_, err := db.Exec(ctx, sql, name, ids, inboxResolved)
			return err
		})
		if err != nil {
			return "", fmt.Errorf("marking the identities resolved in the inbox %s: %w", table, err)
		}
		return fmt.Sprintf("%s marked resolved in the inbox %s of consumer %s: a replay or a redrive does not apply them", plural(len(ids), "identity"), table, name), nil
	}}, nil
}

// dedupeStore remembers the identities in an at_least_once group's dedupe
// store, under the key the runner uses: "<len(group)>:<group>:<identity>".
func (o *resolveOpts) dedupeStore(e *env, group string, store policy.DedupeStore) (*resolver, error) {
	if o.window <= 0 {
		return nil, usagef("--dedupe-window must be a positive duration, got %v", o.window)
	}
	var st dedupe.Store
	var closeFn func()
	switch store {
	case policy.DedupePostgres:
		db, err := e.database(*o.databaseURL, o.timeouts)
		if err != nil {
			return nil, err
		}
		pg, err := dedupe.NewPostgres(db.Pool, dedupe.PostgresOptions{Table: o.dedupeTable})
		if err != nil {
			db.Close()
			return nil, usagef("bad --dedupe-table: %v", err)
		}
		st, closeFn = pg, db.Close
	case policy.DedupeRedis:
		url := cmpOr(o.redisURL, e.getenv("REDIS_URL"))
		opt, err := redis.ParseURL(url)
		if err != nil {
			return nil, usagef("--dedupe redis needs --redis-url (or REDIS_URL), redis://host:port/db: %v", err)
		}
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = o.timeouts.connect, o.timeouts.request, o.timeouts.request
		c := redis.NewClient(opt)
		st, closeFn = redisstore.New(c, redisstore.Options{Prefix: o.redisPrefix}), func() { c.Close() }
	case policy.DedupeMemory, policy.DedupeNone, "":
		return noResolver("the at_least_once group has no dedupe store that outlives its processes (--dedupe): a replay of the source topic handles these records again " +
			"(a redrive passes over them)"), nil
	default:
		return nil, usagef("unknown --dedupe %q: use postgres, redis, memory or none", store)
	}
	prefix := strconv.Itoa(len(group)) + ":" + group + ":"
	return &resolver{close: closeFn, resolve: func(ctx context.Context, ids []string) (string, error) {
		keys := make([]string, len(ids))
		for i, id := range ids {
			keys[i] = prefix + id
		}
		rctx, cancel := context.WithTimeout(ctx, o.timeouts.request)
		defer cancel()
		if err := st.Remember(rctx, keys, o.window); err != nil {
			return "", fmt.Errorf("remembering the identities in the %s dedupe store: %w", store, err)
		}
		return fmt.Sprintf("%s remembered in the %s dedupe store of group %s for %v: a replay within that window skips them",
			plural(len(ids), "identity"), store, group, o.window), nil
	}}, nil
}

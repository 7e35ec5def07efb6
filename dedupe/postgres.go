package dedupe

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultPostgresTable is the table a Postgres store uses by default.
const DefaultPostgresTable = "kscope_dedupe"

// DefaultCleanupBatch is the expired rows Postgres.Cleanup deletes per
// statement.
const DefaultCleanupBatch = 10_000

// PostgresOptions configure a Postgres store.
type PostgresOptions struct {
	// Table is the table's name: lower-case letters, digits and
	// underscores, starting with a letter or an underscore, at most 48
	// characters, resolved through the connection's search_path. ""
	// selects DefaultPostgresTable. Groups may share a table: the runner
	// puts its consumer group before each identity
	// (consumer.DedupeConfig).
	Table string
	// CleanupBatch is the rows Cleanup deletes per statement. 0 selects
	// DefaultCleanupBatch.
	CleanupBatch int
}

// Postgres is a Store in a PostgreSQL table: one row per identity (id text
// PRIMARY KEY, expires_at timestamptz) and an index on expires_at. Each
// call is one statement, whatever the number of identities: Seen one
// index lookup per id, Remember one upsert, Forget one delete. Rows whose
// window has passed are never seen; Cleanup deletes them (the runner calls
// it periodically, as Postgres is a [Cleaner]). An identity costs about 80
// bytes plus twice its length: its row, its primary key's entry and its
// entry in the index on expires_at.
//
// Its window is measured by the server's clock (now()), so every member
// of a group agrees on it. An identity PostgreSQL's text cannot hold (one
// with a NUL byte, or not UTF-8) is stored as "sha256:" and its digest in
// hex.
type Postgres struct {
	pool  *pgxpool.Pool
	table string // quoted
	batch int

	seen, remember, forget, cleanup string
}

var tableRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)

// NewPostgres returns a Postgres store on pool. It does not create the
// table: call Migrate once (at start, or from the service's migrations
// with the statements Migrate runs).
func NewPostgres(pool *pgxpool.Pool, o PostgresOptions) (*Postgres, error) {
	if pool == nil {
		return nil, errors.New("dedupe: NewPostgres needs a pool (a *pgxpool.Pool on the database that holds the table)")
	}
	if o.Table == "" {
		o.Table = DefaultPostgresTable
	}
	if !tableRE.MatchString(o.Table) {
		return nil, fmt.Errorf("dedupe: PostgresOptions.Table %q is not a plain SQL identifier: use lower-case letters, digits and "+
			"underscores, starting with a letter or an underscore, at most 48 characters (or \"\" for %q)", o.Table, DefaultPostgresTable)
	}
	if o.CleanupBatch < 0 {
		return nil, fmt.Errorf("dedupe: PostgresOptions.CleanupBatch is %d: set a positive number of rows, or 0 for %d", o.CleanupBatch, DefaultCleanupBatch)
	}
	if o.CleanupBatch == 0 {
		o.CleanupBatch = DefaultCleanupBatch
	}
	t := pgx.Identifier{o.Table}.Sanitize()
	return &Postgres{
		pool:  pool,
		table: t,
		batch: o.CleanupBatch,
		// "IS TRUE" keeps the index on expires_at out of the plan: with
		// it the planner may read every live row (it does on a table
		// without statistics) instead of one primary-key lookup per id.
		seen:     `SELECT id FROM ` + t + ` WHERE id = ANY($1) AND (expires_at > now()) IS TRUE`,
		remember: `INSERT INTO ` + t + ` (id, expires_at) SELECT unnest($1::text[]), now() + $2::interval ON CONFLICT (id) DO UPDATE SET expires_at = EXCLUDED.expires_at`,
		forget:   `DELETE FROM ` + t + ` WHERE id = ANY($1)`,
		// SKIP LOCKED: a row a Remember is extending is left for the next
		// round, so Cleanup never waits on a Remember, nor deadlocks with
		// one; a row extended meanwhile is rechecked and kept.
		cleanup: `DELETE FROM ` + t + ` WHERE id IN (
			SELECT id FROM ` + t + ` WHERE expires_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED)`,
	}, nil
}

// Migrate creates the table and its index on expires_at if they do not
// exist.
func (p *Postgres) Migrate(ctx context.Context) error {
	idx := pgx.Identifier{strings.Trim(p.table, `"`) + "_expires_at"}.Sanitize()
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS ` + p.table + ` (id text PRIMARY KEY, expires_at timestamptz NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS ` + idx + ` ON ` + p.table + ` (expires_at)`,
	} {
		if _, err := p.pool.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("dedupe: creating the table %s: %w", p.table, err)
		}
	}
	return nil
}

// Seen implements Store, in one query.
func (p *Postgres) Seen(ctx context.Context, ids []string) ([]bool, error) {
	out := make([]bool, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	keys := pgIDs(ids)
	rows, err := p.pool.Query(ctx, p.seen, keys)
	if err != nil {
		return nil, err
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return out, nil
	}
	set := make(map[string]struct{}, len(found))
	for _, id := range found {
		set[id] = struct{}{}
	}
	for i, k := range keys {
		_, out[i] = set[k]
	}
	return out, nil
}

// Remember implements Store, in one statement. ttl must be positive; the
// server keeps it to the microsecond.
func (p *Postgres) Remember(ctx context.Context, ids []string, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("dedupe: Remember's ttl is %s: it must be positive", ttl)
	}
	if len(ids) == 0 {
		return nil
	}
	// Sorted and distinct: one row is not upserted twice in a statement,
	// and concurrent upserts lock their rows in one order (no deadlock).
	keys := slices.Compact(slices.Sorted(slices.Values(pgIDs(ids))))
	_, err := p.pool.Exec(ctx, p.remember, keys, ttl)
	return err
}

// Forget implements Store, in one statement.
func (p *Postgres) Forget(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := p.pool.Exec(ctx, p.forget, pgIDs(ids))
	return err
}

// Cleanup implements Cleaner: it deletes the rows whose window has passed,
// at most PostgresOptions.CleanupBatch a statement so that no statement
// holds many locks for long, until a statement deletes fewer. It returns
// how many rows it deleted, also when an error stops it.
func (p *Postgres) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := p.pool.Exec(ctx, p.cleanup, p.batch)
		if err != nil {
			return total, err
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(p.batch) {
			return total, nil
		}
	}
}

// pgIDs returns ids as PostgreSQL's text holds them: an id with a NUL byte
// or that is not UTF-8 becomes "sha256:" and its digest (text refuses
// both).
func pgIDs(ids []string) []string {
	out, copied := ids, false
	for i, id := range ids {
		if utf8.ValidString(id) && !strings.ContainsRune(id, 0) {
			continue
		}
		if !copied {
			out, copied = slices.Clone(ids), true
		}
		sum := sha256.Sum256([]byte(id))
		out[i] = "sha256:" + hex.EncodeToString(sum[:])
	}
	return out
}

package dbscope

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
)

//go:embed sql/*.sql
var migrations embed.FS

// DefaultTablePrefix prefixes kscope's table names unless configured.
const DefaultTablePrefix = "kscope_"

var prefixRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

// validPrefix checks a table prefix. It becomes part of SQL identifiers, so
// it is held to a strict pattern instead of being quoted.
func validPrefix(p string) error {
	if !prefixRE.MatchString(p) {
		return fmt.Errorf("dbscope: table prefix %q is not a plain identifier; use lower-case letters, digits and underscores, starting with a letter or underscore, at most 40 characters", p)
	}
	return nil
}

// Beginner is the narrowest database handle Migrate needs: a *pgxpool.Pool,
// a *pgx.Conn or a pgx.Tx.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate creates kscope's tables (inbox, offsets, parked keys) with the given table
// prefix ("" selects DefaultTablePrefix) from the SQL files embedded in this
// package. It is idempotent and safe to run from several processes at once:
// each file is applied once, under an advisory lock, and recorded in
// <prefix>schema_migrations.
func Migrate(ctx context.Context, db Beginner, prefix string) error {
	if prefix == "" {
		prefix = DefaultTablePrefix
	}
	if err := validPrefix(prefix); err != nil {
		return err
	}
	files, err := fs.Glob(migrations, "sql/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(files)
	lock := fnv.New64a()
	lock.Write([]byte("kscope-migrate:" + prefix))
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(lock.Sum64())); err != nil {
			return fmt.Errorf("dbscope: migrate: taking the migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+prefix+`schema_migrations (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("dbscope: migrate: %w", err)
		}
		for _, f := range files {
			name := strings.TrimPrefix(f, "sql/")
			version, err := strconv.Atoi(strings.SplitN(name, "_", 2)[0])
			if err != nil {
				return fmt.Errorf("dbscope: migrate: file %s has no version number", name)
			}
			var done bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+prefix+`schema_migrations WHERE version = $1)`, version).Scan(&done); err != nil {
				return fmt.Errorf("dbscope: migrate: %w", err)
			}
			if done {
				continue
			}
			raw, err := migrations.ReadFile(f)
			if err != nil {
				return err
			}
			var sql bytes.Buffer
			if err := template.Must(template.New(name).Parse(string(raw))).Execute(&sql, struct{ Prefix string }{prefix}); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, sql.String()); err != nil {
				return fmt.Errorf("dbscope: migrate: applying %s: %w", name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+prefix+`schema_migrations (version, name) VALUES ($1, $2)`, version, name); err != nil {
				return fmt.Errorf("dbscope: migrate: %w", err)
			}
		}
		return nil
	})
}

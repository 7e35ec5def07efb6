package dbscope

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"regexp"
	"slices"
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

// ValidTablePrefix reports, with an error that says what to change, a
// table prefix that Migrate and the runners would refuse.
func ValidTablePrefix(p string) error { return validPrefix(p) }

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

// Migrate creates kscope's tables with the given table prefix ("" selects
// DefaultTablePrefix) from the SQL files embedded in this package: the
// DB scope's inbox, offsets, parked keys and key versions, the outbox and
// its dead-letter table, and package intent's intents. It is idempotent and safe to run from several processes at once:
// each file is applied once, under an advisory lock, and recorded in
// <prefix>schema_migrations.
//
// Migrate waits for the database as long as ctx lets it: for a connection,
// for the migration lock (another process migrating), for each statement.
// A server that takes connections and never answers, or a lock never
// released, blocks it until ctx ends (or, while connecting, until the
// pool's connect_timeout passes), and it then returns ctx's error. Give it
// a ctx with a deadline:
//
//	ctx, cancel := context.WithTimeout(ctx, time.Minute)
//	defer cancel()
//	err := dbscope.Migrate(ctx, pool, "")
func Migrate(ctx context.Context, db Beginner, prefix string) error {
	if prefix == "" {
		prefix = DefaultTablePrefix
	}
	if err := validPrefix(prefix); err != nil {
		return err
	}
	files, err := migrationFiles()
	if err != nil {
		return err
	}
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
			name, version := f.name, f.version
			var done bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+prefix+`schema_migrations WHERE version = $1)`, version).Scan(&done); err != nil {
				return fmt.Errorf("dbscope: migrate: %w", err)
			}
			if done {
				continue
			}
			raw, err := migrations.ReadFile("sql/" + name)
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

// migrationFile is one embedded SQL file: its name and version number.
type migrationFile struct {
	name    string
	version int
}

// migrationFiles returns the embedded SQL files in the order they apply.
func migrationFiles() ([]migrationFile, error) {
	names, err := fs.Glob(migrations, "sql/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([]migrationFile, 0, len(names))
	for _, f := range names {
		name := strings.TrimPrefix(f, "sql/")
		version, err := strconv.Atoi(strings.SplitN(name, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("dbscope: migrate: file %s has no version number", name)
		}
		out = append(out, migrationFile{name: name, version: version})
	}
	return out, nil
}

// kscopeTables are the tables Migrate creates, without their prefix.
var kscopeTables = []string{"schema_migrations", "inbox", "offsets", "parked", "key_versions", "waiting", "outbox_sequences", "outbox", "outbox_dead", "intents"}

// checkSchema reports, as an error that says to run Migrate, a database
// that lacks one of kscope's tables or one of the embedded migrations. Any
// other error is returned as it is: it says nothing about the schema.
func checkSchema(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, prefix string) error {
	names := make([]string, len(kscopeTables))
	for i, t := range kscopeTables {
		names[i] = prefix + t
	}
	rows, err := db.Query(ctx, `SELECT t FROM unnest($1::text[]) AS t WHERE to_regclass(t) IS NULL`, names)
	if err != nil {
		return err
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return &SchemaError{Prefix: prefix, Missing: missing}
	}
	rows, err = db.Query(ctx, `SELECT version FROM `+prefix+`schema_migrations`)
	if err != nil {
		return err
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return err
	}
	files, err := migrationFiles()
	if err != nil {
		return err
	}
	for _, f := range files {
		if !slices.Contains(have, int32(f.version)) {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return &SchemaError{Prefix: prefix, Missing: missing}
	}
	return nil
}

// SchemaError says that the database lacks kscope's tables, or some of the
// migrations of this version of kscope: [Migrate] has not been run with
// this prefix since the upgrade. Run returns it at start.
type SchemaError struct {
	Prefix  string   // the table prefix the scope uses
	Missing []string // the missing tables (or table.column), or the migration files not yet applied
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("dbscope: the database lacks %s (table prefix %q); run dbscope.Migrate(ctx, pool, %q) before Run, once per database and after every kscope upgrade",
		strings.Join(e.Missing, ", "), e.Prefix, e.Prefix)
}

package testenv

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
)

// RefuseConnections makes the database dbURL names unavailable to its
// clients, and to them only (other tests' databases on the same server go
// on): it stops accepting connections (ALTER DATABASE ... ALLOW_CONNECTIONS
// false) and the connections it has are ended, so a pool's next statement
// fails and its new connections are refused until [AcceptConnections]. It
// works on any backend, through the server's "postgres" database, with a
// role that owns the database (a test's, from [DatabaseT]).
func RefuseConnections(ctx context.Context, dbURL string) error {
	return alterConnections(ctx, dbURL, false)
}

// AcceptConnections ends [RefuseConnections]: the database accepts
// connections again.
func AcceptConnections(ctx context.Context, dbURL string) error {
	return alterConnections(ctx, dbURL, true)
}

func alterConnections(ctx context.Context, dbURL string, allow bool) error {
	u, err := url.Parse(dbURL)
	if err != nil {
		return err
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" || name == "postgres" {
		return fmt.Errorf("testenv: %s names no test database", redact(dbURL))
	}
	u.Path = "/postgres"
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return fmt.Errorf("testenv: connecting to %s: %w", redact(u.String()), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s ALLOW_CONNECTIONS %t", pgx.Identifier{name}.Sanitize(), allow)); err != nil {
		return fmt.Errorf("testenv: ALTER DATABASE %s: %w", name, err)
	}
	if allow {
		return nil
	}
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, name); err != nil {
		return fmt.Errorf("testenv: ending the connections to %s: %w", name, err)
	}
	return nil
}
